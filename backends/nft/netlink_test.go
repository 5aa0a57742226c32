//go:build linux

package nft

import (
	"net/netip"
	"testing"
)

// TestRangeElements checks the kernel elements of the service CIDRs'
// ranges: a range up to the family's last address has no end element.
func TestRangeElements(t *testing.T) {
	pfx := func(s ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, p := range s {
			out = append(out, netip.MustParsePrefix(p))
		}
		return out
	}
	if els := rangeElements(mergedRanges(pfx("255.255.255.0/24"))[0]); len(els) != 1 {
		t.Errorf("open range: %d elements, want its start only", len(els))
	}
	if els := rangeElements(mergedRanges(pfx("10.96.0.0/16"))[0]); len(els) != 2 || !els[1].IntervalEnd || netip.AddrFrom4([4]byte(els[1].Key)) != netip.MustParseAddr("10.97.0.0") {
		t.Errorf("range 10.96.0.0/16: elements %+v, want its start and 10.97.0.0 as the end", els)
	}
}
