//go:build linux

package netns

import (
	"net/netip"
	"sync"
	"testing"
	"time"
)

// The addresses of the Blog topology. The service and first pod addresses
// are those of kpng's blog post and of
// examples/json/testdata/kpng-example.golden.json.
var (
	// ServiceV4 and ServiceV6 are the Service's external IPs. No namespace
	// has them: traffic reaches them only if a proxier on the node
	// DNATs it.
	ServiceV4 = netip.MustParseAddr("10.0.0.55")
	ServiceV6 = netip.MustParseAddr("1000::55")

	// ClientV4 and ClientV6 are the client's addresses, on the link to the
	// node (10.0.0.0/24, fd00::/64).
	ClientV4 = netip.MustParseAddr("10.0.0.1")
	ClientV6 = netip.MustParseAddr("fd00::1")

	// NodeV4 and NodeV6 are the node's addresses on the link to the client.
	NodeV4 = netip.MustParseAddr("10.0.0.2")
	NodeV6 = netip.MustParseAddr("fd00::2")

	// GatewayV4 and GatewayV6 are the node's address on each pod link:
	// the pods' default gateway.
	GatewayV4 = netip.MustParseAddr("11.0.2.1")
	GatewayV6 = netip.MustParseAddr("1100::201")

	// PodV4 and PodV6 are the addresses of the local endpoint of the
	// blog's state (kpng-example.golden.json).
	PodV4 = netip.MustParseAddr("11.0.2.2")
	PodV6 = netip.MustParseAddr("1100::202")

	// Pod2V4 and Pod2V6 are the addresses of a second pod on the node.
	Pod2V4 = netip.MustParseAddr("11.0.2.3")
	Pod2V6 = netip.MustParseAddr("1100::203")
)

// BlogPorts are the ports the Blog pods serve, over TCP and UDP. The
// Service only declares 6000: the others show that all-IP forwarding does
// not care about ports.
var BlogPorts = []uint16{6000, 7000, 8080}

// The identities the Blog pods answer with.
const (
	PodID  = "pod"
	Pod2ID = "pod2"
)

// BlogTopology is the topology of kpng's blog post, seen from one node:
//
//	client (10.0.0.1, fd00::1)
//	  | eth0                     routes: 10.0.0.55/32, 1000::55/128 and default via the node
//	  | eth0
//	node (10.0.0.2, fd00::2)     forwarding on; default routes via the client
//	  | vpod        \ vpod2      11.0.2.1/32, 1100::201/128 on both; /32 and /128 routes to the pods
//	  | eth0         \ eth0
//	pod               pod2
//	11.0.2.2          11.0.2.3   default routes via 11.0.2.1 and 1100::201 (onlink)
//	1100::202         1100::203
//
// The pods are wired the way point-to-point CNI plugins do it: a /32 (/128)
// address in the pod, a host route on the node. Both pods serve TCP and UDP
// on BlogPorts, answering PodID and Pod2ID.
//
// The service addresses are configured nowhere. The client routes them via
// the node; a proxier on the node DNATs them in PREROUTING (and OUTPUT, for
// traffic from the node itself), so the node needs no address for them. The
// node's default routes point back at the client, as an upstream router, so
// that the node's own traffic to the service addresses has a route before
// its OUTPUT DNAT. Without DNAT, IPv4 traffic to 10.0.0.55 dies unanswered
// (the node looks for 10.0.0.55 on the client link) and IPv6 traffic to
// 1000::55 loops between client and node until its hop limit runs out.
type BlogTopology struct {
	// Client is the outside world.
	Client *NS
	// Node is where a proxier's rules go.
	Node *NS
	// Pod is the blog's local endpoint (PodV4, PodV6).
	Pod *NS
	// Pod2 is a second pod on the node (Pod2V4, Pod2V6).
	Pod2 *NS
}

// Blog builds the BlogTopology for t, servers included. Everything is
// removed when t ends.
func Blog(t testing.TB) *BlogTopology {
	t.Helper()
	return BlogWithPrefix(t, Prefix)
}

// BlogWithPrefix is Blog with namespaces named by NewWithPrefix(t, prefix,
// …).
func BlogWithPrefix(t testing.TB, prefix string) *BlogTopology {
	t.Helper()
	b := &BlogTopology{
		Client: NewWithPrefix(t, prefix, "client"),
		Node:   NewWithPrefix(t, prefix, "node"),
		Pod:    NewWithPrefix(t, prefix, "pod"),
		Pod2:   NewWithPrefix(t, prefix, "pod2"),
	}
	b.Node.EnableForwarding()

	Veth(t, b.Client, "eth0", b.Node, "eth0")
	b.Client.AddAddr("eth0", "10.0.0.1/24")
	b.Client.AddAddr("eth0", "fd00::1/64")
	b.Node.AddAddr("eth0", "10.0.0.2/24")
	b.Node.AddAddr("eth0", "fd00::2/64")
	// 10.0.0.55 is inside the client's subnet: without this route the
	// client would look for it on the link.
	b.Client.AddRoute(ServiceV4.String()+"/32", "via", NodeV4.String())
	b.Client.AddRoute(ServiceV6.String()+"/128", "via", NodeV6.String())
	b.Client.AddRoute("default", "via", NodeV4.String())
	b.Client.AddRoute("default", "via", NodeV6.String())
	b.Node.AddRoute("default", "via", ClientV4.String())
	b.Node.AddRoute("default", "via", ClientV6.String())

	for _, p := range []struct {
		ns      *NS
		nodeDev string
		id      string
		v4, v6  netip.Addr
	}{
		{b.Pod, "vpod", PodID, PodV4, PodV6},
		{b.Pod2, "vpod2", Pod2ID, Pod2V4, Pod2V6},
	} {
		Veth(t, b.Node, p.nodeDev, p.ns, "eth0")
		b.Node.AddAddr(p.nodeDev, GatewayV4.String()+"/32")
		b.Node.AddAddr(p.nodeDev, GatewayV6.String()+"/128")
		b.Node.AddRoute(p.v4.String()+"/32", "dev", p.nodeDev)
		b.Node.AddRoute(p.v6.String()+"/128", "dev", p.nodeDev)
		p.ns.AddAddr("eth0", p.v4.String()+"/32")
		p.ns.AddAddr("eth0", p.v6.String()+"/128")
		p.ns.AddRoute("default", "via", GatewayV4.String(), "dev", "eth0", "onlink")
		p.ns.AddRoute("default", "via", GatewayV6.String(), "dev", "eth0", "onlink")
		p.ns.Serve(p.id, []netip.Addr{p.v4, p.v6}, BlogPorts)
	}
	return b
}

// addrsOf returns the v4 and v6 addresses of a Blog server identity.
func addrsOf(id string) (netip.Addr, netip.Addr, bool) {
	switch id {
	case PodID:
		return PodV4, PodV6, true
	case Pod2ID:
		return Pod2V4, Pod2V6, true
	}
	return netip.Addr{}, netip.Addr{}, false
}

// source returns the address the Blog namespace from uses toward the
// service addresses of the family of svc.
func (b *BlogTopology) source(from *NS, svc netip.Addr) (netip.Addr, bool) {
	switch {
	case from == b.Client && svc.Is4():
		return ClientV4, true
	case from == b.Client:
		return ClientV6, true
	case from == b.Node && svc.Is4():
		return NodeV4, true
	case from == b.Node:
		return NodeV6, true
	}
	return netip.Addr{}, false
}

// ExpectService checks that, from the namespace from (Client or Node), TCP
// and UDP on every BlogPorts port of both service addresses are answered by
// the pod with identity server (PodID or Pod2ID), reached on its own address
// and the same port, and that the pod sees the sender's own address (the
// traffic is DNATed, not SNATed). It reports every mismatch with t.Errorf.
func (b *BlogTopology) ExpectService(t testing.TB, from *NS, server string) {
	t.Helper()
	b.expectService(t, from, server, false)
}

// ExpectMasqueradedService is ExpectService for a proxier that masquerades
// the traffic (kube-proxy does for external IPs with the Cluster traffic
// policy): the pod sees the node's address on its link (GatewayV4,
// GatewayV6) instead of the sender's.
func (b *BlogTopology) ExpectMasqueradedService(t testing.TB, from *NS, server string) {
	t.Helper()
	b.expectService(t, from, server, true)
}

func (b *BlogTopology) expectService(t testing.TB, from *NS, server string, masqueraded bool) {
	t.Helper()
	podV4, podV6, ok := addrsOf(server)
	if !ok {
		t.Fatalf("ExpectService: unknown server %q", server)
	}
	for _, svc := range []netip.Addr{ServiceV4, ServiceV6} {
		pod := podV4
		if svc.Is6() {
			pod = podV6
		}
		src, ok := b.source(from, svc)
		if !ok {
			t.Fatalf("ExpectService: %s is not the client or the node", from)
		}
		if masqueraded {
			src = GatewayV4
			if svc.Is6() {
				src = GatewayV6
			}
		}
		for _, network := range []string{"tcp", "udp"} {
			for _, port := range BlogPorts {
				dst := netip.AddrPortFrom(svc, port)
				a, err := from.Ask(network, dst, AskOptions{})
				if err != nil {
					t.Errorf("want %s to answer: %v", server, err)
					continue
				}
				want := netip.AddrPortFrom(pod, port)
				if a.Server != server || a.Local != want || a.Remote.Addr() != src {
					t.Errorf("%s %s from %s: answer %q, want %s on %s seeing %s", network, dst, from, a, server, want, src)
				}
			}
		}
	}
}

// ExpectNoService checks that, from the namespace from, no TCP or UDP
// request to any BlogPorts port of either service address is answered
// within timeout. The requests run in parallel.
func (b *BlogTopology) ExpectNoService(t testing.TB, from *NS, timeout time.Duration) {
	t.Helper()
	var wg sync.WaitGroup
	for _, svc := range []netip.Addr{ServiceV4, ServiceV6} {
		for _, network := range []string{"tcp", "udp"} {
			for _, port := range BlogPorts {
				dst := netip.AddrPortFrom(svc, port)
				wg.Add(1)
				go func() {
					defer wg.Done()
					if a, err := from.Ask(network, dst, AskOptions{Timeout: timeout}); err == nil {
						t.Errorf("%s %s from %s: answered %q, want no answer", network, dst, from, a)
					}
				}()
			}
		}
	}
	wg.Wait()
}

// ServedByPod asks, from the client, each of addrs at port over TCP and
// UDP (one request each, a second's timeout) and returns the requests
// ("tcp 10.96.0.10:80") the pod answered and those it did not.
func (b *BlogTopology) ServedByPod(addrs []netip.Addr, port uint16) (served, notServed []string) {
	for _, addr := range addrs {
		for _, network := range []string{"tcp", "udp"} {
			dst := netip.AddrPortFrom(addr, port)
			a, err := b.Client.Ask(network, dst, AskOptions{Timeout: time.Second})
			if err == nil && a.Server == PodID {
				served = append(served, network+" "+dst.String())
			} else {
				notServed = append(notServed, network+" "+dst.String())
			}
		}
	}
	return served, notServed
}
