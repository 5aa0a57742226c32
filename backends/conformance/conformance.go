//go:build linux

package conformance

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/localsink/sinktest"
	"sigs.k8s.io/kpng/model"
)

// Feature is optional behaviour: a backend that lacks one declares it in
// Backend.Unsupported, and the scenarios needing it are reported, not run.
type Feature string

// The optional features.
const (
	// UDP: UDP services are proxied.
	UDP Feature = "udp"
	// SessionAffinity: sessionAffinity ClientIP sticks and expires.
	SessionAffinity Feature = "session-affinity"
	// ClientAddress: an endpoint sees the client's own address where
	// kube-proxy keeps it (a pod's traffic to a cluster IP, external
	// traffic with the Local policy). A userspace proxy cannot.
	ClientAddress Feature = "client-address"
	// Masquerade: off-cluster traffic to cluster IPs, external traffic
	// with the Cluster policy, and a pod reaching itself through its
	// service reach the endpoint from the node's address.
	Masquerade Feature = "masquerade"
	// RejectUDP: UDP to a service without endpoints is refused (ICMP port
	// unreachable), not silently dropped.
	RejectUDP Feature = "reject-udp"
	// SourceRanges: loadBalancerSourceRanges restrict the clients of
	// load-balancer IPs.
	SourceRanges Feature = "load-balancer-source-ranges"
	// TopologyHints: endpoints hinted for another zone are not used.
	TopologyHints Feature = "topology-hints"
	// KeepConnections: a restarted backend keeps the open connections.
	KeepConnections Feature = "restart-keeps-connections"
)

// Rules every proxier must follow, as kube-proxy does. They are features
// only so that a backend still being fixed can declare them unsupported
// (with the reason and what it lacks), as any other.
const (
	// OtherFamilyAddresses: the external and load-balancer IPs of a
	// family in which a service has no cluster IP are left alone (a real
	// host there stays reachable), not claimed and rejected.
	OtherFamilyAddresses Feature = "other-family-addresses-ignored"
	// UndefinedPorts: a new connection to a cluster IP on a port its
	// service does not define is refused (TCP reset or ICMP unreachable),
	// never routed out: cluster IPs are virtual.
	UndefinedPorts Feature = "cluster-ip-undefined-ports-rejected"
	// ServiceCIDRs: given the cluster's service CIDRs (model.Cluster,
	// which only the default proxier gets, through
	// localsink.ClusterSink), new connections to their addresses that no
	// service holds are dropped, never routed out; without them, those
	// addresses are left alone.
	ServiceCIDRs Feature = "service-cidrs-dropped"
	// StaleUDPFlows: when an endpoint is removed, a UDP client that keeps
	// sending from the same source port reaches a remaining endpoint with
	// its next datagram. UDP has no teardown: a kernel backend must delete
	// the conntrack entries of the removed endpoint, as kube-proxy does
	// (package sigs.k8s.io/kpng/backends/conntrack does it for nft and
	// iptables, and for an outside backend too); a userspace proxy must
	// drop its sessions to it.
	StaleUDPFlows Feature = "udp-stale-flows-cleared"
)

// Node is the node a backend programs: its network namespace and what a
// backend may need to know of it.
type Node struct {
	// NetNS is the path of the node's network namespace (/run/netns/…).
	NetNS string
	// Name is the node's name: endpoints on it are Local.
	Name string
	// IPs are the node's addresses on the link to the client, one per
	// family, where node ports must answer.
	IPs []netip.Addr
	// PodCIDRs are the pods' networks (kube-proxy's --cluster-cidr): the
	// client outside them is off-cluster, the pods are not.
	PodCIDRs []netip.Prefix
}

// Backend is a backend under test.
type Backend struct {
	// Name names the backend in messages.
	Name string
	// Start builds the backend for node and returns its sink, which the
	// kit feeds. The restart scenario calls it a second time, as a
	// restarted process would: the first sink is then dropped without
	// any call. Remove what the backend created with t.Cleanup.
	Start func(t testing.TB, node Node) (localsink.Sink, error)
	// Unsupported are the features the backend lacks, each with the
	// reason (listed in the backend's docs). The scenarios needing one
	// are skipped (t.Skip) with the reason.
	Unsupported map[Feature]string
	// NetNSPrefix starts the names of the kit's network namespaces;
	// empty: "kpngt-". It is lowercase words of letters, each followed
	// by a dash ("kpngt-ci-"). Each test process removes the namespaces
	// of its prefix left by processes that no longer run (killed before
	// their cleanups), never those of another prefix: on a host shared
	// with other users, give your runs a prefix of your own.
	NetNSPrefix string
}

// Scenario is one behaviour of the kit.
type Scenario struct {
	// Name is the subtest's name.
	Name string
	// Needs are the optional features it needs.
	Needs []Feature
	run   func(h *harness)
}

// Scenarios returns the kit's scenarios, in the order Run runs them.
func Scenarios() []Scenario { return scenarios }

// Run runs every scenario against b, each in a subtest (named as the
// scenario) with a topology of its own. A scenario needing a feature that
// b declares unsupported is skipped, with b's reason. A failed check is
// reported once, with what it checked and, at the first failure after
// each change of state, the state the backend was given (services,
// endpoints and their conditions, the node).
func Run(t *testing.T, b Backend) {
	netns.RequirePrivileged(t)
	if b.Start == nil {
		t.Fatalf("backend %q: Start is nil", b.Name)
	}
	if b.NetNSPrefix == "" {
		b.NetNSPrefix = netns.Prefix
	}
	if err := netns.CheckPrefix(b.NetNSPrefix); err != nil {
		t.Fatalf("backend %q: NetNSPrefix: %v", b.Name, err)
	}
	for _, sc := range scenarios {
		t.Run(sc.Name, func(t *testing.T) {
			for _, f := range sc.Needs {
				if why, ok := b.Unsupported[f]; ok {
					t.Skipf("backend %s declares %s unsupported: %s", b.Name, f, why)
				}
			}
			sc.run(newHarness(t, b))
		})
	}
}

// harness is one scenario's world: the topology, the backend, its feeder.
type harness struct {
	t       *testing.T
	b       Backend
	topo    *netns.BlogTopology
	node    Node
	feeder  *localsink.Feeder
	checker *sinktest.Checker
	state   []*model.ServiceEndpoints
	cluster *model.Cluster
	// stateShown: a failure since the last change of state printed it.
	stateShown bool
	// checking is what the scenario checks now (h.step), for messages.
	checking string
}

// nodeName is the node's name in the kit's states.
const nodeName = "node-a"

func newHarness(t *testing.T, b Backend) *harness {
	h := &harness{t: t, b: b, topo: netns.BlogWithPrefix(t, b.NetNSPrefix)}
	// The node rate-limits the ICMP errors it sends per destination
	// (ICMPv6 to a pod's /128 route: one per 100 ms), which would make a
	// refused datagram look dropped now and then: the kit checks the
	// proxier's verdicts, not the kernel's rate limits.
	h.topo.Node.Sysctl("net.ipv4.icmp_ratelimit", "0")
	h.topo.Node.Sysctl("net.ipv6.icmp.ratelimit", "0")
	h.node = Node{
		NetNS: h.topo.Node.Path(), Name: nodeName, IPs: []netip.Addr{netns.NodeV4, netns.NodeV6},
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("11.0.2.0/24"), netip.MustParsePrefix("1100::200/120")},
	}
	h.start()
	return h
}

// start starts the backend and a feeder for it.
func (h *harness) start() {
	h.t.Helper()
	sink, err := h.b.Start(h.t, h.node)
	if err != nil {
		h.t.Fatalf("start backend %s: %v", h.b.Name, err)
	}
	checker := sinktest.NewChecker(sink)
	feeder := localsink.NewFeeder(checker, localsink.FeederOptions{NoRetry: true})
	h.t.Cleanup(func() {
		feeder.Close()
		if err := checker.Err(); err != nil {
			h.t.Errorf("the kit broke the Sink contract (a kit bug):\n%v", err)
		}
	})
	h.feeder, h.checker = feeder, checker
}

// apply gives the backend a whole state and fails the test unless it
// applies it.
func (h *harness) apply(items ...*model.ServiceEndpoints) {
	h.t.Helper()
	h.state, h.stateShown = items, false
	h.feeder.SetAll(items)
	if err := h.feeder.Sync(); err != nil {
		h.t.Fatalf("backend %s: Sync: %v", h.b.Name, err)
	}
}

// setCluster gives the backend cluster-level facts (nil: none), with the
// current state, and fails the test unless it applies them.
func (h *harness) setCluster(c *model.Cluster) {
	h.t.Helper()
	h.cluster = c
	h.feeder.SetCluster(c)
	h.apply(h.state...)
}

// restart starts the backend again, as a restarted process, with the
// current state.
func (h *harness) restart() {
	h.t.Helper()
	h.start()
	h.apply(h.state...)
}

// Addresses of the kit's services: the client routes everything outside
// its link through the node (netns.Blog), so they need no route.
var (
	clusterV4 = netip.MustParseAddr("10.96.0.10")
	clusterV6 = netip.MustParseAddr("fd00:10:96::10")
	lbV4      = netip.MustParseAddr("192.0.2.10")
	lbV6      = netip.MustParseAddr("2001:db8::10")
)

// families are the pairs of addresses of a scenario, IPv4 first.
func families(v4, v6 netip.Addr) []netip.Addr { return []netip.Addr{v4, v6} }

// ipset builds an IPSet of addresses.
func ipset(addrs ...netip.Addr) model.IPSet {
	s := make([]string, len(addrs))
	for i, a := range addrs {
		s[i] = a.String()
	}
	set, bad := model.NewIPSet(s...)
	if len(bad) > 0 {
		panic(fmt.Sprintf("conformance: bad addresses %v", bad))
	}
	return set
}

// service returns a dual-stack ClusterIP service default/name on port 80
// to the pods' 6000, TCP and UDP.
func service(name string) *model.Service {
	return &model.Service{
		Namespace: "default", Name: name, Type: "ClusterIP",
		IPs: model.ServiceIPs{ClusterIPs: ipset(clusterV4, clusterV6)},
		Ports: []*model.PortMapping{
			{Name: "tcp", Protocol: model.TCP, Port: 80, TargetPort: 6000},
			{Name: "udp", Protocol: model.UDP, Port: 80, TargetPort: 6000},
		},
	}
}

// pods are the kit's pods: identity → addresses.
var pods = map[string][2]netip.Addr{
	netns.PodID:  {netns.PodV4, netns.PodV6},
	netns.Pod2ID: {netns.Pod2V4, netns.Pod2V6},
}

// podAddr returns the address of pod id in the family of like.
func podAddr(id string, like netip.Addr) netip.Addr {
	if like.Is4() {
		return pods[id][0]
	}
	return pods[id][1]
}

// endpoints returns ready endpoints of pods ids, both families, on this
// node (Local).
func endpoints(ids ...string) []*model.Endpoint {
	var eps []*model.Endpoint
	for _, id := range ids {
		for _, a := range pods[id] {
			eps = append(eps, &model.Endpoint{IPs: ipset(a), Ready: true, Serving: true, Local: true, NodeName: nodeName})
		}
	}
	slices.SortFunc(eps, model.CompareEndpoints)
	return eps
}

// remote returns eps as if they ran on another node.
func remote(eps []*model.Endpoint) []*model.Endpoint {
	out := make([]*model.Endpoint, len(eps))
	for i, e := range eps {
		c := *e
		c.Local, c.NodeName = false, "node-b"
		out[i] = &c
	}
	return out
}

// with returns svc with its endpoints.
func with(svc *model.Service, eps ...*model.Endpoint) *model.ServiceEndpoints {
	slices.SortFunc(eps, model.CompareEndpoints)
	return &model.ServiceEndpoints{Service: svc, Endpoints: eps}
}
