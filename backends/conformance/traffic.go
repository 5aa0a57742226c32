//go:build linux

package conformance

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"time"

	"sigs.k8s.io/kpng/internal/netns"
)

// noAnswer is how long a request waits before it counts as unanswered.
const noAnswer = 400 * time.Millisecond

// networks returns the protocols a scenario sends: TCP, and UDP unless
// the backend lacks it.
func (h *harness) networks() []string {
	if reason, ok := h.b.Unsupported[UDP]; ok {
		h.t.Logf("UDP not checked in this scenario: the backend declares %s unsupported (%s)", UDP, reason)
		return []string{"tcp"}
	}
	return []string{"tcp", "udp"}
}

// Checks that send many requests stop at the first wrong answer and
// report once. Those that depend on the backend's random choices are made
// certain enough that chance never decides them (below one in a million):
//
//   - spread sends requests until every endpoint has answered, at most
//     spreadRequests(k) for k endpoints: a backend choosing uniformly at
//     random leaves one of them unseen with probability at most
//     k·(1−1/k)^n, which that n keeps below 1e-6 (k = 2: n = 21,
//     2·2^−21 ≈ 9.5e-7). A working backend answers in a few requests.
//   - askAll(sure, …) checks that no request reaches an endpoint it must
//     not: a backend that sends to a wrong one with probability p ≥ 1/2
//     (one of two endpoints) escapes it with probability (1−p)^21 ≤
//     4.8e-7.
//   - the affinity expiry check stops as soon as a second endpoint
//     answers, after at most sure rounds (sessionAffinity).

// chance is the highest probability the kit lets chance decide a check.
const chance = 1e-6

// sure is the number of requests (or rounds) after which a choice that
// goes either way with probability 1/2 has gone both ways but with
// probability below chance: 2^−(sure−1) ≈ 9.5e-7 for either of two
// outcomes missing, 2^−sure for one of them.
const sure = 21

// spreadRequests returns the number of requests after which a backend
// choosing uniformly among k endpoints has used every one but with
// probability below chance: the least n with k·(1−1/k)^n < chance.
func spreadRequests(k int) int {
	if k <= 1 {
		return 1
	}
	return int(math.Ceil(math.Log(chance/float64(k)) / math.Log(1-1/float64(k))))
}

// try sends one request and says what is wrong with its answer ("" when
// one of servers answered on its own address and port 6000).
func (h *harness) try(from *netns.NS, network string, dst netip.AddrPort, opts netns.AskOptions, servers []string) (netns.Answer, string) {
	a, err := from.Ask(network, dst, opts)
	if err != nil {
		return a, fmt.Sprintf("no answer (%v), want one from %s", err, strings.Join(servers, " or "))
	}
	if !contains(servers, a.Server) {
		return a, fmt.Sprintf("answered by %s, want %s", a.Server, strings.Join(servers, " or "))
	}
	if want := netip.AddrPortFrom(podAddr(a.Server, dst.Addr()), 6000); a.Local != want {
		return a, fmt.Sprintf("%s answered on %s, want %s", a.Server, a.Local, want)
	}
	return a, ""
}

// udpAttempts is how many datagrams a UDP request that gets no answer is
// sent as, as a client resends: a datagram may be lost (a neighbour not
// yet resolved) without anything being wrong.
const udpAttempts = 3

// tryResending is try for a UDP request: a datagram that gets no answer
// is sent again, up to udpAttempts in all; an answer, right or wrong,
// ends it (a wrong answer is never retried away).
func (h *harness) tryResending(from *netns.NS, dst netip.AddrPort, opts netns.AskOptions, servers []string) (netns.Answer, string) {
	var a netns.Answer
	var wrong string
	for range udpAttempts {
		if a, wrong = h.try(from, "udp", dst, opts, servers); a.Server != "" {
			break
		}
	}
	return a, wrong
}

// ask sends one request from ns and fails the check unless one of
// servers answers, on its own address and port 6000; it returns the
// answer.
func (h *harness) ask(from *netns.NS, network string, dst netip.AddrPort, servers ...string) netns.Answer {
	h.t.Helper()
	a, _ := h.askAll(1, from, network, dst, netns.AskOptions{}, servers...)
	return a
}

// askAll sends n requests with opts and fails the check, once, unless
// each is answered by one of servers (as ask); it stops at the first
// wrong answer. It returns the last answer and whether all were right.
func (h *harness) askAll(n int, from *netns.NS, network string, dst netip.AddrPort, opts netns.AskOptions, servers ...string) (netns.Answer, bool) {
	h.t.Helper()
	seen := map[string]int{}
	var a netns.Answer
	for i := range n {
		var wrong string
		if a, wrong = h.try(from, network, dst, opts, servers); wrong != "" {
			h.fail("%s %s from %s%s, request %d of %d: %s%s", network, dst, from, sourcePort(opts), i+1, n, wrong, earlier(seen))
			return a, false
		}
		seen[a.Server]++
	}
	return a, true
}

// sourcePort describes the fixed source port of opts, if any.
func sourcePort(opts netns.AskOptions) string {
	if opts.LocalPort == 0 {
		return ""
	}
	return fmt.Sprintf(" (source port %d)", opts.LocalPort)
}

// earlier describes the answers before a wrong one.
func earlier(seen map[string]int) string {
	if len(seen) == 0 {
		return ""
	}
	return fmt.Sprintf(" (the requests before it were answered by %s)", counts(seen))
}

// counts renders answers per server, sorted: "pod×3 pod2×1".
func counts(seen map[string]int) string {
	var out []string
	for _, s := range slices.Sorted(maps.Keys(seen)) {
		out = append(out, fmt.Sprintf("%s×%d", s, seen[s]))
	}
	return strings.Join(out, " ")
}

// spread sends requests until every one of servers has answered (at most
// spreadRequests(len(servers))), and fails the check, once, if one never
// does or another answers.
func (h *harness) spread(from *netns.NS, network string, dst netip.AddrPort, servers ...string) {
	h.t.Helper()
	n := spreadRequests(len(servers))
	seen := map[string]int{}
	for i := range n {
		a, wrong := h.try(from, network, dst, netns.AskOptions{}, servers)
		if wrong != "" {
			h.fail("%s %s from %s, request %d: %s%s", network, dst, from, i+1, wrong, earlier(seen))
			return
		}
		seen[a.Server]++
		if len(seen) == len(servers) {
			return
		}
	}
	h.fail("%s %s from %s: %d requests answered by %s only, want every one of %s (a backend choosing at random uses each within %d requests but with probability below %g): not spread over every endpoint",
		network, dst, from, n, counts(seen), strings.Join(servers, " and "), n, chance)
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
		h.fail("%s %s from %s: %v; want the host beyond the node to answer (the node must route it out untouched)", network, dst, from, err)
	case a.Server != outsideID || a.Local != dst:
		h.fail("%s %s from %s: answered by %s on %s; want the host beyond the node, on %s", network, dst, from, a.Server, a.Local, dst)
	}
}

// expectNoOutside fails the test if the outside host answers dst from
// ns: the node routed out traffic it must keep.
func (h *harness) expectNoOutside(from *netns.NS, network string, dst netip.AddrPort) {
	h.t.Helper()
	if a, err := from.Ask(network, dst, netns.AskOptions{Timeout: noAnswer}); err == nil {
		h.fail("%s %s from %s: answered by %s; want no answer from beyond the node", network, dst, from, a.Server)
	}
}

// expectDropped fails the test unless the request gets no answer at all
// (not even a refusal).
func (h *harness) expectDropped(from *netns.NS, network string, dst netip.AddrPort) {
	h.t.Helper()
	a, err := from.Ask(network, dst, netns.AskOptions{Timeout: noAnswer})
	if err == nil || isRefused(err) {
		h.fail("%s %s from %s: answer %v, error %v; want no answer (dropped)", network, dst, from, a.Server, err)
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
		h.fail("%s %s from %s: answer %q, error %v; want refused", network, dst, from, a.Server, err)
	}
}

// expectNoPod fails the test if a pod answers.
func (h *harness) expectNoPod(from *netns.NS, network string, dst netip.AddrPort) {
	h.t.Helper()
	if a, err := from.Ask(network, dst, netns.AskOptions{Timeout: noAnswer}); err == nil {
		h.fail("%s %s from %s: answered by %s, want no pod to answer", network, dst, from, a.Server)
	}
}

func isRefused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

func contains(list []string, s string) bool { return slices.Contains(list, s) }
