package nft

import (
	"cmp"
	"math/bits"
	"net/netip"

	"sigs.k8s.io/kpng/diffstore"
)

// This file sizes the table's sets that grow with the state: the hairpin
// sets (one element an endpoint address: 500,000 at 50,000 services × 10
// endpoints), the cluster-ips sets, the services maps (one element a
// service address and port with a chain; a plain one's is in its shard's
// set) and the shards' sets and maps (shards.go: one element a plain
// service port, and one each of its endpoints: 50,000 and 500,000 in
// shard 10 at 50,000 × 10). Given a capacity
// (nft's "size"), the kernel keeps a set in a hash table of fixed size
// (nft_set_hash's "hash" type) instead of one that grows by rehashing as
// the elements come (rhash): 500,000 hairpin addresses went in in 0.33 s
// instead of 0.88 s, and the transaction of the first full write of
// 50,000 × 10 took about 0.9 s less once the shards were sized too
// (docs/benchmarks.md, "Sized shards and a faster state file"). The
// capacity is the most the set may hold, so it is chosen when the set is
// created (with the table, written whole, or a shard's in the round its
// first service port comes), from what the set then holds, with room to
// grow: a partial sync that would take a set over it writes the table
// whole instead (capacities.after).
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
// sets of a family (clusterIPs and services false, shard empty: the
// hairpin set), and the shards' sets and maps, by name (shard).
type sizedSet struct {
	clusterIPs bool
	services   bool
	family     ipFamily
	shard      string
}

// shardSized names the sized set of a shard's set or map.
func shardSized(name string) sizedSet { return sizedSet{shard: name} }

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

// wholeCapacities returns the capacities of the sets of rs written
// whole: its hairpin and cluster-IP addresses, its verdict map elements
// and shard set keys, its shard maps' endpoints.
func wholeCapacities(rs *ruleset) capacities {
	c := capacities{}
	for i, addrs := range [][]netip.Addr{rs.Hairpin, rs.ClusterIPs} {
		n := familyCounts(addrs)
		for _, f := range []ipFamily{ipv4, ipv6} {
			c[sizedSet{clusterIPs: i == 1, family: f}] = setFill{setCapacity(n[f]), n[f]}
		}
	}
	n := serviceElementCounts(rs.Elements)
	for _, f := range []ipFamily{ipv4, ipv6} {
		c[sizedSet{services: true, family: f}] = setFill{setCapacity(n[f]), n[f]}
	}
	shard := map[string]int{}
	for _, st := range rs.Sets {
		if st.Shard > 0 || st.ShardSet > 0 {
			shard[st.Name] += 0
		}
	}
	for _, e := range rs.Elements {
		if e.Verdict.Shard > 0 {
			shard[e.set()]++
		}
	}
	for _, bl := range rs.Blocks {
		if bl.sharded() {
			shard[bl.Map()] += len(bl.Endpoints)
		}
	}
	for name, n := range shard {
		c[shardSized(name)] = setFill{setCapacity(n), n}
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

// after returns the capacities after the round d (its additions and
// deletions of addresses and elements, the shard sets and maps it creates
// and deletes), and whether every set still fits in its capacity. A
// shard's set or map created in the round gets the capacity of what it
// then holds (setCapacity). Empty capacities (no table written yet) never
// fit.
func (c capacities) after(d delta) (capacities, bool) {
	if len(c) == 0 {
		return nil, false
	}
	change := countChanges(d)
	out := capacities{}
	for s, v := range c {
		out[s] = v
	}
	for _, it := range d.Sets.Deleted {
		delete(out, shardSized(it.Key))
	}
	for _, it := range d.Sets.Created {
		if it.Value.Shard > 0 || it.Value.ShardSet > 0 {
			n := change[shardSized(it.Key)]
			out[shardSized(it.Key)] = setFill{setCapacity(n), 0}
		}
	}
	fits := true
	for s, v := range out {
		v.count += change[s]
		if v.count > int(v.capacity) {
			fits = false
		}
		out[s] = v
	}
	return out, fits
}

// countChanges returns by how many elements the round d changes each
// sized set (the sets it does not change are absent).
func countChanges(d delta) map[sizedSet]int {
	n := map[sizedSet]int{}
	// An update may move an element between the services map and a
	// shard set (a port becoming plain, or no longer), or between shard
	// sets, and an endpoint between shard maps.
	element := func(e mapElement, k int) {
		switch {
		case e.inServicesMap():
			n[sizedSet{services: true, family: e.Family}] += k
		case e.Verdict.Shard > 0:
			n[shardSized(e.set())] += k
		}
	}
	tally(d.Elements, element)
	tally(d.Endpoints, func(e endpointElement, k int) {
		if e.Shard.Addr.IsValid() {
			n[shardSized(e.Map())] += k
		}
	})
	for i, c := range []addrChanges{d.Hairpin, d.ClusterIPs} {
		created, deleted := familyCounts(c.Created), familyCounts(c.Deleted)
		for _, f := range []ipFamily{ipv4, ipv6} {
			if k := created[f] - deleted[f]; k != 0 {
				n[sizedSet{clusterIPs: i == 1, family: f}] += k
			}
		}
	}
	return n
}

// tally calls count with each value c adds (created, updated: k = 1) and
// each it removes (updated, deleted: k = -1).
func tally[K cmp.Ordered, V any](c diffstore.Changes[K, V], count func(v V, k int)) {
	for _, it := range c.Created {
		count(it.Value, 1)
	}
	for _, it := range c.Updated {
		count(it.Value, 1)
		count(it.Prev, -1)
	}
	for _, it := range c.Deleted {
		count(it.Prev, -1)
	}
}
