package nft

import (
	"math/bits"
	"net/netip"
)

// This file sizes the table's sets that grow with the state: the hairpin
// sets (one element an endpoint address: 500,000 at 50,000 services × 10
// endpoints), the cluster-ips sets and the services maps (one element a
// service address and port with a chain; a plain one's is in its shard's
// set, not sized). Given a capacity
// (nft's "size"), the kernel keeps a set in a hash table of fixed size
// (nft_set_hash's "hash" type) instead of one that grows by rehashing as
// the elements come (rhash): 500,000 hairpin addresses went in in 0.33 s
// instead of 0.88 s (docs/benchmarks.md). The capacity is the most the
// set may hold, so it is chosen when the table is written whole, from
// what the set then holds, with room to grow: a partial sync that would
// take a set over it writes the table whole instead (capacities.after).
// For the services maps, whose `goto` elements the kernel walks whenever a
// transaction adds one (the table's validation), the fixed table also
// halves that walk: a `goto` element added at 50,000 services took 2.5–4.8
// ms of kernel time against 5.5–8.3 ms in an rhash (nft -f, one sitting).

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

// sizedSet names the sized sets: the hairpin, cluster-ips and services
// sets of a family (clusterIPs and services false: the hairpin set).
type sizedSet struct {
	clusterIPs bool
	services   bool
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
// whole with the hairpin and cluster-IP addresses and the verdict map
// elements given.
func wholeCapacities(hairpin, clusterIPs []netip.Addr, elements []mapElement) capacities {
	c := capacities{}
	for i, addrs := range [][]netip.Addr{hairpin, clusterIPs} {
		n := familyCounts(addrs)
		for _, f := range []ipFamily{ipv4, ipv6} {
			c[sizedSet{clusterIPs: i == 1, family: f}] = setFill{setCapacity(n[f]), n[f]}
		}
	}
	n := serviceElementCounts(elements)
	for _, f := range []ipFamily{ipv4, ipv6} {
		c[sizedSet{services: true, family: f}] = setFill{setCapacity(n[f]), n[f]}
	}
	return c
}

// serviceElementCounts returns the number of elements of each family's
// services map among els.
func serviceElementCounts(els []mapElement) [2]int {
	var n [2]int
	for _, e := range els {
		if e.inServicesMap() {
			n[e.Family]++
		}
	}
	return n
}

// servicesMapCount is 1 when e is an element of the kernel's services map
// of family f, else 0.
func servicesMapCount(e mapElement, f ipFamily) int {
	if e.Family == f && e.inServicesMap() {
		return 1
	}
	return 0
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
		switch {
		case s.services:
			// An update may move an element between the services
			// map and a shard set (a port becoming plain, or no
			// longer).
			for _, it := range d.Elements.Created {
				v.count += servicesMapCount(it.Value, s.family)
			}
			for _, it := range d.Elements.Updated {
				v.count += servicesMapCount(it.Value, s.family) - servicesMapCount(it.Prev, s.family)
			}
			for _, it := range d.Elements.Deleted {
				v.count -= servicesMapCount(it.Prev, s.family)
			}
		case s.clusterIPs:
			v.count += familyCounts(d.ClusterIPs.Created)[s.family] - familyCounts(d.ClusterIPs.Deleted)[s.family]
		default:
			v.count += familyCounts(d.Hairpin.Created)[s.family] - familyCounts(d.Hairpin.Deleted)[s.family]
		}
		if v.count > int(v.capacity) {
			fits = false
		}
		out[s] = v
	}
	return out, fits
}
