//go:build linux

package conformance

import (
	"bufio"
	"net"
	"net/netip"
	"time"

	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/model"
)

var scenarios = []Scenario{
	{Name: "cluster-ip", run: clusterIP},
	{Name: "node-port", run: nodePort},
	{Name: "external-ip", run: externalIP},
	{Name: "headless-external-ip", run: headless},
	{Name: "external-ip-other-family", Needs: []Feature{OtherFamilyAddresses}, run: otherFamily},
	{Name: "cluster-ip-undefined-port", Needs: []Feature{UndefinedPorts}, run: undefinedPort},
	{Name: "service-cidr-unused-address", Needs: []Feature{ServiceCIDRs}, run: unusedServiceAddress},
	{Name: "load-balancer-source-ranges", Needs: []Feature{SourceRanges}, run: sourceRanges},
	{Name: "session-affinity", Needs: []Feature{SessionAffinity}, run: sessionAffinity},
	{Name: "external-traffic-policy-local", run: externalLocal},
	{Name: "internal-traffic-policy-local", run: internalLocal},
	{Name: "reject-without-endpoints", run: reject},
	{Name: "terminating-fallback", run: terminating},
	{Name: "topology-hints", Needs: []Feature{TopologyHints}, run: topology},
	{Name: "client-address", Needs: []Feature{ClientAddress}, run: clientAddress},
	{Name: "masquerade", Needs: []Feature{Masquerade}, run: masquerade},
	{Name: "endpoint-change", run: endpointChange},
	{Name: "udp-stale-flow", Needs: []Feature{UDP, StaleUDPFlows}, run: staleUDP},
	{Name: "port-change", run: portChange},
	{Name: "service-deleted", run: serviceDeleted},
	{Name: "restart-keeps-connection", Needs: []Feature{KeepConnections}, run: restartKeeps},
}

// clusterIP: both families, TCP and UDP, from the client and from the node
// itself, spread over every endpoint.
func clusterIP(h *harness) {
	h.apply(with(service("web"), endpoints(netns.PodID, netns.Pod2ID)...))
	h.step("cluster IPs, both families, TCP and UDP, from the client and the node: every ready endpoint answers")
	for _, ip := range families(clusterV4, clusterV6) {
		for _, network := range h.networks() {
			h.spread(h.topo.Client, network, netip.AddrPortFrom(ip, 80), netns.PodID, netns.Pod2ID)
			h.ask(h.topo.Node, network, netip.AddrPortFrom(ip, 80), netns.PodID, netns.Pod2ID)
		}
	}
}

// nodePort: the node's addresses answer on the node port, loopback does
// not (kube-proxy's default), another port is untouched.
func nodePort(h *harness) {
	svc := nodePortService("web")
	h.apply(with(svc, endpoints(netns.PodID)...))
	h.step("node port 30080 answers on the node's addresses, not on 127.0.0.1; port 30081 is untouched")
	for _, ip := range h.node.IPs {
		for _, network := range h.networks() {
			h.ask(h.topo.Client, network, netip.AddrPortFrom(ip, 30080), netns.PodID)
		}
	}
	h.expectNoPod(h.topo.Node, "tcp", netip.MustParseAddrPort("127.0.0.1:30080"))
	h.expectNoPod(h.topo.Client, "tcp", netip.AddrPortFrom(netns.NodeV4, 30081))
}

// externalIP: the blog's external IPs reach the endpoints.
func externalIP(h *harness) {
	svc := service("web")
	svc.IPs.ExternalIPs = ipset(netns.ServiceV4, netns.ServiceV6)
	h.apply(with(svc, endpoints(netns.PodID, netns.Pod2ID)...))
	h.step("external IPs reach every ready endpoint")
	for _, ip := range families(netns.ServiceV4, netns.ServiceV6) {
		for _, network := range h.networks() {
			h.spread(h.topo.Client, network, netip.AddrPortFrom(ip, 80), netns.PodID, netns.Pod2ID)
		}
	}
}

// headless: a headless service has no cluster IP, but its external IPs
// are proxied (the blog's case).
func headless(h *harness) {
	svc := service("blog")
	svc.IPs = model.ServiceIPs{Headless: true, ExternalIPs: ipset(netns.ServiceV4, netns.ServiceV6)}
	h.apply(with(svc, endpoints(netns.PodID)...))
	h.step("a headless service's external IPs are proxied; it has no cluster IP")
	for _, ip := range families(netns.ServiceV4, netns.ServiceV6) {
		h.ask(h.topo.Client, "tcp", netip.AddrPortFrom(ip, 80), netns.PodID)
	}
	h.expectNoPod(h.topo.Client, "tcp", netip.AddrPortFrom(clusterV4, 80))
}

// Addresses of hosts beyond the node (outsideHost) that single-stack
// services list as external or load-balancer IPs of their other family.
var (
	outsideV4   = netip.MustParseAddr("198.51.100.7")
	outsideV6   = netip.MustParseAddr("2001:db8:77::7")
	outsideLBV4 = netip.MustParseAddr("198.51.100.8")
	outsideLBV6 = netip.MustParseAddr("2001:db8:77::8")
)

// otherFamily: an IPv4-only service listing an IPv6 external and
// load-balancer IP, and an IPv6-only one listing IPv4 ones, serve their
// own family's addresses and leave the others alone (kube-proxy's rule):
// real hosts there stay reachable from the pods and the node.
func otherFamily(h *harness) {
	h.outsideHost(outsideV4, outsideV6, outsideLBV4, outsideLBV6)
	v4 := service("v4")
	v4.Type = "LoadBalancer"
	v4.IPs.ClusterIPs = ipset(clusterV4)
	v4.IPs.ExternalIPs = ipset(netns.ServiceV4, outsideV6)
	v4.IPs.LoadBalancerIPs = ipset(lbV4, outsideLBV6)
	for i, p := range v4.Ports {
		p.NodePort = int32(30090 + i)
	}
	v6 := service("v6")
	v6.Type = "LoadBalancer"
	v6.IPs.ClusterIPs = ipset(clusterV6)
	v6.IPs.ExternalIPs = ipset(netns.ServiceV6, outsideV4)
	v6.IPs.LoadBalancerIPs = ipset(lbV6, outsideLBV4)
	for i, p := range v6.Ports {
		p.NodePort = int32(30092 + i)
	}
	// EndpointSlices hold one family: a single-stack service has only
	// its own family's endpoints.
	var v4eps, v6eps []*model.Endpoint
	for _, e := range endpoints(netns.PodID) {
		if len(e.IPs.V4) > 0 {
			v4eps = append(v4eps, e)
		} else {
			v6eps = append(v6eps, e)
		}
	}
	h.apply(with(v4, v4eps...), with(v6, v6eps...))
	h.step("single-stack services: their own family's addresses are proxied, the other family's are left to the host beyond the node")
	for _, ip := range []netip.Addr{clusterV4, netns.ServiceV4, lbV4, clusterV6, netns.ServiceV6, lbV6} {
		h.ask(h.topo.Pod2, "tcp", netip.AddrPortFrom(ip, 80), netns.PodID)
	}
	for _, ip := range []netip.Addr{outsideV4, outsideV6, outsideLBV4, outsideLBV6} {
		for _, from := range []*netns.NS{h.topo.Pod2, h.topo.Node} {
			for _, network := range h.networks() {
				h.expectOutside(from, network, netip.AddrPortFrom(ip, 80))
			}
		}
	}
}

// undefinedPort: a cluster IP on a port its service does not define is
// refused, from a pod and from the node, and never routed out, although a
// host beyond the node holds the same address (as a host on a network
// that overlaps the service range would).
func undefinedPort(h *harness) {
	h.outsideHost(clusterV4, clusterV6)
	h.apply(with(service("web"), endpoints(netns.PodID, netns.Pod2ID)...))
	h.step("a cluster IP on a port its service does not define is refused, never routed out")
	for _, ip := range families(clusterV4, clusterV6) {
		for _, from := range []*netns.NS{h.topo.Pod2, h.topo.Node} {
			for _, network := range h.networks() {
				h.ask(from, network, netip.AddrPortFrom(ip, 80), netns.PodID, netns.Pod2ID)
				if network == "udp" {
					if _, ok := h.b.Unsupported[RejectUDP]; ok {
						h.expectNoOutside(from, network, netip.AddrPortFrom(ip, 81))
						continue
					}
				}
				h.expectRefused(from, network, netip.AddrPortFrom(ip, 81))
			}
		}
	}
}

// Addresses of the service CIDRs that no service of the kit holds.
var (
	unusedV4 = netip.MustParseAddr("10.96.0.99")
	unusedV6 = netip.MustParseAddr("fd00:10:96::99")
)

// unusedServiceAddress: given the service CIDRs (the default proxier's
// facts), the addresses in them that no service holds are dropped, from
// a pod and from the node, while the services' own addresses work; a
// proxier without them (a specialized proxier beside kube-proxy) leaves
// those addresses alone, so the host beyond the node holding them
// answers.
func unusedServiceAddress(h *harness) {
	h.outsideHost(unusedV4, unusedV6)
	h.apply(with(service("web"), endpoints(netns.PodID, netns.Pod2ID)...))
	h.step("without the service CIDRs, an unused address of the service range is left alone")
	froms := []*netns.NS{h.topo.Pod2, h.topo.Node}
	for _, ip := range families(unusedV4, unusedV6) {
		for _, from := range froms {
			h.expectOutside(from, "tcp", netip.AddrPortFrom(ip, 80))
		}
	}
	h.setCluster(&model.Cluster{ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("fd00:10:96::/108")}})
	h.step("given the service CIDRs, an unused address of them is dropped; the services still answer")
	for i, ip := range families(unusedV4, unusedV6) {
		for _, from := range froms {
			for _, network := range h.networks() {
				h.expectDropped(from, network, netip.AddrPortFrom(ip, 80))
			}
			h.ask(from, "tcp", netip.AddrPortFrom(families(clusterV4, clusterV6)[i], 80), netns.PodID, netns.Pod2ID)
		}
	}
	h.setCluster(nil)
	h.step("service CIDRs removed: the unused address is left alone again")
	for _, ip := range families(unusedV4, unusedV6) {
		for _, from := range froms {
			h.expectOutside(from, "tcp", netip.AddrPortFrom(ip, 80))
		}
	}
}

// sourceRanges: a load-balancer IP answers clients inside its source
// ranges and drops the others.
func sourceRanges(h *harness) {
	svc := service("lb")
	svc.Type = "LoadBalancer"
	for i, p := range svc.Ports {
		p.NodePort = int32(30090 + i)
	}
	svc.IPs.LoadBalancerIPs = ipset(lbV4, lbV6)
	svc.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24"), netip.MustParsePrefix("fd00::/64")} // the client's links
	h.apply(with(svc, endpoints(netns.PodID)...))
	h.step("a load-balancer IP answers a client inside its source ranges")
	for _, ip := range families(lbV4, lbV6) {
		h.ask(h.topo.Client, "tcp", netip.AddrPortFrom(ip, 80), netns.PodID)
	}
	other := *svc
	other.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("2001:db8:ffff::/48")}
	h.apply(with(&other, endpoints(netns.PodID)...))
	h.step("a load-balancer IP drops a client outside its source ranges")
	for _, ip := range families(lbV4, lbV6) {
		h.expectDropped(h.topo.Client, "tcp", netip.AddrPortFrom(ip, 80))
	}
}

// sessionAffinity: a client sticks to one endpoint, and the stickiness
// expires after the timeout without traffic. Stickiness is checked with a
// long timeout, so that a slow machine cannot let it expire in the middle
// of a burst. Expiry is checked with a short one, one request per round,
// rounds 1.5 s apart, until a second endpoint answers: once the affinity
// has expired, each round goes to the other endpoint with probability
// 1/2, so a working backend passes in a few rounds, and fails only if the
// sure−1 rounds after the first all chose the first's endpoint again:
// 2^−20 ≈ 9.5e-7.
func sessionAffinity(h *harness) {
	svc := service("web")
	svc.ClientIPAffinity = &model.ClientIPAffinity{TimeoutSeconds: 30}
	h.apply(with(svc, endpoints(netns.PodID, netns.Pod2ID)...))
	for _, ip := range families(clusterV4, clusterV6) {
		for _, network := range h.networks() {
			h.step("ClientIP affinity (30 s): %s requests to %s all reach the endpoint of the first", network, ip)
			dst := netip.AddrPortFrom(ip, 80)
			if first := h.ask(h.topo.Client, network, dst, netns.PodID, netns.Pod2ID).Server; first != "" {
				h.askAll(8, h.topo.Client, network, dst, netns.AskOptions{}, first)
			}
		}
	}
	short := *svc
	short.ClientIPAffinity = &model.ClientIPAffinity{TimeoutSeconds: 1}
	h.apply(with(&short, endpoints(netns.PodID, netns.Pod2ID)...))
	h.step("ClientIP affinity (1 s) expires: requests 1.5 s apart reach both endpoints")
	seen := map[string]int{}
	for round := range sure {
		if round > 0 {
			time.Sleep(1500 * time.Millisecond) // the affinity expires
		}
		a, ok := h.askAll(1, h.topo.Client, "tcp", netip.AddrPortFrom(clusterV4, 80), netns.AskOptions{}, netns.PodID, netns.Pod2ID)
		if !ok {
			return
		}
		if seen[a.Server]++; len(seen) == 2 {
			return
		}
	}
	h.fail("%d requests more than the 1 s timeout apart all went to %s: affinity never expired (were it expiring, the chance of this would be 2^-%d)",
		sure, counts(seen), sure-1)
}

// externalLocal: externalTrafficPolicy Local sends external traffic only
// to local endpoints, drops it without one, while pods and the node
// itself still reach every endpoint (kube-proxy's short-circuits), and
// cluster IPs are not affected.
func externalLocal(h *harness) {
	svc := nodePortService("web")
	svc.ExternalTrafficToLocal = true
	svc.IPs.ExternalIPs = ipset(netns.ServiceV4, netns.ServiceV6)
	local := endpoints(netns.PodID)
	other := remote(endpoints(netns.Pod2ID))
	h.apply(with(svc, append(local, other...)...))
	h.step("externalTrafficPolicy Local: external traffic reaches the local endpoint only; the cluster IP reaches every endpoint")
	for _, ip := range append(h.node.IPs, netns.ServiceV4, netns.ServiceV6) {
		port := uint16(80)
		if ip == netns.NodeV4 || ip == netns.NodeV6 {
			port = 30080
		}
		h.askAll(sure, h.topo.Client, "tcp", netip.AddrPortFrom(ip, port), netns.AskOptions{}, netns.PodID)
	}
	h.spread(h.topo.Client, "tcp", netip.AddrPortFrom(clusterV4, 80), netns.PodID, netns.Pod2ID)

	// No local endpoint: external traffic is dropped; the node itself and
	// the pods reach the remote endpoint.
	h.apply(with(svc, other...))
	h.step("externalTrafficPolicy Local without a local endpoint: external traffic dropped; the node and the pods still reach the remote endpoint")
	for _, ip := range append(h.node.IPs, netns.ServiceV4, netns.ServiceV6) {
		port := uint16(80)
		if ip == netns.NodeV4 || ip == netns.NodeV6 {
			port = 30080
		}
		h.expectDropped(h.topo.Client, "tcp", netip.AddrPortFrom(ip, port))
	}
	h.ask(h.topo.Node, "tcp", netip.AddrPortFrom(netns.ServiceV4, 80), netns.Pod2ID)
	h.ask(h.topo.Pod, "tcp", netip.AddrPortFrom(netns.ServiceV4, 80), netns.Pod2ID)
	h.ask(h.topo.Client, "tcp", netip.AddrPortFrom(clusterV4, 80), netns.Pod2ID)
}

// internalLocal: internalTrafficPolicy Local sends cluster-IP traffic only
// to local endpoints, and drops it without one.
func internalLocal(h *harness) {
	svc := service("web")
	svc.InternalTrafficToLocal = true
	h.apply(with(svc, append(endpoints(netns.PodID), remote(endpoints(netns.Pod2ID))...)...))
	h.step("internalTrafficPolicy Local: cluster-IP traffic reaches the local endpoint only")
	for _, ip := range families(clusterV4, clusterV6) {
		h.askAll(sure, h.topo.Client, "tcp", netip.AddrPortFrom(ip, 80), netns.AskOptions{}, netns.PodID)
	}
	h.apply(with(svc, remote(endpoints(netns.Pod2ID))...))
	h.step("internalTrafficPolicy Local without a local endpoint: cluster-IP traffic dropped")
	for _, ip := range families(clusterV4, clusterV6) {
		h.expectDropped(h.topo.Client, "tcp", netip.AddrPortFrom(ip, 80))
	}
}

// reject: a service without endpoints refuses connections (TCP reset,
// ICMP port unreachable for UDP) rather than dropping them.
func reject(h *harness) {
	h.apply(with(service("web")))
	h.step("a service without endpoints refuses: TCP reset, ICMP port unreachable for UDP")
	for _, ip := range families(clusterV4, clusterV6) {
		h.expectRefused(h.topo.Client, "tcp", netip.AddrPortFrom(ip, 80))
		if reason, ok := h.b.Unsupported[RejectUDP]; ok {
			h.t.Logf("UDP refusal not checked: the backend declares %s unsupported (%s)", RejectUDP, reason)
		} else if contains(h.networks(), "udp") {
			h.expectRefused(h.topo.Client, "udp", netip.AddrPortFrom(ip, 80))
		}
	}
}

// terminating: without ready endpoints, serving terminating ones are used;
// with one ready, only it.
func terminating(h *harness) {
	term := func(eps []*model.Endpoint) []*model.Endpoint {
		for _, e := range eps {
			e.Ready, e.Serving, e.Terminating = false, true, true
		}
		return eps
	}
	svc := service("web")
	h.apply(with(svc, term(endpoints(netns.PodID, netns.Pod2ID))...))
	h.step("no ready endpoint: the serving terminating ones are used")
	h.spread(h.topo.Client, "tcp", netip.AddrPortFrom(clusterV4, 80), netns.PodID, netns.Pod2ID)
	h.apply(with(svc, append(endpoints(netns.PodID), term(endpoints(netns.Pod2ID))...)...))
	h.step("one ready endpoint: only it is used, not the terminating one")
	h.askAll(sure, h.topo.Client, "tcp", netip.AddrPortFrom(clusterV4, 80), netns.AskOptions{}, netns.PodID)
}

// topology: when every ready endpoint has hints and some name this node's
// zone, only those are used.
func topology(h *harness) {
	eps := endpoints(netns.PodID, netns.Pod2ID)
	for _, e := range eps {
		if e.IPs.All()[0] == netns.PodV4.String() || e.IPs.All()[0] == netns.PodV6.String() {
			e.Hints = &model.Hints{Zones: []string{"zone-a"}, SameZone: true}
		} else {
			e.Hints = &model.Hints{Zones: []string{"zone-b"}}
		}
	}
	h.apply(with(service("web"), eps...))
	h.step("topology hints: only the endpoint hinted for this node's zone is used")
	for _, ip := range families(clusterV4, clusterV6) {
		h.askAll(sure, h.topo.Client, "tcp", netip.AddrPortFrom(ip, 80), netns.AskOptions{}, netns.PodID)
	}
}

// clientAddress: the endpoint sees a pod's own address on cluster IPs,
// and the client's on node ports with the Local policy.
func clientAddress(h *harness) {
	h.apply(with(service("web"), endpoints(netns.PodID)...))
	h.step("a pod reaching a cluster IP is seen with its own address")
	for _, ip := range families(clusterV4, clusterV6) {
		if a := h.ask(h.topo.Pod2, "tcp", netip.AddrPortFrom(ip, 80), netns.PodID); a.Server != "" && a.Remote.Addr() != podAddr(netns.Pod2ID, ip) {
			h.fail("cluster IP %s from pod2: the pod saw %s, want pod2's %s", ip, a.Remote, podAddr(netns.Pod2ID, ip))
		}
	}
	local := nodePortService("web")
	local.ExternalTrafficToLocal = true
	h.apply(with(local, endpoints(netns.PodID)...))
	h.step("an outside client on a node port with externalTrafficPolicy Local is seen with its own address")
	for _, c := range []struct{ dst, client netip.Addr }{{netns.NodeV4, netns.ClientV4}, {netns.NodeV6, netns.ClientV6}} {
		if a := h.ask(h.topo.Client, "tcp", netip.AddrPortFrom(c.dst, 30080), netns.PodID); a.Server != "" && a.Remote.Addr() != c.client {
			h.fail("node port %s with the Local policy: the pod saw %s, want the client's %s", c.dst, a.Remote, c.client)
		}
	}
}

// nodeSide is the node's address on the pods' links, per family: what a
// pod sees of masqueraded traffic.
func nodeSide(like netip.Addr) netip.Addr {
	if like.Is4() {
		return netns.GatewayV4
	}
	return netns.GatewayV6
}

// masquerade: off-cluster traffic to cluster IPs and external traffic with
// the Cluster policy reach the endpoint from the node, and a pod reaching
// itself through its service does not see its own address (hairpin).
func masquerade(h *harness) {
	svc := nodePortService("web")
	h.apply(with(svc, endpoints(netns.PodID)...))
	h.step("off-cluster clients of cluster IPs and node ports are masqueraded; a pod reaching itself through its service is too (hairpin)")
	for _, dst := range []netip.AddrPort{
		netip.AddrPortFrom(netns.NodeV4, 30080), netip.AddrPortFrom(netns.NodeV6, 30080),
		netip.AddrPortFrom(clusterV4, 80), netip.AddrPortFrom(clusterV6, 80),
	} {
		if a := h.ask(h.topo.Client, "tcp", dst, netns.PodID); a.Server != "" && a.Remote.Addr() != nodeSide(dst.Addr()) {
			h.fail("%s from the off-cluster client: the pod saw %s, want the node's %s", dst, a.Remote, nodeSide(dst.Addr()))
		}
	}
	for _, ip := range families(clusterV4, clusterV6) {
		if a := h.ask(h.topo.Pod, "tcp", netip.AddrPortFrom(ip, 80), netns.PodID); a.Remote.Addr() == podAddr(netns.PodID, ip) {
			h.fail("hairpin via %s: the pod saw its own address %s, want the node's", ip, a.Remote)
		}
	}
}

// endpointChange: new connections follow an endpoint change.
func endpointChange(h *harness) {
	svc := service("web")
	h.apply(with(svc, endpoints(netns.PodID)...))
	h.step("before the change, the first endpoint answers")
	h.ask(h.topo.Client, "tcp", netip.AddrPortFrom(clusterV4, 80), netns.PodID)
	h.apply(with(svc, endpoints(netns.Pod2ID)...))
	h.step("endpoints changed: new connections reach the new endpoint only")
	for _, ip := range families(clusterV4, clusterV6) {
		for _, network := range h.networks() {
			h.askAll(5, h.topo.Client, network, netip.AddrPortFrom(ip, 80), netns.AskOptions{}, netns.Pod2ID)
		}
	}
}

// staleUDP: a UDP client keeps sending from one source port to a cluster
// IP while the endpoint that answered it is removed: its next datagrams
// must reach the remaining endpoint. UDP has no teardown: a kernel backend
// must delete the removed endpoint's conntrack entries (as kube-proxy
// does; package backends/conntrack), which otherwise keep sending the flow
// to the old endpoint (still alive here, as a terminating pod that keeps
// serving until it exits) until they expire; a userspace proxy must drop
// its session to it. Every request is resent while it gets no answer (up
// to udpAttempts datagrams), as a client resends: with kpng's userspace
// backend, the first IPv6 datagram sent in a new topology goes unanswered
// about one run in three, whatever its source port (the first packets of
// other scenarios are TCP, whose SYN is resent). An answer from the
// removed endpoint is never resent: it fails the check at once.
func staleUDP(h *harness) {
	svc := service("web")
	all := endpoints(netns.PodID, netns.Pod2ID)
	h.apply(with(svc, all...))
	fams := families(clusterV4, clusterV6)
	const port = 40053           // the client's source port
	removed := map[string]bool{} // the endpoints' addresses
	first := make([]string, len(fams))
	for i, ip := range fams {
		h.step("a UDP flow to %s from source port %d is answered (a datagram, resent up to twice, as a client would)", ip, port)
		a, wrong := h.tryResending(h.topo.Client, netip.AddrPortFrom(ip, 80), netns.AskOptions{LocalPort: port}, []string{netns.PodID, netns.Pod2ID})
		if wrong != "" {
			h.fail("udp %s:80 from %s (source port %d), up to %d datagrams: %s", ip, h.topo.Client, port, udpAttempts, wrong)
			return
		}
		first[i] = a.Server
		removed[podAddr(a.Server, ip).String()] = true
	}
	var remaining []*model.Endpoint
	for _, e := range all {
		if !removed[e.IPs.All()[0]] {
			remaining = append(remaining, e)
		}
	}
	h.apply(with(svc, remaining...))
	for i, ip := range fams {
		other := netns.PodID
		if first[i] == netns.PodID {
			other = netns.Pod2ID
		}
		h.step("endpoint %s (%s) removed: the UDP flow to %s from source port %d, which it answered, now reaches %s (the backend must end the flow: delete its conntrack entries, or a proxy's session)",
			podAddr(first[i], ip), first[i], ip, port, other)
		// Each request is resent while unanswered (the first datagram to
		// the other pod can be lost as the first one of the flow could),
		// never when answered by the removed endpoint: that is the failure.
		for n := range 3 {
			if _, wrong := h.tryResending(h.topo.Client, netip.AddrPortFrom(ip, 80), netns.AskOptions{LocalPort: port}, []string{other}); wrong != "" {
				h.fail("udp %s:80 from %s (source port %d), request %d of 3 (up to %d datagrams): %s", ip, h.topo.Client, port, n+1, udpAttempts, wrong)
				break
			}
		}
	}
}

// portChange: a service port changed answers on the new port only.
func portChange(h *harness) {
	svc := service("web")
	h.apply(with(svc, endpoints(netns.PodID)...))
	moved := *svc
	moved.Ports = []*model.PortMapping{{Name: "tcp", Protocol: model.TCP, Port: 81, TargetPort: 6000}}
	h.apply(with(&moved, endpoints(netns.PodID)...))
	h.step("the changed port 81 answers, the old port 80 reaches no pod")
	for _, ip := range families(clusterV4, clusterV6) {
		h.ask(h.topo.Client, "tcp", netip.AddrPortFrom(ip, 81), netns.PodID)
		h.expectNoPod(h.topo.Client, "tcp", netip.AddrPortFrom(ip, 80))
	}
}

// serviceDeleted: a deleted service's addresses no longer reach its pods.
func serviceDeleted(h *harness) {
	svc := service("web")
	svc.IPs.ExternalIPs = ipset(netns.ServiceV4, netns.ServiceV6)
	h.apply(with(svc, endpoints(netns.PodID)...))
	h.step("before the deletion, the service answers")
	h.ask(h.topo.Client, "tcp", netip.AddrPortFrom(clusterV4, 80), netns.PodID)
	h.apply()
	h.step("service deleted: its addresses reach no pod")
	for _, ip := range []netip.Addr{clusterV4, clusterV6, netns.ServiceV4, netns.ServiceV6} {
		h.expectNoPod(h.topo.Client, "tcp", netip.AddrPortFrom(ip, 80))
	}
}

// restartKeeps: an open connection keeps carrying data across a restart
// of the backend (a new process given the same state).
func restartKeeps(h *harness) {
	h.topo.Pod.ServeEcho(h.t, 9000)
	echo := service("echo")
	echo.Ports = []*model.PortMapping{{Protocol: model.TCP, Port: 90, TargetPort: 9000}}
	h.apply(with(echo, endpoints(netns.PodID)...))
	h.step("an open TCP connection to the cluster IP carries data")
	var c net.Conn
	if err := h.topo.Client.Do(func() (err error) {
		c, err = net.DialTimeout("tcp", netip.AddrPortFrom(clusterV4, 90).String(), 2*time.Second)
		return err
	}); err != nil {
		h.fail("connect: %v", err)
		h.t.FailNow()
	}
	defer c.Close()
	r := bufio.NewReader(c)
	roundTrip := func(msg string) {
		h.t.Helper()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write([]byte(msg + "\n")); err != nil {
			h.fail("%s: write: %v", msg, err)
			h.t.FailNow()
		}
		if got, err := r.ReadString('\n'); err != nil || got != "echo "+msg+"\n" {
			h.fail("%s: read %q, %v; want %q", msg, got, err, "echo "+msg+"\n")
			h.t.FailNow()
		}
	}
	roundTrip("before")
	h.restart()
	h.step("the open TCP connection carries data across a restart of the backend (a second Start, given the same state)")
	roundTrip("after the restart")
	h.apply(with(echo, endpoints(netns.PodID, netns.Pod2ID)...))
	h.step("the open TCP connection carries data after an endpoint was added")
	roundTrip("after an endpoint was added")
}

// nodePortService returns service(name) of type NodePort, its ports on
// node port 30080.
func nodePortService(name string) *model.Service {
	svc := service(name)
	svc.Type = "NodePort"
	for _, p := range svc.Ports {
		p.NodePort = 30080
	}
	return svc
}
