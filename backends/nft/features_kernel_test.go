//go:build linux

package nft

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

// Addresses of the feature tests. The client routes everything outside its
// link via the node (netns.Blog), so the load-balancer IPs need no route.
var (
	lbV4 = netip.MustParseAddr("192.0.2.10")
	lbV6 = netip.MustParseAddr("2001:db8::10")
)

// newOptionsSink is newTestSink with rule options.
func newOptionsSink(t *testing.T, b *netns.BlogTopology, name string, opts Options) *testSink {
	t.Helper()
	return newConfigSink(t, b, Config{ServiceProxyName: name, Options: opts}, localsink.FeederOptions{NoRetry: true})
}

// ask sends one TCP or UDP request and fails the test unless server
// answers; it returns the answer.
func ask(t *testing.T, from *netns.NS, network string, dst netip.AddrPort, server string) netns.Answer {
	t.Helper()
	a, err := from.Ask(network, dst, netns.AskOptions{})
	if err != nil {
		t.Errorf("%v, want an answer from %s", err, server)
		return a
	}
	if a.Server != server {
		t.Errorf("%s %s from %s: answered by %s, want %s", network, dst, from, a.Server, server)
	}
	return a
}

// expectTimeout checks that a request gets no answer at all (dropped, not
// refused).
func expectTimeout(t *testing.T, from *netns.NS, network string, dst netip.AddrPort) {
	t.Helper()
	a, err := from.Ask(network, dst, netns.AskOptions{Timeout: 400 * time.Millisecond})
	if err == nil || isRefused(err) {
		t.Errorf("%s %s from %s: answer %v, error %v; want no answer (dropped)", network, dst, from, a, err)
	}
}

// localEndpoints returns the endpoints of pods ids, marked Local (as
// podEndpoints does).
func localEndpoints(ids ...string) []*model.Endpoint { return podEndpoints(ids...) }

// remoteEndpoints returns the endpoints of pods ids as if they ran on
// another node.
func remoteEndpoints(ids ...string) []*model.Endpoint {
	eps := podEndpoints(ids...)
	for _, e := range eps {
		e.Local = false
		e.NodeName = "other-node"
	}
	return eps
}

// TestKernelNodePortAndMasquerade checks node ports on the node's
// addresses (both families, TCP and UDP), that off-node traffic to node
// ports and external IPs with the Cluster policy is masqueraded (the pod
// sees the node's address), that a pod reaching itself through its
// service works (hairpin, masqueraded), and that NodePortAddresses limits
// the addresses node ports answer on (per family, as kube-proxy: a family
// without a prefix is not limited).
func TestKernelNodePortAndMasquerade(t *testing.T) {
	b := kernelTopology(t)
	s := newOptionsSink(t, b, "np", Options{})
	web := svc("default", "web", ipset(webV4.String(), webV6.String()),
		&model.PortMapping{Protocol: model.TCP, Port: 80, TargetPort: 6000, NodePort: 30080},
		&model.PortMapping{Protocol: model.UDP, Port: 80, TargetPort: 6000, NodePort: 30080})
	web.Type = "NodePort"
	web.IPs.ExternalIPs = ipset(netns.ServiceV4.String(), netns.ServiceV6.String())
	s.setAll(&model.ServiceEndpoints{Service: web, Endpoints: localEndpoints(netns.PodID)})
	s.sync()

	nodeSide := map[netip.Addr]netip.Addr{netns.NodeV4: netns.GatewayV4, netns.NodeV6: netns.GatewayV6}
	for _, node := range []netip.Addr{netns.NodeV4, netns.NodeV6} {
		for _, network := range []string{"tcp", "udp"} {
			a := ask(t, b.Client, network, netip.AddrPortFrom(node, 30080), netns.PodID)
			if a.Remote.Addr() != nodeSide[node] {
				t.Errorf("node port %s %s: the pod saw %s, want the node's %s (masqueraded)", network, node, a.Remote, nodeSide[node])
			}
		}
	}
	for _, ext := range []netip.Addr{netns.ServiceV4, netns.ServiceV6} {
		a := ask(t, b.Client, "tcp", netip.AddrPortFrom(ext, 80), netns.PodID)
		if want := nodeSide[map[bool]netip.Addr{true: netns.NodeV4, false: netns.NodeV6}[ext.Is4()]]; a.Remote.Addr() != want {
			t.Errorf("external IP %s, Cluster policy: the pod saw %s, want %s (masqueraded)", ext, a.Remote, want)
		}
	}
	// Cluster IPs from the client: no cluster CIDR given, not masqueraded.
	if a := ask(t, b.Client, "tcp", netip.AddrPortFrom(webV4, 80), netns.PodID); a.Remote.Addr() != netns.ClientV4 {
		t.Errorf("cluster IP without cluster CIDRs: the pod saw %s, want the client's address", a.Remote)
	}
	// Hairpin: the pod reaches itself through its service.
	for _, cip := range []netip.Addr{webV4, webV6} {
		a := ask(t, b.Pod, "tcp", netip.AddrPortFrom(cip, 80), netns.PodID)
		if want := podAddr(netns.PodID, cip); a.Remote.Addr() == want {
			t.Errorf("hairpin via %s: the pod saw its own address %s, want the node's", cip, a.Remote)
		}
	}
	// A port that is no node port is untouched: the node itself has no
	// server there, so the connection is refused by its stack.
	if _, err := b.Client.Ask("tcp", netip.AddrPortFrom(netns.NodeV4, 30081), netns.AskOptions{Timeout: 400 * time.Millisecond}); err == nil || !isRefused(err) {
		t.Errorf("port 30081 of the node: %v, want refused by the node", err)
	}

	// No endpoints: node ports are rejected.
	for _, e := range localEndpoints(netns.PodID) {
		s.deleteEndpoint(web.Key(), e.Key())
	}
	s.sync()
	if _, err := b.Client.Ask("tcp", netip.AddrPortFrom(netns.NodeV4, 30080), netns.AskOptions{Timeout: time.Second}); err == nil || !isRefused(err) {
		t.Errorf("node port without endpoints: %v, want refused", err)
	}
	// From the node itself too, to its own address (the output hook, then
	// the input hook through the loopback, where the node-port check is):
	// refused by the rules even with a server of the node on the port.
	b.Node.Serve("node", []netip.Addr{netns.NodeV4}, []uint16{30080})
	if a, err := b.Node.Ask("tcp", netip.AddrPortFrom(netns.NodeV4, 30080), netns.AskOptions{Timeout: time.Second}); err == nil || !isRefused(err) {
		t.Errorf("node port without endpoints, from the node: %v, %v; want refused by the rules", a, err)
	}

	// NodePortAddresses: node ports only on the addresses of
	// 10.0.0.0/24 and fd00:1::/64 (which does not hold the node's).
	limited := newOptionsSink(t, b, "np2", Options{NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24"), netip.MustParsePrefix("fd00:1::/64")}})
	web2 := svc("default", "web2", ipset("10.96.0.12", "fd00:10:96::12"), &model.PortMapping{Protocol: model.TCP, Port: 80, TargetPort: 6000, NodePort: 30090})
	web2.Type = "NodePort"
	limited.setAll(&model.ServiceEndpoints{Service: web2, Endpoints: localEndpoints(netns.Pod2ID)})
	limited.sync()
	ask(t, b.Client, "tcp", netip.AddrPortFrom(netns.NodeV4, 30090), netns.Pod2ID)
	if a, err := b.Client.Ask("tcp", netip.AddrPortFrom(netns.NodeV6, 30090), netns.AskOptions{Timeout: 400 * time.Millisecond}); err == nil {
		t.Errorf("node port on %s, outside NodePortAddresses: answered %v", netns.NodeV6, a)
	}
	// Without endpoints, the node port is rejected on the addresses of
	// NodePortAddresses only: a server of the node on the port answers on
	// the others.
	for _, e := range localEndpoints(netns.Pod2ID) {
		limited.deleteEndpoint(web2.Key(), e.Key())
	}
	limited.sync()
	b.Node.Serve("node", []netip.Addr{netns.NodeV4, netns.NodeV6}, []uint16{30090})
	if a, err := b.Client.Ask("tcp", netip.AddrPortFrom(netns.NodeV4, 30090), netns.AskOptions{Timeout: time.Second}); err == nil || !isRefused(err) {
		t.Errorf("node port without endpoints on %s, inside NodePortAddresses: %v, %v; want refused by the rules", netns.NodeV4, a, err)
	}
	ask(t, b.Client, "tcp", netip.AddrPortFrom(netns.NodeV6, 30090), "node")
	// As kube-proxy: a family without a prefix is not restricted.
	v4Only := newOptionsSink(t, b, "np3", Options{NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}})
	web3 := svc("default", "web3", ipset("10.96.0.13", "fd00:10:96::13"), &model.PortMapping{Protocol: model.TCP, Port: 80, TargetPort: 6000, NodePort: 30091})
	web3.Type = "NodePort"
	v4Only.setAll(&model.ServiceEndpoints{Service: web3, Endpoints: localEndpoints(netns.Pod2ID)})
	v4Only.sync()
	ask(t, b.Client, "tcp", netip.AddrPortFrom(netns.NodeV6, 30091), netns.Pod2ID)
}

// TestKernelClusterCIDRMasquerade checks Options.ClusterCIDRs (traffic to
// cluster IPs from outside the pod network is masqueraded, pod traffic is
// not) and Options.MasqueradeAll.
func TestKernelClusterCIDRMasquerade(t *testing.T) {
	b := kernelTopology(t)
	web := svc("default", "web", ipset(webV4.String(), webV6.String()), tcp(80, 6000))
	state := &model.ServiceEndpoints{Service: web, Endpoints: localEndpoints(netns.PodID)}
	cidrs := []netip.Prefix{netip.MustParsePrefix("11.0.0.0/16"), netip.MustParsePrefix("1100::/64")}

	s := newOptionsSink(t, b, "cidr", Options{ClusterCIDRs: cidrs})
	s.setAll(state)
	s.sync()
	for _, cip := range []netip.Addr{webV4, webV6} {
		gw := netns.GatewayV4
		if cip.Is6() {
			gw = netns.GatewayV6
		}
		if a := ask(t, b.Client, "tcp", netip.AddrPortFrom(cip, 80), netns.PodID); a.Remote.Addr() != gw {
			t.Errorf("client to %s with cluster CIDRs: the pod saw %s, want %s (masqueraded)", cip, a.Remote, gw)
		}
		if a := ask(t, b.Pod2, "tcp", netip.AddrPortFrom(cip, 80), netns.PodID); a.Remote.Addr() != podAddr(netns.Pod2ID, cip) {
			t.Errorf("pod2 to %s: the pod saw %s, want pod2's address (not masqueraded)", cip, a.Remote)
		}
	}
	s.stop() // its monitor would write the table again
	if err := Cleanup(context.Background(), Config{ServiceProxyName: "cidr", Conn: connIn(t, b.Node)}); err != nil {
		t.Fatal(err)
	}

	all := newOptionsSink(t, b, "all", Options{MasqueradeAll: true})
	all.setAll(state)
	all.sync()
	if a := ask(t, b.Pod2, "tcp", netip.AddrPortFrom(webV4, 80), netns.PodID); a.Remote.Addr() != netns.GatewayV4 {
		t.Errorf("pod2 to %s with MasqueradeAll: the pod saw %s, want %s", webV4, a.Remote, netns.GatewayV4)
	}
}

// TestKernelLocalPolicies checks externalTrafficPolicy: Local (only local
// endpoints, the client's address kept; dropped when there is none, but
// for the node itself, which uses the cluster endpoints) and
// internalTrafficPolicy: Local (the same for cluster IPs).
func TestKernelLocalPolicies(t *testing.T) {
	b := kernelTopology(t)
	s := newOptionsSink(t, b, "local", Options{})
	ext := svc("default", "ext", ipset("10.96.0.20", "fd00:10:96::20"), &model.PortMapping{Protocol: model.TCP, Port: 80, TargetPort: 6000, NodePort: 30100})
	ext.Type = "LoadBalancer"
	ext.IPs.ExternalIPs = ipset(netns.ServiceV4.String(), netns.ServiceV6.String())
	ext.IPs.LoadBalancerIPs = ipset(lbV4.String(), lbV6.String())
	ext.ExternalTrafficToLocal = true
	intl := svc("default", "int", ipset("10.96.0.21", "fd00:10:96::21"), tcp(80, 6000))
	intl.InternalTrafficToLocal = true
	// pod is local, pod2 is not (as if it ran on another node).
	eps := append(localEndpoints(netns.PodID), remoteEndpoints(netns.Pod2ID)...)
	s.setAll(&model.ServiceEndpoints{Service: ext, Endpoints: eps}, &model.ServiceEndpoints{Service: intl, Endpoints: eps})
	s.sync()

	for _, dst := range []netip.AddrPort{
		netip.AddrPortFrom(netns.ServiceV4, 80), netip.AddrPortFrom(netns.ServiceV6, 80),
		netip.AddrPortFrom(lbV4, 80), netip.AddrPortFrom(lbV6, 80),
		netip.AddrPortFrom(netns.NodeV4, 30100), netip.AddrPortFrom(netns.NodeV6, 30100),
	} {
		client := netns.ClientV4
		if dst.Addr().Is6() {
			client = netns.ClientV6
		}
		for range 10 {
			if a := ask(t, b.Client, "tcp", dst, netns.PodID); a.Remote.Addr() != client {
				t.Errorf("%s, Local policy: the pod saw %s, want the client's %s", dst, a.Remote, client)
				break
			}
		}
	}
	// The cluster IP of ext still uses every endpoint.
	counts := spread(t, b.Client, "tcp", netip.AddrPortFrom(netip.MustParseAddr("10.96.0.20"), 80), 40, map[string]uint16{netns.PodID: 6000, netns.Pod2ID: 6000})
	if counts[netns.PodID] == 0 || counts[netns.Pod2ID] == 0 {
		t.Errorf("cluster IP of an externalTrafficPolicy: Local service: %v, want both pods", counts)
	}
	// The cluster IP of int uses only the local endpoint.
	for range 10 {
		ask(t, b.Client, "tcp", netip.AddrPortFrom(netip.MustParseAddr("10.96.0.21"), 80), netns.PodID)
		ask(t, b.Client, "tcp", netip.AddrPortFrom(netip.MustParseAddr("fd00:10:96::21"), 80), netns.PodID)
	}

	// No local endpoint left: external traffic and int's cluster IPs are
	// dropped, ext's cluster IPs still answer.
	for _, e := range localEndpoints(netns.PodID) {
		s.deleteEndpoint(ext.Key(), e.Key())
		s.deleteEndpoint(intl.Key(), e.Key())
	}
	s.sync()
	expectTimeout(t, b.Client, "tcp", netip.AddrPortFrom(netns.ServiceV4, 80))
	expectTimeout(t, b.Client, "tcp", netip.AddrPortFrom(lbV6, 80))
	expectTimeout(t, b.Client, "tcp", netip.AddrPortFrom(netns.NodeV4, 30100))
	expectTimeout(t, b.Client, "tcp", netip.AddrPortFrom(netip.MustParseAddr("10.96.0.21"), 80))
	ask(t, b.Client, "tcp", netip.AddrPortFrom(netip.MustParseAddr("10.96.0.20"), 80), netns.Pod2ID)
	// The node itself still reaches the external addresses, through the
	// cluster endpoints (kube-proxy's short-circuit).
	for _, dst := range []netip.AddrPort{netip.AddrPortFrom(netns.ServiceV4, 80), netip.AddrPortFrom(lbV6, 80)} {
		ask(t, b.Node, "tcp", dst, netns.Pod2ID)
	}
}

// TestKernelLoadBalancerSourceRanges checks that load-balancer IPs answer
// only the sources in loadBalancerSourceRanges, per family, and that
// changing the ranges takes effect.
func TestKernelLoadBalancerSourceRanges(t *testing.T) {
	b := kernelTopology(t)
	s := newOptionsSink(t, b, "fw", Options{})
	lb := svc("default", "lb", ipset("10.96.0.30", "fd00:10:96::30"), &model.PortMapping{Protocol: model.TCP, Port: 80, TargetPort: 6000, NodePort: 30200})
	lb.Type = "LoadBalancer"
	lb.IPs.LoadBalancerIPs = ipset(lbV4.String(), lbV6.String())
	// The client's IPv4 network is allowed; no IPv6 range: IPv6 is open
	// (as kube-proxy, whose ranges of a family restrict that family).
	lb.LoadBalancerSourceRanges = cidrs("10.0.0.0/24", "203.0.113.0/24")
	state := &model.ServiceEndpoints{Service: lb, Endpoints: localEndpoints(netns.PodID)}
	s.setAll(state)
	s.sync()
	ask(t, b.Client, "tcp", netip.AddrPortFrom(lbV4, 80), netns.PodID)
	ask(t, b.Client, "tcp", netip.AddrPortFrom(lbV6, 80), netns.PodID)
	// The ranges restrict the load-balancer IPs only.
	ask(t, b.Client, "tcp", netip.AddrPortFrom(netns.NodeV6, 30200), netns.PodID)
	ask(t, b.Client, "tcp", netip.AddrPortFrom(netip.MustParseAddr("fd00:10:96::30"), 80), netns.PodID)

	// Other ranges: the client is out, IPv6 in.
	lb2 := *lb
	lb2.LoadBalancerSourceRanges = cidrs("203.0.113.0/24", "fd00::/64")
	s.setService(&lb2)
	if r := s.sync(); r.Full {
		t.Errorf("a change of source ranges made a full sync")
	}
	expectTimeout(t, b.Client, "tcp", netip.AddrPortFrom(lbV4, 80))
	ask(t, b.Client, "tcp", netip.AddrPortFrom(lbV6, 80), netns.PodID)

	// No ranges: open.
	lb3 := *lb
	lb3.LoadBalancerSourceRanges = nil
	s.setService(&lb3)
	s.sync()
	ask(t, b.Client, "tcp", netip.AddrPortFrom(lbV4, 80), netns.PodID)
	ask(t, b.Client, "tcp", netip.AddrPortFrom(lbV6, 80), netns.PodID)
}

// TestKernelSessionAffinity checks ClientIP affinity: a client keeps its
// endpoint over many connections, and picks again once the affinity
// timeout has passed without traffic.
func TestKernelSessionAffinity(t *testing.T) {
	b := kernelTopology(t)
	s := newOptionsSink(t, b, "aff", Options{})
	web := svc("default", "web", ipset(webV4.String(), webV6.String()), tcp(80, 6000), udp(80, 6000))
	// Stickiness with a long timeout, so that a slow machine cannot let it
	// expire in the middle of a burst.
	web.ClientIPAffinity = &model.ClientIPAffinity{TimeoutSeconds: 30}
	s.setAll(&model.ServiceEndpoints{Service: web, Endpoints: podEndpoints(netns.PodID, netns.Pod2ID, pod3ID)})
	s.sync()
	for _, cip := range []netip.Addr{webV4, webV6} {
		first := map[string]string{}
		for i := range 8 {
			network := []string{"tcp", "udp"}[i%2]
			a, err := b.Client.Ask(network, netip.AddrPortFrom(cip, 80), netns.AskOptions{})
			if err != nil {
				t.Fatalf("%s %s: %v", network, cip, err)
			}
			if first[network] == "" {
				first[network] = a.Server
			}
			if a.Server != first[network] {
				t.Errorf("%s %s: request %d went to %s, the first to %s: affinity not kept", network, cip, i, a.Server, first[network])
			}
		}
	}
	if listing := nftList(t, b.Node, "kpng-aff"); !containsAll(listing, "flags dynamic,timeout", "timeout 30s", "update @aff4-", "update @aff6-", " @aff4-") {
		t.Errorf("listing lacks the affinity sets and rules:\n%s", listing)
	}

	// Expiry with a 1 s timeout: one request per round, rounds further
	// apart than the timeout.
	short := *web
	short.ClientIPAffinity = &model.ClientIPAffinity{TimeoutSeconds: 1}
	s.setService(&short)
	s.sync()
	seen := map[string]bool{}
	for round := range 8 {
		if round > 0 {
			time.Sleep(1500 * time.Millisecond) // the entries expire
		}
		a, err := b.Client.Ask("tcp", netip.AddrPortFrom(webV4, 80), netns.AskOptions{})
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		seen[a.Server] = true
	}
	if len(seen) < 2 {
		t.Errorf("in 8 requests more than the timeout apart, the client always went to %v: affinity never expired", seen)
	}
	web = &short

	// Affinity off: the sets go away in a partial sync (the affinity sets
	// and the balance maps among endpoint chains); the service, plain now,
	// goes to shard 3 of each family, whose maps and sets come.
	web2 := *web
	web2.ClientIPAffinity = nil
	s.setService(&web2)
	if r := s.sync(); r.Full || r.Stats.SetsDeleted != 16 || r.Stats.SetsAdded != 4 {
		t.Errorf("affinity removed: %+v, want a partial sync deleting 16 sets (12 affinity sets: 3 endpoints, 2 families, 2 ports; 4 balance maps) and adding shard 3's map and set of each family", r)
	}
	if listing := nftList(t, b.Node, "kpng-aff"); strings.Contains(listing, "aff4-") || strings.Contains(listing, "aff6-") {
		t.Errorf("affinity sets left:\n%s", listing)
	}
}

// containsAll reports whether s contains every one of subs.
func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// TestKernelEndpointSelection checks the shared categorization in the
// rules: topology hints (only the endpoints hinted for this node's zone)
// and the fallback to serving, terminating endpoints when none is ready.
func TestKernelEndpointSelection(t *testing.T) {
	b := kernelTopology(t)
	s := newTestSink(t, b, "select")
	hinted := svc("default", "hinted", ipset("10.96.0.40", "fd00:10:96::40"), tcp(80, 6000))
	hintedEps := podEndpoints(netns.PodID, netns.Pod2ID)
	for _, e := range hintedEps {
		e.Hints = &model.Hints{Zones: []string{"zone-b"}}
		if e.Key() == netns.PodV4.String() || e.Key() == netns.PodV6.String() {
			e.Hints = &model.Hints{Zones: []string{"zone-a"}, SameZone: true}
		}
	}
	term := svc("default", "term", ipset("10.96.0.41", "fd00:10:96::41"), tcp(80, 6000))
	termEps := podEndpoints(netns.PodID, netns.Pod2ID, pod3ID)
	for _, e := range termEps {
		switch e.Key() {
		case netns.PodV4.String(), netns.PodV6.String(): // serving, terminating
			e.Ready, e.Serving, e.Terminating = false, true, true
		case netns.Pod2V4.String(), netns.Pod2V6.String(): // neither
			e.Ready, e.Serving, e.Terminating = false, false, true
		default: // pod3: not ready, not terminating (starting)
			e.Ready, e.Serving = false, false
		}
	}
	s.setAll(&model.ServiceEndpoints{Service: hinted, Endpoints: hintedEps}, &model.ServiceEndpoints{Service: term, Endpoints: termEps})
	s.sync()
	for _, addr := range []string{"10.96.0.40", "fd00:10:96::40", "10.96.0.41", "fd00:10:96::41"} {
		for range 15 {
			ask(t, b.Client, "tcp", netip.AddrPortFrom(netip.MustParseAddr(addr), 80), netns.PodID)
		}
	}
	// pod2 becomes ready: the terminating endpoint is no longer used.
	for _, e := range termEps {
		if e.Key() == netns.Pod2V4.String() || e.Key() == netns.Pod2V6.String() {
			ready := *e
			ready.Ready, ready.Serving, ready.Terminating = true, true, false
			s.setEndpoint(term.Key(), &ready)
		}
	}
	s.sync()
	for range 15 {
		ask(t, b.Client, "tcp", netip.AddrPortFrom(netip.MustParseAddr("10.96.0.41"), 80), netns.Pod2ID)
	}
}

// openEcho opens a TCP connection from from to dst, an echo server
// (netns.ServeEcho) behind it, closed when t ends, and returns a function
// that sends msg on it and fails t unless the echo comes back.
func openEcho(t *testing.T, from *netns.NS, dst netip.AddrPort) func(msg string) {
	t.Helper()
	var c net.Conn
	if err := from.Do(func() (err error) {
		c, err = net.DialTimeout("tcp", dst.String(), 2*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	r := bufio.NewReader(c)
	return func(msg string) {
		t.Helper()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write([]byte(msg + "\n")); err != nil {
			t.Fatalf("%s: write: %v", msg, err)
		}
		got, err := r.ReadString('\n')
		if err != nil || got != "echo "+msg+"\n" {
			t.Fatalf("%s: read %q, %v", msg, got, err)
		}
	}
}

// TestKernelSourceRangesSpareOpenConnections checks that the filter
// chains judge new connections only, as kube-proxy's: a connection to a
// load-balancer IP opened while its client was in loadBalancerSourceRanges
// keeps working after the ranges leave it out, while a new one is dropped.
// (With the checks on every packet, the open connection's next packets
// met the firewall's drop.)
func TestKernelSourceRangesSpareOpenConnections(t *testing.T) {
	b := kernelTopology(t)
	b.Pod.ServeEcho(t, 9000)
	s := newOptionsSink(t, b, "fwopen", Options{})
	lb := svc("default", "lb", ipset("10.96.0.31"), tcp(90, 9000))
	lb.Type = "LoadBalancer"
	lb.IPs.LoadBalancerIPs = ipset(lbV4.String())
	lb.LoadBalancerSourceRanges = cidrs("10.0.0.0/24")
	s.setAll(&model.ServiceEndpoints{Service: lb, Endpoints: podEndpoints(netns.PodID)[:1]})
	s.sync()
	roundTrip := openEcho(t, b.Client, netip.AddrPortFrom(lbV4, 90))
	roundTrip("allowed")

	closed := *lb
	closed.LoadBalancerSourceRanges = cidrs("203.0.113.0/24")
	s.setService(&closed)
	s.sync()
	expectTimeout(t, b.Client, "tcp", netip.AddrPortFrom(lbV4, 90))
	roundTrip("after the ranges left the client out")
}

// TestKernelNoEndpointsSpareOpenConnections checks the same for the
// no-endpoint checks: a connection to a server on the node's own address
// keeps working after a node port of a service without endpoints takes
// its port, while a new connection is refused. (With the checks on every
// packet, the open connection's next packet met the reject.)
func TestKernelNoEndpointsSpareOpenConnections(t *testing.T) {
	b := kernelTopology(t)
	const port = 30310
	b.Node.ServeEcho(t, port)
	// The table first, empty: its NAT chains make the namespace track
	// connections from their first packet (a connection older than them
	// would be picked up in the middle, as a new one).
	s := newOptionsSink(t, b, "noepopen", Options{})
	s.setAll()
	s.sync()
	roundTrip := openEcho(t, b.Client, netip.AddrPortFrom(netns.NodeV4, port))
	roundTrip("before the node port")

	np := svc("default", "np", ipset("10.96.0.32"), &model.PortMapping{Protocol: model.TCP, Port: 80, TargetPort: 9000, NodePort: port})
	np.Type = "NodePort"
	s.setAll(&model.ServiceEndpoints{Service: np})
	s.sync()
	if _, err := b.Client.Ask("tcp", netip.AddrPortFrom(netns.NodeV4, port), netns.AskOptions{Timeout: time.Second}); !isRefused(err) {
		t.Errorf("a new connection to the node port of a service without endpoints: %v, want refused", err)
	}
	roundTrip("after the node port")
}

// TestKernelRestartKeepsOpenConnection opens a TCP connection through a
// service, restarts the proxier (a new sink whose first sync replaces the
// table) and checks that the same connection still carries data both ways.
func TestKernelRestartKeepsOpenConnection(t *testing.T) {
	b := kernelTopology(t)
	b.Pod.ServeEcho(t, 9000)
	echo := svc("default", "echo", ipset(webV4.String()), tcp(90, 9000))
	state := &model.ServiceEndpoints{Service: echo, Endpoints: podEndpoints(netns.PodID)[:1]}
	first := newTestSink(t, b, "keep")
	first.setAll(state)
	first.sync()

	roundTrip := openEcho(t, b.Client, netip.AddrPortFrom(webV4, 90))
	roundTrip("before")

	second := restartSink(t, b, first, "keep", state)
	roundTrip("after the restart")
	// And after a partial sync that touches the service's chains.
	e := podEndpoints(netns.Pod2ID)[0]
	second.setEndpoint(echo.Key(), e)
	second.sync()
	roundTrip("after an endpoint was added")
}

// TestKernelConflictReleased checks that when two services claim the same
// external IP and port, the second one gets it as soon as the first lets
// it go, without a change of its own, and that a service first in key
// order takes it from a later one whenever it comes.
func TestKernelConflictReleased(t *testing.T) {
	b := kernelTopology(t)
	s := newTestSink(t, b, "conflict")
	first := svc("default", "first", ipset("10.96.0.50"), tcp(6000, 6000))
	first.IPs.ExternalIPs = ipset(netns.ServiceV4.String())
	second := svc("default", "second", ipset("10.96.0.51"), tcp(6000, 6000))
	second.IPs.ExternalIPs = ipset(netns.ServiceV4.String())
	s.setAll(&model.ServiceEndpoints{Service: first, Endpoints: localEndpoints(netns.PodID)[:1]},
		&model.ServiceEndpoints{Service: second, Endpoints: localEndpoints(netns.Pod2ID)[:1]})
	s.sync()
	ext := netip.AddrPortFrom(netns.ServiceV4, 6000)
	ask(t, b.Client, "tcp", ext, netns.PodID)

	s.deleteEndpoint(first.Key(), netns.PodV4.String())
	s.deleteService(first.Key())
	if r := s.sync(); len(r.Services) != 2 {
		t.Errorf("the sync after first's deletion concerns %v, want first and second", r.Services)
	}
	ask(t, b.Client, "tcp", ext, netns.Pod2ID)

	// A service before second in key order comes later: it takes the
	// address, as a fresh start would give it, in one transaction.
	early := svc("default", "early", ipset("10.96.0.52"), tcp(6000, 6000))
	early.IPs.ExternalIPs = ipset(netns.ServiceV4.String())
	s.set(early.Key(), &model.ServiceEndpoints{Service: early, Endpoints: localEndpoints(netns.PodID)[:1]})
	if r := s.sync(); r.Full {
		t.Errorf("adding early was a full sync: %+v", r)
	}
	ask(t, b.Client, "tcp", ext, netns.PodID)
}

// TestKernelLoadBalancerSourceRangesFromNode checks kube-proxy's exception
// for load-balancer IPs routed locally: the node's own request to such an
// IP comes from it, and is let through the source ranges only when a range
// contains a node IP (Options.NodeIPs).
func TestKernelLoadBalancerSourceRangesFromNode(t *testing.T) {
	for _, withNodeIP := range []bool{false, true} {
		t.Run(fmt.Sprintf("nodeIP=%v", withNodeIP), func(t *testing.T) {
			b := kernelTopology(t)
			b.Node.AddAddr("lo", lbV4.String()+"/32")
			var opts Options
			if withNodeIP {
				opts.NodeIPs = []netip.Addr{netns.NodeV4}
			}
			s := newOptionsSink(t, b, "fwnode", opts)
			lb := svc("default", "lb", ipset("10.96.0.31"), tcp(80, 6000))
			lb.Type = "LoadBalancer"
			lb.IPs.LoadBalancerIPs = ipset(lbV4.String())
			// The client's network, which holds the node's address.
			lb.LoadBalancerSourceRanges = cidrs("10.0.0.0/24")
			s.setAll(&model.ServiceEndpoints{Service: lb, Endpoints: localEndpoints(netns.PodID)})
			s.sync()
			ask(t, b.Client, "tcp", netip.AddrPortFrom(lbV4, 80), netns.PodID)
			a, err := b.Node.Ask("tcp", netip.AddrPortFrom(lbV4, 80), netns.AskOptions{LocalAddr: lbV4, Timeout: 400 * time.Millisecond})
			switch {
			case withNodeIP && (err != nil || a.Server != netns.PodID):
				t.Errorf("from the node, source %s: %v, %v; want the pod", lbV4, a, err)
			case !withNodeIP && (err == nil || isRefused(err)):
				t.Errorf("from the node, source %s, no node IP: %v, %v; want no answer (dropped)", lbV4, a, err)
			}
		})
	}
}
