package nft

import (
	"net/netip"
	"testing"
)

// TestSlotsLowestFirst checks that slots are handed out lowest free first,
// released ones before new ones.
func TestSlotsLowestFirst(t *testing.T) {
	var s slots
	for want := uint32(0); want < 5; want++ {
		if got := s.get(); got != want {
			t.Fatalf("fresh slot %d, want %d", got, want)
		}
	}
	s.put(3)
	s.put(1)
	s.put(3) // twice: still once
	for _, want := range []uint32{1, 3, 5, 6} {
		if got := s.get(); got != want {
			t.Errorf("got slot %d, want %d", got, want)
		}
	}
}

// TestBlockIntervals checks that a block's intervals cover the whole range
// of the draw without gaps or overlaps, in shares that differ by at most
// one number.
func TestBlockIntervals(t *testing.T) {
	for _, n := range []int{1, 2, 3, 10, 1000} {
		bl := &block{Family: ipv6, Slot: 7}
		for i := range n {
			bl.Endpoints = append(bl.Endpoints, benchEndpointIPPort(i))
		}
		els := bl.appendElements(nil)
		if len(els) != n || els[0].From != 0 || els[n-1].To != blockRange {
			t.Fatalf("n=%d: %d intervals from %d to %d", n, len(els), els[0].From, els[n-1].To)
		}
		lo, hi := uint32(blockRange), uint32(0)
		for i, e := range els {
			if i > 0 && e.From != els[i-1].To {
				t.Fatalf("n=%d: interval %d starts at %d, the previous one ends at %d", n, i, e.From, els[i-1].To)
			}
			if e.Target != bl.Endpoints[i] || e.Slot != 7 || e.Family != ipv6 || e.Owner != ownerOf(bl.ID) {
				t.Fatalf("n=%d: interval %d: %+v", n, i, e)
			}
			lo, hi = min(lo, e.To-e.From), max(hi, e.To-e.From)
		}
		if hi-lo > 1 {
			t.Errorf("n=%d: shares from %d to %d numbers", n, lo, hi)
		}
		if got := els[0].Map(); got != "endpoints-v6-0" {
			t.Errorf("map %q", got)
		}
	}
}

// benchEndpointIPPort returns a distinct IPv6 endpoint for i.
func benchEndpointIPPort(i int) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom16([16]byte{0xfd, 15: byte(i), 14: byte(i >> 8)}), 8080)
}
