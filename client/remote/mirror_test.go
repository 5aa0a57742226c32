package remote

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"sigs.k8s.io/kpng/api/kpngv1"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/localsink/sinktest"
	"sigs.k8s.io/kpng/model"
)

func opReset() *kpngv1.Op { return &kpngv1.Op{Op: &kpngv1.Op_Reset_{Reset_: &kpngv1.Reset{}}} }
func opSync() *kpngv1.Op  { return &kpngv1.Op{Op: &kpngv1.Op_Sync{Sync: &kpngv1.Sync{}}} }
func opSetService(name string) *kpngv1.Op {
	return &kpngv1.Op{Op: &kpngv1.Op_SetService{SetService: &kpngv1.Service{Namespace: "ns", Name: name, Type: "ClusterIP"}}}
}
func opDeleteService(name string) *kpngv1.Op {
	return &kpngv1.Op{Op: &kpngv1.Op_DeleteService{DeleteService: &kpngv1.ServiceKey{Namespace: "ns", Name: name}}}
}
func opSetEndpoint(svc, ip string) *kpngv1.Op {
	return &kpngv1.Op{Op: &kpngv1.Op_SetEndpoint{SetEndpoint: &kpngv1.SetEndpoint{
		Service: &kpngv1.ServiceKey{Namespace: "ns", Name: svc}, Key: ip,
		Endpoint: &kpngv1.Endpoint{Ips: &kpngv1.IPSet{V4: []string{ip}}, Ready: true},
	}}}
}
func opDeleteEndpoint(svc, ip string) *kpngv1.Op {
	return &kpngv1.Op{Op: &kpngv1.Op_DeleteEndpoint{DeleteEndpoint: &kpngv1.EndpointKey{Service: &kpngv1.ServiceKey{Namespace: "ns", Name: svc}, Key: ip}}}
}

// TestMirror checks the receiving edge of the wire: operations rebuilt into
// whole services, each round delivered as the Sink contract says, a new
// stream's Reset and unchanged state costing the sink nothing.
func TestMirror(t *testing.T) {
	c := sinktest.NewChecker(nil)
	f := localsink.NewFeeder(c, localsink.FeederOptions{NoRetry: true})
	defer f.Close()
	m := newMirror(f, "")
	rounds := []struct {
		name string
		ops  []*kpngv1.Op
		want []string
	}{
		{"first state", []*kpngv1.Op{opReset(), opSetService("a"), opSetEndpoint("a", "10.0.0.2"), opSetEndpoint("a", "10.0.0.1"), opSetService("b"), opSync()},
			[]string{"Reset", "Update ns/a service +10.0.0.1 +10.0.0.2", "Update ns/b service", "Sync"}},
		{"one endpoint", []*kpngv1.Op{opDeleteEndpoint("a", "10.0.0.2"), opSync()},
			[]string{"Update ns/a -10.0.0.2", "Sync"}},
		{"endpoints before their service", []*kpngv1.Op{opSetEndpoint("c", "10.0.0.3"), opSync()}, nil},
		{"then the service", []*kpngv1.Op{opSetService("c"), opSync()},
			[]string{"Update ns/c service +10.0.0.3", "Sync"}},
		{"a new stream with the same state: nothing", []*kpngv1.Op{opReset(), opSetService("a"), opSetEndpoint("a", "10.0.0.1"), opSetService("b"), opSetService("c"), opSetEndpoint("c", "10.0.0.3"), opSync()},
			nil},
		{"a new stream without b", []*kpngv1.Op{opReset(), opSetService("a"), opSetEndpoint("a", "10.0.0.1"), opSetService("c"), opSetEndpoint("c", "10.0.0.3"), opSync()},
			[]string{"Update ns/b deleted", "Sync"}},
		{"deleted", []*kpngv1.Op{opDeleteEndpoint("a", "10.0.0.1"), opDeleteService("a"), opSync()},
			[]string{"Update ns/a deleted", "Sync"}},
	}
	for _, r := range rounds {
		for _, op := range r.ops {
			if err := m.apply(op); err != nil {
				t.Fatalf("%s: %v", r.name, err)
			}
		}
		if diff := cmp.Diff(r.want, c.TakeCalls()); diff != "" {
			t.Errorf("%s: calls (-want +got):\n%s", r.name, diff)
		}
	}
	if err := c.Err(); err != nil {
		t.Errorf("contract broken:\n%v", err)
	}
	got := c.State()
	if len(got) != 1 || got[0].Service.Key() != (model.ServiceKey{Namespace: "ns", Name: "c"}) {
		t.Errorf("final state %v, want ns/c only", got)
	}
}

// TestMirrorRejectsMalformedOps checks that malformed operations are
// errors naming what is missing (the stream is then reopened), not panics.
func TestMirrorRejectsMalformedOps(t *testing.T) {
	c := sinktest.NewChecker(nil)
	f := localsink.NewFeeder(c, localsink.FeederOptions{NoRetry: true})
	defer f.Close()
	m := newMirror(f, "")
	for _, tc := range []struct {
		op   *kpngv1.Op
		want string
	}{
		{&kpngv1.Op{Op: &kpngv1.Op_SetService{SetService: &kpngv1.Service{Namespace: "ns"}}}, "without a name"},
		// The wire carries source ranges as strings: a bad one names the
		// service and the field.
		{&kpngv1.Op{Op: &kpngv1.Op_SetService{SetService: &kpngv1.Service{Namespace: "ns", Name: "lb",
			LoadBalancerSourceRanges: []string{"10.0.0.0/8", "bogus"}}}}, `set_service: service ns/lb: load_balancer_source_ranges: "bogus" is not a usable CIDR`},
		{&kpngv1.Op{Op: &kpngv1.Op_SetEndpoint{SetEndpoint: &kpngv1.SetEndpoint{Key: "10.0.0.1"}}}, "without service or endpoint"},
		// Names are checked as the API server checks them (they reach
		// rule text and logs): a bad one names the service and the field.
		{&kpngv1.Op{Op: &kpngv1.Op_SetService{SetService: &kpngv1.Service{Namespace: "ns", Name: "x\"\n; }"}}},
			`set_service: service "ns"/"x\"\n; }": metadata.name: "x\"\n; }" is not a DNS-1035 label`},
		{&kpngv1.Op{Op: &kpngv1.Op_SetService{SetService: &kpngv1.Service{Namespace: "ns", Name: "web",
			Ports: []*kpngv1.PortMapping{{Name: "HTTP", Protocol: 1, Port: 80}}}}}, `spec.ports[0].name: "HTTP" is not a DNS-1123 label`},
		{&kpngv1.Op{Op: &kpngv1.Op_SetEndpoint{SetEndpoint: &kpngv1.SetEndpoint{Key: "10.0.0.1",
			Service: &kpngv1.ServiceKey{Namespace: "ns", Name: "web"}, Endpoint: &kpngv1.Endpoint{NodeName: "node\nINFO forged"}}}},
			`set_endpoint "10.0.0.1": service "ns"/"web": endpoints[].nodeName: "node\nINFO forged" is not a DNS-1123 subdomain`},
		{&kpngv1.Op{Op: &kpngv1.Op_DeleteEndpoint{DeleteEndpoint: &kpngv1.EndpointKey{Key: "10.0.0.1"}}}, "without service"},
		{&kpngv1.Op{Op: &kpngv1.Op_Sync{Sync: &kpngv1.Sync{Cluster: &kpngv1.Cluster{ServiceCidrs: []string{"10.96.0.0/16", "bogus"}}}}},
			`sync: cluster: service_cidrs: "bogus" is not a usable CIDR`},
		{&kpngv1.Op{}, "unknown operation"},
		{&kpngv1.Op{Op: &kpngv1.Op_Sync{Sync: &kpngv1.Sync{Triggers: []*kpngv1.Triggers{{UnixNanos: []int64{1}}}}}}, "sync: triggers without a service name"},
	} {
		if err := m.apply(tc.op); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("apply(%v): %v, want an error containing %q", tc.op, err, tc.want)
		}
	}
	if len(m.services) != 0 {
		t.Errorf("malformed operations left services behind: %v", m.services)
	}
	if err := c.Err(); err != nil {
		t.Errorf("Sink contract broken:\n%v", err)
	}
}

// TestMirrorStateHash: on a node-independent stream the mirror keeps the
// last state hash the controller named, for the next stream's request;
// not after a Reset, nor when a stream ended in the middle of a round (it
// holds part of a round: no state the controller named), nor on a stream
// that is not node-independent.
func TestMirrorStateHash(t *testing.T) {
	_, m := testMirror(t, "node-a")
	hashed := func(h string) *kpngv1.Op {
		return &kpngv1.Op{Op: &kpngv1.Op_Sync{Sync: &kpngv1.Sync{StateHash: []byte(h)}}}
	}
	resetNode := &kpngv1.Op{Op: &kpngv1.Op_Reset_{Reset_: &kpngv1.Reset{Node: &kpngv1.NodeFacts{}}}}
	apply := func(ops ...*kpngv1.Op) {
		t.Helper()
		for _, op := range ops {
			if err := m.apply(op); err != nil {
				t.Fatal(err)
			}
		}
	}
	apply(resetNode, opSetService("a"), hashed("h1"))
	if got := string(m.haveState()); got != "h1" {
		t.Errorf("after a state named h1: %q", got)
	}
	apply(opSetEndpoint("a", "10.0.0.1"), opSync())
	if got := string(m.haveState()); got != "h1" {
		t.Errorf("after a sync naming no state: %q, want the last named, h1", got)
	}
	apply(opSetEndpoint("a", "10.0.0.2"))
	m.streamEnded()
	if got := m.haveState(); got != nil {
		t.Errorf("after a stream cut in the middle of a round: %q, want none", got)
	}
	apply(resetNode, opSetService("a"), hashed("h2"))
	m.streamEnded()
	if got := string(m.haveState()); got != "h2" {
		t.Errorf("after a stream ended between rounds: %q, want h2", got)
	}
	apply(opReset(), opSetService("a"), hashed("h3"))
	if got := m.haveState(); got != nil {
		t.Errorf("on a stream that is not node-independent: %q, want none", got)
	}
}

// TestMirrorComputesTheNodesView: on a node-independent stream, the
// endpoints on the mirror's node are Local and the hints matched against
// its node and zone; set_node's new zone changes the view.
func TestMirrorComputesTheNodesView(t *testing.T) {
	c, m := testMirror(t, "node-a")
	local := opSetEndpoint("a", "10.0.0.1")
	local.GetSetEndpoint().Endpoint.NodeName = "node-a"
	hinted := opSetEndpoint("a", "10.0.0.2")
	hinted.GetSetEndpoint().Endpoint.NodeName = "node-b"
	hinted.GetSetEndpoint().Endpoint.Hints = &kpngv1.Hints{Zones: []string{"z2"}}
	for _, op := range []*kpngv1.Op{{Op: &kpngv1.Op_Reset_{Reset_: &kpngv1.Reset{Node: &kpngv1.NodeFacts{Zone: "z1"}}}}, opSetService("a"), local, hinted, opSync()} {
		if err := m.apply(op); err != nil {
			t.Fatal(err)
		}
	}
	eps := c.State()[0].Endpoints
	if !eps[0].Local || eps[1].Local || eps[1].Hints.SameZone {
		t.Errorf("view in zone z1: local %v %v, same_zone %v; want true false false", eps[0].Local, eps[1].Local, eps[1].Hints.SameZone)
	}
	for _, op := range []*kpngv1.Op{{Op: &kpngv1.Op_SetNode{SetNode: &kpngv1.NodeFacts{Zone: "z2"}}}, opSync()} {
		if err := m.apply(op); err != nil {
			t.Fatal(err)
		}
	}
	if eps := c.State()[0].Endpoints; !eps[1].Hints.SameZone {
		t.Errorf("after set_node z2: same_zone %v, want true", eps[1].Hints.SameZone)
	}
}

// TestMirrorTakesTheNodeNameFromTheController: a backend that named no
// node (its client certificate names it) computes its view for the node
// the controller authorized.
func TestMirrorTakesTheNodeNameFromTheController(t *testing.T) {
	c, m := testMirror(t, "")
	local := opSetEndpoint("a", "10.0.0.1")
	local.GetSetEndpoint().Endpoint.NodeName = "node-a"
	for _, op := range []*kpngv1.Op{{Op: &kpngv1.Op_Reset_{Reset_: &kpngv1.Reset{Node: &kpngv1.NodeFacts{Name: "node-a"}}}}, opSetService("a"), local, opSync()} {
		if err := m.apply(op); err != nil {
			t.Fatal(err)
		}
	}
	if eps := c.State()[0].Endpoints; !eps[0].Local {
		t.Errorf("endpoint on node-a not local for the node the controller named")
	}
}

// testMirror returns a mirror for node feeding a contract checker.
func testMirror(t *testing.T, node string) (*sinktest.Checker, *mirror) {
	c := sinktest.NewChecker(nil)
	f := localsink.NewFeeder(c, localsink.FeederOptions{NoRetry: true})
	t.Cleanup(f.Close)
	return c, newMirror(f, node)
}
