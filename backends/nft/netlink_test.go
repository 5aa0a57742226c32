//go:build linux

package nft

import (
	"net/netip"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// TestClusterIPsCheckRules checks the rules of cluster-ips-check in each
// family's table: its cluster-ips lookup, then one drop per service CIDR
// range of the family, a masked compare for a prefix (none for a single
// address) and a range compare for a range that is no prefix.
func TestClusterIPsCheckRules(t *testing.T) {
	var pfx []netip.Prefix
	for _, p := range []string{"10.96.0.0/16", "10.98.0.0/24", "10.98.1.0/25", "10.99.0.1/32", "fd00:10:96::/108"} {
		pfx = append(pfx, netip.MustParsePrefix(p))
	}
	sets := [2]*nftables.Set{{Name: setClusterIPs(ipv4)}, {Name: setClusterIPs(ipv6)}}
	rules := clusterIPsCheckRules(ipv4, sets[ipv4], mergedRanges(pfx))
	rules = append(rules, clusterIPsCheckRules(ipv6, sets[ipv6], mergedRanges(pfx))...)
	if len(rules) != 6 {
		t.Fatalf("%d rules, want 2 lookups and 4 ranges", len(rules))
	}
	kinds := func(r []expr.Any) (lookups, masks, ranges int, drop bool) {
		for _, e := range r {
			switch e := e.(type) {
			case *expr.Lookup:
				lookups++
			case *expr.Bitwise:
				masks++
			case *expr.Range:
				ranges++
			case *expr.Verdict:
				drop = e.Kind == expr.VerdictDrop
			}
		}
		return
	}
	for i, want := range []struct {
		lookups, masks, ranges int
		drop                   bool
	}{{1, 0, 0, false}, {0, 1, 0, true}, {0, 0, 1, true}, {0, 0, 0, true}, {1, 0, 0, false}, {0, 1, 0, true}} {
		l, m, r, d := kinds(rules[i])
		if l != want.lookups || m != want.masks || r != want.ranges || d != want.drop {
			t.Errorf("rule %d: %d lookups, %d masks, %d ranges, drop %v; want %+v", i, l, m, r, d, want)
		}
	}
}
