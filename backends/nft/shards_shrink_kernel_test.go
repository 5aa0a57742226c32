//go:build linux

package nft

import (
	"testing"
	"time"
)

// TestKernelReshardOnRepairShrinks: 2,100 plain services written whole
// (512 shards), 2,000 of them deleted by a partial sync (the count kept),
// then a shard chain flushed by nft: the monitor's repair writes the
// table whole, with 256 shards (the shard bits go down), and the partial
// sync after it (a service added in shard 101, 357 of the old count)
// places it with the new bits. After each step the kernel's listing is
// the tracker's Text and the services answer.
func TestKernelReshardOnRepairShrinks(t *testing.T) {
	b := kernelTopology(t)
	s := newTestSink(t, b, "shrink")
	items := manyServices(2101)
	check := func(when, mask string, answer []int) {
		t.Helper()
		expectShardTable(t, b, s, when, mask, false, items, answer)
	}
	s.setAll(items[:2100]...)
	if r := s.sync(); !r.Full {
		t.Fatalf("first sync not full")
	}
	check("2,100 services", "0.0.1.255", []int{0, 99, 2099})
	for _, se := range items[100:2100] {
		s.deleteService(se.Service.Key())
	}
	if r := s.sync(); r.Full {
		t.Fatalf("2,000 services deleted: written whole")
	}
	check("100 services left", "0.0.1.255", []int{0, 99})

	n := len(s.allResults())
	if _, stderr, err := b.Node.Exec([]byte("flush chain inet "+s.nft.table+" shard4-257\n"), "nft", "-f", "-"); err != nil {
		t.Fatalf("nft -f: %v: %s", err, stderr)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(s.allResults()) == n {
		if time.Now().After(deadline) {
			t.Fatalf("no repair within 10 s of the shard chain's flush")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if r := s.allResults()[n]; !r.Full || r.Repair == "" || r.Err != nil {
		t.Fatalf("after the flush: %+v, want a successful full repair", r)
	}
	check("repaired", "0.0.0.255", []int{0, 99})

	s.set(items[2100].Service.Key(), items[2100])
	if r := s.sync(); r.Full {
		t.Fatalf("a service added after the repair: written whole")
	}
	items[100] = items[2100]
	check("a service added after the repair", "0.0.0.255", []int{0, 99, 100})
}
