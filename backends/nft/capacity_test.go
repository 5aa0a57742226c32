package nft

import (
	"fmt"
	"net/netip"
	"testing"

	"sigs.k8s.io/kpng/diffstore"
	"sigs.k8s.io/kpng/model"
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
	c := wholeCapacities(&ruleset{Hairpin: addrs("10.1.0.0", 500), ClusterIPs: addrs("10.96.0.0", 10)})
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

// TestServicesMapCapacity: the services map of a family is sized by its
// elements (not the other maps'), and a round fits while they stay within
// its capacity.
func TestServicesMapCapacity(t *testing.T) {
	elements := func(m func(ipFamily) string, f ipFamily, from, n int) []mapElement {
		var out []mapElement
		for i := range n {
			a := netip.AddrFrom4([4]byte{10, 96, byte((from + i) >> 8), byte(from + i)})
			if f == ipv6 {
				a = netip.AddrFrom16([16]byte{0xfd, 0, 14: byte((from + i) >> 8), 15: byte(from + i)})
			}
			out = append(out, mapElement{Map: m(f), Family: f, Key: mapKey{Addr: a, Proto: model.TCP, Port: 80}})
		}
		return out
	}
	items := func(els []mapElement) []diffstore.Item[string, mapElement] {
		var out []diffstore.Item[string, mapElement]
		for _, e := range els {
			out = append(out, diffstore.Item[string, mapElement]{Key: e.ID(), Value: e, Prev: e})
		}
		return out
	}
	c := wholeCapacities(&ruleset{Elements: append(elements(mapServices, ipv4, 0, 600), elements(mapNoEndpoints, ipv4, 600, 900)...)})
	if got := c[sizedSet{services: true, family: ipv4}]; got != (setFill{2048, 600}) {
		t.Fatalf("service-ips-v4 %+v, want capacity 2,048, 600 elements", got)
	}
	var d delta
	d.Elements.Created = items(append(elements(mapServices, ipv4, 600, 1449), elements(mapNoEndpoints, ipv4, 3000, 5000)...))
	d.Elements.Deleted = items(elements(mapServices, ipv4, 0, 1))
	if next, ok := c.after(d); !ok || next[sizedSet{services: true, family: ipv4}].count != 2048 {
		t.Errorf("600 + 1,449 - 1 services elements: fits %v, %+v", ok, next[sizedSet{services: true, family: ipv4}])
	}
	d.Elements.Deleted = nil
	if _, ok := c.after(d); ok {
		t.Error("2,049 services elements fit a capacity of 2,048")
	}
	d = delta{}
	d.Elements.Created = items(elements(mapServices, ipv6, 0, 1024))
	if _, ok := c.after(d); !ok {
		t.Error("1,024 IPv6 services elements do not fit a capacity of 1,024")
	}

	// A plain port's element is in its shard's set, not in the kernel's
	// services map: not counted, and an update moving it between the
	// two counts.
	shard := func(els []mapElement) []mapElement {
		for i := range els {
			els[i].Verdict = verdict{Goto: shardChainName(els[i].Family, 2), Shard: 2}
		}
		return els
	}
	c = wholeCapacities(&ruleset{Elements: append(elements(mapServices, ipv4, 0, 600), shard(elements(mapServices, ipv4, 600, 5000))...)})
	if got := c[sizedSet{services: true, family: ipv4}]; got != (setFill{2048, 600}) {
		t.Fatalf("service-ips-v4 with 5,000 plain ports beside: %+v, want capacity 2,048, 600 elements", got)
	}
	d = delta{}
	d.Elements.Created = items(append(elements(mapServices, ipv4, 10000, 1447), shard(elements(mapServices, ipv4, 20000, 100))...))
	plain := shard(elements(mapServices, ipv4, 600, 2))
	for i, e := range elements(mapServices, ipv4, 600, 2) { // two plain ports given node ports
		d.Elements.Updated = append(d.Elements.Updated, diffstore.Item[string, mapElement]{Key: e.ID(), Value: e, Prev: plain[i]})
	}
	if _, ok := c.after(d); ok {
		t.Error("600 + 1,447 new + 2 that left their shard: 2,049 services elements fit a capacity of 2,048")
	}
	// Instead of the second, one of the 600 becomes plain.
	was := elements(mapServices, ipv4, 0, 1)[0]
	d.Elements.Updated[1] = diffstore.Item[string, mapElement]{Key: was.ID(), Value: shard([]mapElement{was})[0], Prev: was}
	if next, ok := c.after(d); !ok || next[sizedSet{services: true, family: ipv4}].count != 2047 {
		t.Errorf("600 + 1,447 new + 1 that left its shard - 1 that went to one: fits %v, %+v, want 2,047 elements", ok, next[sizedSet{services: true, family: ipv4}])
	}
}

// TestShardCapacities: a shard's set and map are sized by their own
// elements (a key a plain service port, an element each of its
// endpoints); a round moving ports between shards counts on both sides; a
// shard created in a round gets the capacity of what it then holds, and a
// shard deleted leaves no capacity behind.
func TestShardCapacities(t *testing.T) {
	tr := newTracker(Options{})
	plain := func(i, endpoints int) *model.ServiceEndpoints {
		var eps []*model.Endpoint
		for e := range endpoints {
			eps = append(eps, ep(fmt.Sprintf("10.1.%d.%d", e, 1+i%250), false))
		}
		return &model.ServiceEndpoints{Service: svc("ns", fmt.Sprintf("s%d", i), ipset(fmt.Sprintf("10.96.%d.%d", i/250, 1+i%250)), tcp(80, 8080)), Endpoints: eps}
	}
	set := func(from, to, endpoints int) {
		for i := from; i < to; i++ {
			se := plain(i, endpoints)
			tr.Update(se.Service.Key(), se)
		}
	}
	set(0, 400, 2)
	tr.Done()
	c := wholeCapacities(tr.Ruleset("x"))
	if got, want := c[shardSized("shard-ips-v4-2")], (setFill{1024, 400}); got != want {
		t.Errorf("shard-ips-v4-2 %+v, want %+v", got, want)
	}
	if got, want := c[shardSized("shard-endpoints-v4-2")], (setFill{2048, 800}); got != want {
		t.Errorf("shard-endpoints-v4-2 %+v, want %+v", got, want)
	}

	// 100 services more of 2 endpoints, 50 of the 400 moved to shard 3
	// (created in the round).
	set(400, 500, 2)
	set(0, 50, 3)
	next, ok := c.after(tr.Done())
	for name, want := range map[string]setFill{
		"shard-ips-v4-2": {1024, 450}, "shard-endpoints-v4-2": {2048, 900},
		"shard-ips-v4-3": {1024, 50}, "shard-endpoints-v4-3": {1024, 150},
	} {
		if got := next[shardSized(name)]; got != want {
			t.Errorf("100 more in shard 2, 50 moved to shard 3: %s %+v, want %+v", name, got, want)
		}
	}
	if !ok {
		t.Error("100 more in shard 2, 50 moved to shard 3: does not fit")
	}
	c = next

	// 575 more in shard 2: its set holds 1,025 keys, over its capacity
	// (its map, 2,050 of 2,048, too); then the shard-3 ports back in
	// shard 2 instead, with 526 new ones: 1,024 keys, 2,048 endpoints, and
	// shard 3 deleted.
	set(500, 1075, 2)
	if _, ok := c.after(tr.Done()); ok {
		t.Error("1,025 ports in shard 2 fit a capacity of 1,024")
	}
	tr = newTracker(Options{})
	set(0, 500, 2)
	set(0, 50, 3)
	tr.Done()
	c = wholeCapacities(tr.Ruleset("x"))
	set(0, 50, 2)
	set(500, 524, 2)
	next, ok = c.after(tr.Done())
	if got := next[shardSized("shard-ips-v4-2")]; !ok || got != (setFill{1024, 524}) {
		t.Errorf("shard 3's ports back in shard 2, 24 new: fits %v, %+v, want 524 keys of 1,024", ok, got)
	}
	if _, ok := next[shardSized("shard-ips-v4-3")]; ok {
		t.Error("shard 3 deleted: its set keeps a capacity")
	}
	if _, ok := next[shardSized("shard-endpoints-v4-3")]; ok {
		t.Error("shard 3 deleted: its map keeps a capacity")
	}
}
