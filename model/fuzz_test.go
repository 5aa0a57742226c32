package model

import (
	"slices"
	"strings"
	"testing"
)

// FuzzParse: address and CIDR lists of any text parse without a panic,
// into the canonical form (parsing it again changes nothing), and what is
// refused is returned, never lost.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"10.0.0.1,::1", "::ffff:10.0.0.1", "10.0.0.1/8,::ffff:0.0.0.0/90", "fe80::1%eth0", " 1.2.3.4/32 ,,", "1000::55,1000::055"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, list string) {
		texts := strings.Split(list, ",")
		set, bad := NewIPSet(texts...)
		again, bad2 := NewIPSet(set.All()...)
		if len(bad2) > 0 || !slices.Equal(set.V4, again.V4) || !slices.Equal(set.V6, again.V6) {
			t.Fatalf("NewIPSet not canonical: %+v → %+v (bad %v)", set, again, bad2)
		}
		if len(set.All()) > len(texts) || len(bad) > len(texts) {
			t.Fatalf("NewIPSet(%q) = %+v, bad %v: more than given", texts, set, bad)
		}
		cidrs, badCIDRs := ParseCIDRs(texts...)
		var strs []string
		for _, p := range cidrs {
			if p != p.Masked() || p.Addr().Is4In6() {
				t.Fatalf("ParseCIDRs(%q) gave %s: not canonical", texts, p)
			}
			strs = append(strs, p.String())
		}
		again2, bad3 := ParseCIDRs(strs...)
		if len(bad3) > 0 || !slices.Equal(cidrs, again2) {
			t.Fatalf("ParseCIDRs not canonical: %v → %v (bad %v)", cidrs, again2, bad3)
		}
		if len(cidrs)+len(badCIDRs) > len(texts) {
			t.Fatalf("ParseCIDRs(%q) = %v, bad %v: more than given", texts, cidrs, badCIDRs)
		}
	})
}
