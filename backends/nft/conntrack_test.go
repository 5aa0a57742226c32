package nft

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"

	"sigs.k8s.io/kpng/diffstore"
	"sigs.k8s.io/kpng/model"
)

// staleTo is the staleFlow of UDP entries to dst DNATed to endpoint.
func staleTo(dst, endpoint string) staleFlow {
	d, e := netip.MustParseAddrPort(dst), netip.MustParseAddrPort(endpoint)
	return staleFlow{Family: familyOf(d.Addr()), Proto: model.UDP, Dst: d, Endpoint: e}
}

// staleUnNATed is the staleFlow of the un-DNATed UDP entries to dst.
func staleUnNATed(dst string) staleFlow {
	d := netip.MustParseAddrPort(dst)
	return staleFlow{Family: familyOf(d.Addr()), Proto: model.UDP, Dst: d}
}

func withEndpoints(s *model.Service, eps ...*model.Endpoint) *model.ServiceEndpoints {
	return &model.ServiceEndpoints{Service: s, Endpoints: eps}
}

// roundFlows runs a tracker through the state before, then changes it to
// after (services absent from after are deleted) and returns the stale
// flows of that second round.
func roundFlows(before, after []*model.ServiceEndpoints) []staleFlow {
	tr := newTracker(Options{})
	for _, se := range before {
		tr.Update(se.Service.Key(), se)
	}
	tr.Done()
	keys := map[model.ServiceKey]*model.ServiceEndpoints{}
	for _, se := range before {
		keys[se.Service.Key()] = nil
	}
	for _, se := range after {
		keys[se.Service.Key()] = se
	}
	for k, se := range keys {
		tr.Update(k, se)
	}
	return tr.StaleFlows(tr.Done())
}

func TestStaleFlows(t *testing.T) {
	dns := func() *model.Service {
		return svc("kube-system", "dns", ipset("10.96.0.10"), udp(53, 5353), tcp(53, 5353))
	}
	dual := func() *model.Service { return svc("default", "dual", ipset("10.96.0.20", "fd00::20"), udp(80, 8080)) }
	withExternal := func(s *model.Service, addrs ...string) *model.Service {
		s.IPs.ExternalIPs = ipset(addrs...)
		return s
	}
	named := func() *model.Service {
		return svc("default", "named", ipset("10.96.0.30"), &model.PortMapping{Name: "q", Protocol: model.UDP, Port: 443, TargetPortName: "q"})
	}
	withPort := func(e *model.Endpoint, port int32) *model.Endpoint {
		e.PortOverrides = map[string]int32{"q": port}
		return e
	}
	tcpOnly := func() *model.Service { return svc("default", "web", ipset("10.96.0.40"), tcp(80, 8080)) }
	local := func() *model.Service {
		s := withExternal(svc("default", "local", ipset("10.96.0.50"), udp(80, 8080)), "192.0.2.50")
		s.ExternalTrafficToLocal = true
		return s
	}

	nodePort := func() *model.Service {
		s := svc("default", "np", ipset("10.96.0.60"), &model.PortMapping{Protocol: model.UDP, Port: 53, TargetPort: 5353, NodePort: 30053})
		s.Type = "NodePort"
		return s
	}
	for _, tc := range []struct {
		name          string
		before, after []*model.ServiceEndpoints
		want          []staleFlow
	}{{
		name:   "endpoint replaced",
		before: []*model.ServiceEndpoints{withEndpoints(dns(), ep("10.1.0.2", false))},
		after:  []*model.ServiceEndpoints{withEndpoints(dns(), ep("10.1.0.3", false))},
		// The TCP port's change needs no cleanup.
		want: []staleFlow{staleTo("10.96.0.10:53", "10.1.0.2:5353")},
	}, {
		name:   "one endpoint of two removed, both families",
		before: []*model.ServiceEndpoints{withEndpoints(dual(), ep("10.1.0.2", false), ep("10.1.0.3", false), ep("fd01::2", false))},
		after:  []*model.ServiceEndpoints{withEndpoints(dual(), ep("10.1.0.3", false))},
		want:   []staleFlow{staleTo("10.96.0.20:80", "10.1.0.2:8080"), staleTo("[fd00::20]:80", "[fd01::2]:8080")},
	}, {
		name:   "endpoint added",
		before: []*model.ServiceEndpoints{withEndpoints(dns(), ep("10.1.0.2", false))},
		after:  []*model.ServiceEndpoints{withEndpoints(dns(), ep("10.1.0.2", false), ep("10.1.0.3", false))},
	}, {
		name:   "last endpoint removed: the element moves to the no-endpoint map",
		before: []*model.ServiceEndpoints{withEndpoints(dns(), ep("10.1.0.2", false))},
		after:  []*model.ServiceEndpoints{withEndpoints(dns())},
		want:   []staleFlow{staleTo("10.96.0.10:53", "10.1.0.2:5353")},
	}, {
		name:   "first endpoint: the element moves from the no-endpoint map",
		before: []*model.ServiceEndpoints{withEndpoints(withExternal(dns(), "192.0.2.10"))},
		after:  []*model.ServiceEndpoints{withEndpoints(withExternal(dns(), "192.0.2.10"), ep("10.1.0.2", false))},
		want:   []staleFlow{staleUnNATed("10.96.0.10:53"), staleUnNATed("192.0.2.10:53")},
	}, {
		name:  "new service with endpoints",
		after: []*model.ServiceEndpoints{withEndpoints(dual(), ep("10.1.0.2", false), ep("fd01::2", false))},
		want:  []staleFlow{staleUnNATed("10.96.0.20:80"), staleUnNATed("[fd00::20]:80")},
	}, {
		name:   "new service without endpoints",
		before: nil,
		after:  []*model.ServiceEndpoints{withEndpoints(dns())},
	}, {
		name:   "service deleted",
		before: []*model.ServiceEndpoints{withEndpoints(withExternal(dns(), "192.0.2.10"), ep("10.1.0.2", false), ep("10.1.0.3", false))},
		want: []staleFlow{
			staleTo("10.96.0.10:53", "10.1.0.2:5353"), staleTo("10.96.0.10:53", "10.1.0.3:5353"),
			staleTo("192.0.2.10:53", "10.1.0.2:5353"), staleTo("192.0.2.10:53", "10.1.0.3:5353"),
		},
	}, {
		name:   "external IP added, another removed",
		before: []*model.ServiceEndpoints{withEndpoints(withExternal(dns(), "192.0.2.10"), ep("10.1.0.2", false))},
		after:  []*model.ServiceEndpoints{withEndpoints(withExternal(dns(), "192.0.2.11"), ep("10.1.0.2", false))},
		want:   []staleFlow{staleTo("192.0.2.10:53", "10.1.0.2:5353"), staleUnNATed("192.0.2.11:53")},
	}, {
		name:   "named target port moved",
		before: []*model.ServiceEndpoints{withEndpoints(named(), withPort(ep("10.1.0.2", false), 8443))},
		after:  []*model.ServiceEndpoints{withEndpoints(named(), withPort(ep("10.1.0.2", false), 9443))},
		want:   []staleFlow{staleTo("10.96.0.30:443", "10.1.0.2:8443")},
	}, {
		name:   "TCP only",
		before: []*model.ServiceEndpoints{withEndpoints(tcpOnly(), ep("10.1.0.2", false))},
		after:  []*model.ServiceEndpoints{withEndpoints(tcpOnly(), ep("10.1.0.3", false))},
	}, {
		// External traffic policy Local: the external IP goes through its
		// own chain, to the local endpoints only, except for traffic from
		// the node itself, sent to the cluster chain (kube-proxy's
		// short-circuit). StaleFlows does not look at sources: the
		// external IP still leads to 10.1.0.3, so nothing is stale. As
		// kube-proxy, which only deletes the entries of endpoints gone
		// from the service port.
		name:   "endpoint no longer local",
		before: []*model.ServiceEndpoints{withEndpoints(local(), ep("10.1.0.2", true), ep("10.1.0.3", true))},
		after:  []*model.ServiceEndpoints{withEndpoints(local(), ep("10.1.0.2", true), ep("10.1.0.3", false))},
	}, {
		// Outside traffic is dropped, but the node itself still reaches
		// the endpoint through the external chain (as kube-proxy): the
		// reachability ignores sources, so nothing is stale.
		name:   "no local endpoint left: external IP still leads to it for the node",
		before: []*model.ServiceEndpoints{withEndpoints(local(), ep("10.1.0.2", true))},
		after:  []*model.ServiceEndpoints{withEndpoints(local(), ep("10.1.0.2", false))},
	}, {
		// Node ports are keyed by protocol and port only: any address.
		name:   "node port endpoint replaced",
		before: []*model.ServiceEndpoints{withEndpoints(nodePort(), ep("10.1.0.2", false))},
		after:  []*model.ServiceEndpoints{withEndpoints(nodePort(), ep("10.1.0.3", false))},
		want: []staleFlow{
			{Family: ipv4, Proto: model.UDP, Dst: netip.AddrPortFrom(netip.Addr{}, 30053), Endpoint: netip.MustParseAddrPort("10.1.0.2:5353")},
			staleTo("10.96.0.60:53", "10.1.0.2:5353"),
		},
	}, {
		// The same node-port key in both families: each family's flows.
		name: "dual-stack node port, IPv6 endpoint removed",
		before: []*model.ServiceEndpoints{withEndpoints(func() *model.Service {
			s := nodePort()
			s.IPs.ClusterIPs = ipset("10.96.0.60", "fd00::60")
			return s
		}(), ep("10.1.0.2", false), ep("fd01::2", false))},
		after: []*model.ServiceEndpoints{withEndpoints(func() *model.Service {
			s := nodePort()
			s.IPs.ClusterIPs = ipset("10.96.0.60", "fd00::60")
			return s
		}(), ep("10.1.0.2", false))},
		want: []staleFlow{
			{Family: ipv6, Proto: model.UDP, Dst: netip.AddrPortFrom(netip.Addr{}, 30053), Endpoint: netip.MustParseAddrPort("[fd01::2]:5353")},
			staleTo("[fd00::60]:53", "[fd01::2]:5353"),
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := roundFlows(tc.before, tc.after)
			if diff := cmp.Diff(tc.want, got, cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })); diff != "" {
				t.Errorf("StaleFlows (-want +got):\n%s", diff)
			}
		})
	}
}

// otherRule stands for a rule kind StaleFlows does not know (masquerade,
// affinity bookkeeping): it is ignored.
type otherRule struct{}

func (otherRule) String() string { return "masquerade" }

// affinityRule stands for a future rule sending packets to endpoint
// chains: implementing chainReferrer is enough for StaleFlows to follow it.
type affinityRule struct{ target string }

func (r affinityRule) String() string             { return "goto " + r.target }
func (r affinityRule) referencedChains() []string { return []string{r.target} }

// TestStaleFlowsOtherMaps checks the assumptions StaleFlows documents on
// a hand-made delta: a map keyed by protocol and port only (no address,
// as node ports), endpoint chains with other rules besides their dnatRule,
// and a rule kind implementing chainReferrer.
func TestStaleFlowsOtherMaps(t *testing.T) {
	key := model.ServiceKey{Namespace: "default", Name: "np"}
	nodePort := mapKey{Proto: model.UDP, Port: 30053}
	ep1, ep2 := netip.MustParseAddrPort("10.1.0.2:53"), netip.MustParseAddrPort("10.1.0.3:53")
	epChain := func(name string, to netip.AddrPort) *regularChain {
		return &regularChain{Name: name, Service: key, Rules: []rule{otherRule{}, dnatRule{Proto: model.UDP, To: to}}}
	}
	prevSvc := &regularChain{Name: "np4", Service: key, Rules: []rule{affinityRule{target: "ep-1"}, balanceRule{Targets: []string{"ep-1"}}}}
	nowSvc := &regularChain{Name: "np4", Service: key, Rules: []rule{affinityRule{target: "ep-2"}, balanceRule{Targets: []string{"ep-2"}}}}
	elem := mapElement{Map: "node-ports-v4", Family: ipv4, Key: nodePort, Verdict: verdict{Goto: "np4"}, Service: key}
	now := serviceObjects{Chains: []*regularChain{nowSvc, epChain("ep-2", ep2)}, Elements: []mapElement{elem}}
	d := delta{Chains: diffstore.Changes[string, *regularChain]{
		Created: []diffstore.Item[string, *regularChain]{{Key: "ep-2", Value: now.Chains[1]}},
		Updated: []diffstore.Item[string, *regularChain]{{Key: "np4", Value: nowSvc, Prev: prevSvc}},
		Deleted: []diffstore.Item[string, *regularChain]{{Key: "ep-1", Value: epChain("ep-1", ep1), Prev: epChain("ep-1", ep1)}},
	}}
	got := staleFlows(d, func(k model.ServiceKey) serviceObjects {
		if k != key {
			t.Errorf("asked for the objects of %v", k)
		}
		return now
	})
	want := []staleFlow{{Family: ipv4, Proto: model.UDP, Dst: netip.AddrPortFrom(netip.Addr{}, 30053), Endpoint: ep1}}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })); diff != "" {
		t.Errorf("StaleFlows (-want +got):\n%s", diff)
	}
	if s := got[0].String(); s != "udp *:30053 -> 10.1.0.2:53" {
		t.Errorf("String() = %q", s)
	}
}
