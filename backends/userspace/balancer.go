package userspace

import (
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"sigs.k8s.io/kpng/model/endpoints"
)

// balancer picks the endpoint of each new connection or flow of one
// frontend: round-robin, or the endpoint a client was last sent to while
// its ClientIP affinity lasts. It is safe for concurrent use.
type balancer struct {
	next atomic.Uint32

	mu     sync.Mutex
	sticky map[netip.Addr]stickyEntry
}

// stickyEntry is a client's endpoint and when the client last came.
type stickyEntry struct {
	target netip.AddrPort
	last   time.Time
}

// pick returns the endpoint for a new connection from client among
// targets (not empty), skipping those in tried. ok is false when every
// target was tried.
func (b *balancer) pick(client netip.Addr, targets []netip.AddrPort, affinity time.Duration, tried []netip.AddrPort, now time.Time) (netip.AddrPort, bool) {
	if affinity > 0 {
		b.mu.Lock()
		defer b.mu.Unlock()
		if e, ok := b.sticky[client]; ok && now.Sub(e.last) < affinity && !slices.Contains(tried, e.target) && slices.Contains(targets, e.target) {
			e.last = now
			b.sticky[client] = e
			return e.target, true
		}
	}
	t, ok := b.roundRobin(targets, tried)
	if ok && affinity > 0 {
		if b.sticky == nil {
			b.sticky = map[netip.Addr]stickyEntry{}
		}
		b.sticky[client] = stickyEntry{target: t, last: now}
		b.expire(affinity, now)
	}
	return t, ok
}

// roundRobin returns the next target not in tried.
func (b *balancer) roundRobin(targets []netip.AddrPort, tried []netip.AddrPort) (netip.AddrPort, bool) {
	n := uint32(len(targets))
	if n == 0 {
		return netip.AddrPort{}, false
	}
	start := b.next.Add(1) - 1
	for i := range n {
		t := targets[(start+i)%n]
		if !slices.Contains(tried, t) {
			return t, true
		}
	}
	return netip.AddrPort{}, false
}

// expire drops affinity entries that have run out, now and then: when the
// table has doubled since the last sweep. b.mu is held.
func (b *balancer) expire(affinity time.Duration, now time.Time) {
	if len(b.sticky) < 64 || len(b.sticky)&(len(b.sticky)-1) != 0 {
		return
	}
	for c, e := range b.sticky {
		if now.Sub(e.last) >= affinity {
			delete(b.sticky, c)
		}
	}
}

// decide returns what to do with a new connection or flow from client on
// a frontend with route r: the verdict, and the targets when it is
// Forward. local reports whether an address is the node's own.
func decide(r *route, client netip.Addr, clusterCIDRs []netip.Prefix, local func(netip.Addr) bool) (endpoints.Verdict, []netip.AddrPort) {
	if len(r.sourceRanges) > 0 && !inAny(r.sourceRanges, client) && !(r.rangesHoldNode && local(client)) {
		return endpoints.Drop, nil
	}
	if r.shortCircuit && (local(client) || inAny(clusterCIDRs, client)) {
		return r.clusterVerdict, r.clusterTargets
	}
	return r.verdict, r.targets
}

// inAny reports whether a is inside one of ps.
func inAny(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
