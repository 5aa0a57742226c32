package userspace

import (
	"net/netip"
	"testing"
	"time"

	"sigs.k8s.io/kpng/model/endpoints"
)

func TestBalancerRoundRobin(t *testing.T) {
	var b balancer
	targets := []netip.AddrPort{ap("11.0.0.1:80"), ap("11.0.0.2:80"), ap("11.0.0.3:80")}
	client := netip.MustParseAddr("10.0.0.1")
	counts := map[netip.AddrPort]int{}
	for range 30 {
		t, ok := b.pick(client, targets, 0, nil, time.Now())
		if !ok {
			panic("no target")
		}
		counts[t]++
	}
	for _, tg := range targets {
		if counts[tg] != 10 {
			t.Errorf("round-robin over 30 picks: %v, want 10 each", counts)
			break
		}
	}
	// Tried targets are skipped; when every one was tried, none.
	got, ok := b.pick(client, targets, 0, targets[:2], time.Now())
	if !ok || got != targets[2] {
		t.Errorf("pick skipping the first two = %v, %v; want %v", got, ok, targets[2])
	}
	if _, ok := b.pick(client, targets, 0, targets, time.Now()); ok {
		t.Error("pick with every target tried returned one")
	}
	if _, ok := b.pick(client, nil, 0, nil, time.Now()); ok {
		t.Error("pick without targets returned one")
	}
}

func TestBalancerAffinity(t *testing.T) {
	var b balancer
	targets := []netip.AddrPort{ap("11.0.0.1:80"), ap("11.0.0.2:80"), ap("11.0.0.3:80")}
	c1, c2 := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	now := time.Unix(1000, 0)
	first, _ := b.pick(c1, targets, 10*time.Second, nil, now)
	for i := range 5 {
		// Each new connection within the timeout renews it.
		now = now.Add(9 * time.Second)
		if got, _ := b.pick(c1, targets, 10*time.Second, nil, now); got != first {
			t.Fatalf("pick %d of client 1 = %v, want its endpoint %v", i, got, first)
		}
	}
	other, _ := b.pick(c2, targets, 10*time.Second, nil, now)
	if other == first {
		t.Errorf("client 2 went to %v too: the round-robin did not move on", other)
	}
	// Expired: the client goes where the round-robin says (the third
	// endpoint, after client 1's and client 2's).
	now = now.Add(10 * time.Second)
	if got, _ := b.pick(c1, targets, 10*time.Second, nil, now); got != targets[2] {
		t.Errorf("after the timeout client 1 went to %v, want the round-robin's next, %v", got, targets[2])
	}
	// An endpoint gone or tried is not kept.
	if got, _ := b.pick(c2, targets[:1], 10*time.Second, nil, now); got != targets[0] {
		t.Errorf("with its endpoint gone client 2 went to %v", got)
	}
	sticky, _ := b.pick(c1, targets, 10*time.Second, nil, now)
	if got, _ := b.pick(c1, targets, 10*time.Second, []netip.AddrPort{sticky}, now); got == sticky {
		t.Errorf("the client's endpoint %v failed and was picked again", got)
	}
}

func TestBalancerExpiresEntries(t *testing.T) {
	var b balancer
	targets := []netip.AddrPort{ap("11.0.0.1:80")}
	now := time.Unix(1000, 0)
	for i := range 63 {
		b.pick(netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}), targets, time.Second, nil, now)
	}
	now = now.Add(time.Minute)
	b.pick(netip.MustParseAddr("10.1.0.0"), targets, time.Second, nil, now)
	if len(b.sticky) != 1 {
		t.Errorf("after the 64th client, %d entries: the 63 expired ones were not dropped", len(b.sticky))
	}
}

func TestDecide(t *testing.T) {
	cluster := []netip.Prefix{netip.MustParsePrefix("11.0.0.0/16")}
	node := netip.MustParseAddr("10.0.0.2")
	local := func(a netip.Addr) bool { return a == node }
	ext := &route{
		verdict: endpoints.Drop, shortCircuit: true, clusterVerdict: endpoints.Forward,
		clusterTargets: []netip.AddrPort{ap("11.0.1.2:80")},
	}
	lb := &route{verdict: endpoints.Forward, targets: []netip.AddrPort{ap("11.0.1.2:80")}, sourceRanges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}}
	lbNode := *lb
	lbNode.sourceRanges = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}
	lbNodeAllowed := lbNode
	lbNodeAllowed.rangesHoldNode = true
	for _, tc := range []struct {
		name   string
		r      *route
		client string
		want   endpoints.Verdict
	}{
		{"external Local, outside client: dropped", ext, "192.0.2.1", endpoints.Drop},
		{"external Local, pod: cluster endpoints", ext, "11.0.2.2", endpoints.Forward},
		{"external Local, the node: cluster endpoints", ext, "10.0.0.2", endpoints.Forward},
		{"source range: inside", lb, "10.0.0.1", endpoints.Forward},
		{"source range: outside", lb, "10.1.0.1", endpoints.Drop},
		{"source range: the node, no range holds a node IP", &lbNode, "10.0.0.2", endpoints.Drop},
		{"source range: the node, a range holds a node IP", &lbNodeAllowed, "10.0.0.2", endpoints.Forward},
	} {
		if got, _ := decide(tc.r, netip.MustParseAddr(tc.client), cluster, local); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
