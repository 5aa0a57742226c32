package nft

import (
	"net/netip"
	"testing"
)

func TestSetCapacity(t *testing.T) {
	for _, tc := range []struct {
		n    int
		want uint32
	}{{0, 1024}, {1, 1024}, {512, 1024}, {513, 2048}, {1024, 2048}, {1500, 4096}, {100_000, 262_144}, {500_000, 1 << 20}} {
		if got := setCapacity(tc.n); got != tc.want {
			t.Errorf("setCapacity(%d) = %d, want %d", tc.n, got, tc.want)
		}
	}
}

// TestCapacitiesAfter: a round fits while every sized set stays within its
// capacity, counted by family; a table never written whole fits nothing.
func TestCapacitiesAfter(t *testing.T) {
	addrs := func(prefix string, n int) []netip.Addr {
		var out []netip.Addr
		base := netip.MustParseAddr(prefix)
		for range n {
			base = base.Next()
			out = append(out, base)
		}
		return out
	}
	if _, ok := capacities(nil).after(delta{}); ok {
		t.Error("no table written: the round fits")
	}
	c := wholeCapacities(addrs("10.1.0.0", 500), addrs("10.96.0.0", 10))
	if got := c[sizedSet{family: ipv4}]; got != (setFill{1024, 500}) {
		t.Fatalf("hairpin-v4 %+v, want capacity 1024, 500 elements", got)
	}
	d := delta{Hairpin: addrChanges{Created: addrs("10.2.0.0", 530), Deleted: addrs("10.1.0.0", 6)}}
	next, ok := c.after(d)
	if !ok || next[sizedSet{family: ipv4}].count != 1024 || next[sizedSet{clusterIPs: true, family: ipv4}].count != 10 {
		t.Errorf("500 + 530 - 6 hairpin addresses: fits %v, %+v", ok, next)
	}
	d.Hairpin.Created = append(d.Hairpin.Created, addrs("10.3.0.0", 1)...)
	if _, ok := c.after(d); ok {
		t.Error("1,025 hairpin addresses fit a capacity of 1,024")
	}
	// The other family and the other kind of set are counted apart.
	d = delta{Hairpin: addrChanges{Created: addrs("fd00::", 1024)}, ClusterIPs: addrChanges{Created: addrs("10.97.0.0", 1014)}}
	if _, ok := c.after(d); !ok {
		t.Error("1,024 IPv6 hairpin addresses and 1,024 IPv4 cluster IPs do not fit capacities of 1,024")
	}
}
