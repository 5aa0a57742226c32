//go:build linux

package conformance

import (
	"errors"
	"net/netip"
	"syscall"
	"time"

	"sigs.k8s.io/kpng/internal/netns"
)

// noAnswer is how long a request waits before it counts as unanswered.
const noAnswer = 400 * time.Millisecond

// networks returns the protocols a scenario sends: TCP, and UDP unless
// the backend lacks it.
func (h *harness) networks() []string {
	if _, ok := h.b.Unsupported[UDP]; ok {
		return []string{"tcp"}
	}
	return []string{"tcp", "udp"}
}

// ask sends one request from ns and fails the test unless one of servers
// answers, on its own address and port 6000; it returns the answer.
func (h *harness) ask(from *netns.NS, network string, dst netip.AddrPort, servers ...string) netns.Answer {
	h.t.Helper()
	a, err := from.Ask(network, dst, netns.AskOptions{})
	if err != nil {
		h.t.Errorf("%s %s from %s: %v, want an answer from %v", network, dst, from, err, servers)
		return a
	}
	if !contains(servers, a.Server) {
		h.t.Errorf("%s %s from %s: answered by %s, want one of %v", network, dst, from, a.Server, servers)
		return a
	}
	if want := netip.AddrPortFrom(podAddr(a.Server, dst.Addr()), 6000); a.Local != want {
		h.t.Errorf("%s %s from %s: %s answered on %s, want %s", network, dst, from, a.Server, a.Local, want)
	}
	return a
}

// spread sends n requests and fails the test unless every one of servers
// answered at least once (and no other).
func (h *harness) spread(from *netns.NS, network string, dst netip.AddrPort, n int, servers ...string) {
	h.t.Helper()
	seen := map[string]int{}
	for range n {
		seen[h.ask(from, network, dst, servers...).Server]++
	}
	for _, s := range servers {
		if seen[s] == 0 {
			h.t.Errorf("%s %s from %s: %d requests answered by %v, none by %s: not spread over every endpoint", network, dst, from, n, seen, s)
		}
	}
}

// outsideID is the identity the outside host answers with.
const outsideID = "outside"

// outsideHost makes addrs a host beyond the node: they are added to the
// client's loopback interface, with servers on ports 80 and 81. The
// client routes nothing to itself through the node, so traffic to them
// is sent from the pods or the node: a node that does not proxy them
// routes it out by its default route, to the client, which answers; a
// proxier that claims them (rejects, drops, DNATs) is seen doing so.
func (h *harness) outsideHost(addrs ...netip.Addr) {
	h.t.Helper()
	for _, a := range addrs {
		h.topo.Client.AddAddr("lo", netip.PrefixFrom(a, a.BitLen()).String())
	}
	h.topo.Client.Serve(outsideID, addrs, []uint16{80, 81})
}

// expectOutside fails the test unless the outside host answers dst from
// ns: the node routed the traffic out untouched.
func (h *harness) expectOutside(from *netns.NS, network string, dst netip.AddrPort) {
	h.t.Helper()
	a, err := from.Ask(network, dst, netns.AskOptions{})
	switch {
	case err != nil:
		h.t.Errorf("%s %s from %s: %v; want the host beyond the node to answer (the node must route it out untouched)", network, dst, from, err)
	case a.Server != outsideID || a.Local != dst:
		h.t.Errorf("%s %s from %s: answered by %s on %s; want the host beyond the node, on %s", network, dst, from, a.Server, a.Local, dst)
	}
}

// expectNoOutside fails the test if the outside host answers dst from
// ns: the node routed out traffic it must keep.
func (h *harness) expectNoOutside(from *netns.NS, network string, dst netip.AddrPort) {
	h.t.Helper()
	if a, err := from.Ask(network, dst, netns.AskOptions{Timeout: noAnswer}); err == nil {
		h.t.Errorf("%s %s from %s: answered by %s; want no answer from beyond the node", network, dst, from, a.Server)
	}
}

// expectDropped fails the test unless the request gets no answer at all
// (not even a refusal).
func (h *harness) expectDropped(from *netns.NS, network string, dst netip.AddrPort) {
	h.t.Helper()
	a, err := from.Ask(network, dst, netns.AskOptions{Timeout: noAnswer})
	if err == nil || isRefused(err) {
		h.t.Errorf("%s %s from %s: answer %v, error %v; want no answer (dropped)", network, dst, from, a.Server, err)
	}
}

// expectRefused fails the test unless the request is refused (TCP reset,
// ICMP port unreachable). From the node itself, a UDP datagram that a
// rule of its output hook rejects never leaves: the sender gets EPERM,
// which counts as refused there.
func (h *harness) expectRefused(from *netns.NS, network string, dst netip.AddrPort) {
	h.t.Helper()
	a, err := from.Ask(network, dst, netns.AskOptions{Timeout: 2 * time.Second})
	if !isRefused(err) && (from != h.topo.Node || !errors.Is(err, syscall.EPERM)) {
		h.t.Errorf("%s %s from %s: answer %q, error %v; want refused", network, dst, from, a.Server, err)
	}
}

// expectNoPod fails the test if a pod answers.
func (h *harness) expectNoPod(from *netns.NS, network string, dst netip.AddrPort) {
	h.t.Helper()
	if a, err := from.Ask(network, dst, netns.AskOptions{Timeout: noAnswer}); err == nil {
		h.t.Errorf("%s %s from %s: answered by %s, want no pod to answer", network, dst, from, a.Server)
	}
}

func isRefused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
