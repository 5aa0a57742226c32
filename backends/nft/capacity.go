package nft

import (
	"math/bits"
	"net/netip"
)

// This file sizes the table's two address sets that grow with the state:
// the hairpin sets (one element an endpoint address: 500,000 at 50,000
// services × 10 endpoints) and the cluster-ips sets. Given a capacity
// (nft's "size"), the kernel keeps a set in a hash table of fixed size
// (nft_set_hash's "hash" type) instead of one that grows by rehashing as
// the elements come (rhash): 500,000 hairpin addresses went in in 0.33 s
// instead of 0.88 s (docs/benchmarks.md). The capacity is the most the
// set may hold, so it is chosen when the table is written whole, from
// what the set then holds, with room to grow: a partial sync that would
// take a set over it writes the table whole instead (capacities.after).

// minSetCapacity is the least capacity of a sized set: 1,024 elements, a
// bucket array of 16 KiB in the kernel.
const minSetCapacity = 1024

// setCapacity returns the capacity of a sized set written whole with n
// elements: twice n, rounded up to a power of two, at least
// minSetCapacity. The kernel's buckets take 16 bytes an element of
// capacity (a power of two at least 4/3 of it, of 8-byte heads).
func setCapacity(n int) uint32 {
	want := uint64(max(2*n, minSetCapacity))
	return uint32(min(uint64(1)<<bits.Len64(want-1), 1<<31))
}

// sizedSet names the sized sets: the hairpin and cluster-ips sets of a
// family.
type sizedSet struct {
	clusterIPs bool
	family     ipFamily
}

// capacities are the capacity and the element count of each sized set as
// the kernel holds them (after the last successful transaction).
type capacities map[sizedSet]setFill

// setFill is a sized set's capacity and element count.
type setFill struct {
	capacity uint32
	count    int
}

// familyCounts returns the number of addresses of each family in addrs.
func familyCounts(addrs []netip.Addr) [2]int {
	var n [2]int
	for _, a := range addrs {
		n[familyOf(a)]++
	}
	return n
}

// wholeCapacities returns the capacities of the sets of a table written
// whole with the hairpin and cluster-IP addresses given.
func wholeCapacities(hairpin, clusterIPs []netip.Addr) capacities {
	c := capacities{}
	for i, addrs := range [][]netip.Addr{hairpin, clusterIPs} {
		n := familyCounts(addrs)
		for _, f := range []ipFamily{ipv4, ipv6} {
			c[sizedSet{clusterIPs: i == 1, family: f}] = setFill{setCapacity(n[f]), n[f]}
		}
	}
	return c
}

// after returns the capacities after the round d (its additions and
// deletions of addresses), and whether every set still fits in its
// capacity. Empty capacities (no table written yet) never fit.
func (c capacities) after(d delta) (capacities, bool) {
	if len(c) == 0 {
		return nil, false
	}
	out := capacities{}
	fits := true
	for s, v := range c {
		ch := d.Hairpin
		if s.clusterIPs {
			ch = d.ClusterIPs
		}
		v.count += familyCounts(ch.Created)[s.family] - familyCounts(ch.Deleted)[s.family]
		if v.count > int(v.capacity) {
			fits = false
		}
		out[s] = v
	}
	return out, fits
}
