//go:build linux

package nft

import (
	"fmt"
	"strings"
	"testing"

	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/model"
)

// TestKernelSetCapacity: a full write gives the hairpin and cluster-ips
// sets the capacity of their counts (nft lists it as their size); a round
// that would take a set over its capacity writes the table whole, with a
// larger one, and every address reaches the kernel; a round within it is
// a partial one.
func TestKernelSetCapacity(t *testing.T) {
	b := kernelTopology(t)
	s := newTestSink(t, b, "capacity")
	set := func(from, to int) {
		for i := from; i < to; i++ {
			se := benchServiceEndpoints(i)
			s.set(se.Service.Key(), se)
		}
	}
	expect := func(when string, full bool, size, hairpin int) {
		t.Helper()
		out := syncSized(t, b, s, when, full, "set", "hairpin-v4", size)
		// One " . " an element, and the set's type.
		if got := strings.Count(out, " . ") - 1; got != hairpin {
			t.Errorf("%s: %d hairpin addresses in the kernel, want %d", when, got, hairpin)
		}
	}
	set(0, 50)
	expect("first sync, 500 endpoints", true, 1024, 500)
	set(50, 100)
	expect("1,000 endpoints", false, 1024, 1000)
	set(100, 150)
	expect("1,500 endpoints: over the capacity", true, 4096, 1500)
	set(150, 151)
	expect("1,510 endpoints", false, 4096, 1510)
	out, _, err := b.Node.Exec(nil, "nft", "list", "set", "ip", TableName("capacity"), "cluster-ips-v4")
	if err != nil || !strings.Contains(out, "\tsize 1024\n") {
		t.Errorf("cluster-ips-v4 (151 addresses): %v\n%s", err, out)
	}
}

// TestKernelServicesMapCapacity: a full write gives the services map the
// capacity of its elements (600: 2,048), a round within it is partial, the
// round taking it over writes the table whole with a larger one, and
// every service port is in the kernel. The services have node ports: a
// plain one's key is in a shard's set instead (shards.go).
func TestKernelServicesMapCapacity(t *testing.T) {
	b := kernelTopology(t)
	s := newTestSink(t, b, "svccap")
	items := manyChainServices(2049)
	expect := func(when string, full bool, size, n int) {
		t.Helper()
		out := syncSized(t, b, s, when, full, "map", "service-ips-v4", size)
		if got := strings.Count(out, " : goto "); got != n {
			t.Errorf("%s: %d elements in service-ips-v4, want %d", when, got, n)
		}
	}
	s.setAll(items[:600]...)
	expect("600 services", true, 2048, 600)
	for _, se := range items[600:2048] {
		s.set(se.Service.Key(), se)
	}
	expect("2,048 services", false, 2048, 2048)
	s.set(items[2048].Service.Key(), items[2048])
	expect("2,049 services: over the capacity", true, 8192, 2049)
}

// syncSized syncs s, checks that the transaction was full or not, and that
// the set (kind "set") or map ("map") name of its table has the given size
// in the kernel; it returns the kernel's listing of it.
func syncSized(t *testing.T, b *netns.BlogTopology, s *testSink, when string, full bool, kind, name string, size int) string {
	t.Helper()
	if r := s.sync(); r.Full != full {
		t.Errorf("%s: full sync %v, want %v", when, r.Full, full)
	}
	out, _, err := b.Node.Exec(nil, "nft", "list", kind, objectFamily(name), s.nft.table, name)
	if err != nil {
		t.Fatalf("%s: %v", when, err)
	}
	if !strings.Contains(out, fmt.Sprintf("\tsize %d\n", size)) {
		t.Errorf("%s: %s is not of size %d:\n%.300s", when, name, size, out)
	}
	return out
}

// TestKernelShardCapacity: a full write gives each shard's set and map the
// capacity of its elements; a shard created by a partial sync gets the
// capacity of what it then holds; a round within the capacities is
// partial, the round taking a shard's set or map over its capacity writes
// the table whole with larger ones, and every service port and endpoint
// is in the kernel, answering.
func TestKernelShardCapacity(t *testing.T) {
	b := kernelTopology(t)
	s := newTestSink(t, b, "shardcap")
	items := manyServices(1025)
	pod, pod2 := podEndpoints(netns.PodID)[0], podEndpoints(netns.Pod2ID)[0] // IPv4
	// expect syncs s and checks the shard's set and map: their sizes and
	// their numbers of elements (one " . tcp . 80" each: a key of the set,
	// the key of an endpoint in the map).
	expect := func(when string, full bool, shard, setSize, ports, mapSize int) {
		t.Helper()
		out := syncSized(t, b, s, when, full, "set", fmt.Sprintf("shard-ips-v4-%d", shard), setSize)
		if got := strings.Count(out, " . tcp . 80"); got != ports {
			t.Errorf("%s: %d keys in shard-ips-v4-%d, want %d", when, got, shard, ports)
		}
		out, _, err := b.Node.Exec(nil, "nft", "list", "map", "ip", s.nft.table, fmt.Sprintf("shard-endpoints-v4-%d", shard))
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		if !strings.Contains(out, fmt.Sprintf("\tsize %d\n", mapSize)) {
			t.Errorf("%s: shard-endpoints-v4-%d is not of size %d:\n%.300s", when, shard, mapSize, out)
		}
		if got := strings.Count(out, " . tcp . 80 . "); got != ports*shard {
			t.Errorf("%s: %d endpoints in shard-endpoints-v4-%d, want %d", when, got, shard, ports*shard)
		}
	}
	s.setAll(items[:300]...)
	expect("300 services of 1 endpoint", true, 1, 1024, 300, 1024)
	for _, se := range items[300:1024] {
		s.set(se.Service.Key(), se)
	}
	expect("1,024 services", false, 1, 1024, 1024, 1024)
	s.set(items[1024].Service.Key(), items[1024])
	expect("1,025 services: over the capacity", true, 1, 4096, 1025, 4096)
	expectAnswers(t, b, "1,025 services", items[1024], netns.PodID)

	// withEndpoints gives services from to to two endpoints (copies: the
	// feeder holds what it was given).
	withEndpoints := func(from, to int) {
		for i := from; i < to; i++ {
			c := *items[i]
			c.Endpoints = []*model.Endpoint{pod, pod2}
			items[i] = &c
			s.set(c.Service.Key(), &c)
		}
	}
	withEndpoints(0, 100)
	expect("shard 2 created, 100 services", false, 2, 1024, 100, 1024)
	withEndpoints(100, 512)
	expect("512 services in shard 2", false, 2, 1024, 512, 1024)
	withEndpoints(512, 513)
	expect("513 services in shard 2: its map over the capacity", true, 2, 2048, 513, 4096)
	expectAnswers(t, b, "513 services in shard 2", items[512], netns.PodID, netns.Pod2ID)
	expectListingIsText(t, b, s, "513 services in shard 2")
}
