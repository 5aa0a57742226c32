package endpoints

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"sigs.k8s.io/kpng/model"
)

// opt changes a test endpoint.
type opt func(*model.Endpoint)

// ep builds an endpoint on ip with the watcher's defaults (ready, serving,
// not terminating, not local, no hints), then applies opts.
func ep(ip string, opts ...opt) *model.Endpoint {
	set, bad := model.NewIPSet(ip)
	if len(bad) > 0 {
		panic("bad test IP " + ip)
	}
	e := &model.Endpoint{IPs: set, Ready: true, Serving: true}
	for _, o := range opts {
		o(e)
	}
	return e
}

// local puts the endpoint on this node.
func local(e *model.Endpoint) { e.Local = true }

// notReady makes the endpoint neither ready nor serving nor terminating.
func notReady(e *model.Endpoint) { e.Ready, e.Serving, e.Terminating = false, false, false }

// servingNotReady makes the endpoint serving but neither ready nor
// terminating.
func servingNotReady(e *model.Endpoint) { e.Ready, e.Serving, e.Terminating = false, true, false }

// terminating makes the endpoint serving and terminating (not ready).
func terminating(e *model.Endpoint) { e.Ready, e.Serving, e.Terminating = false, true, true }

// terminatingNotServing makes the endpoint terminating and not serving.
func terminatingNotServing(e *model.Endpoint) {
	e.Ready, e.Serving, e.Terminating = false, false, true
}

func hints(e *model.Endpoint) *model.Hints {
	if e.Hints == nil {
		e.Hints = &model.Hints{}
	}
	return e.Hints
}

// zone gives the endpoint zone hints, naming this node's zone when same.
func zone(same bool) opt {
	return func(e *model.Endpoint) {
		h := hints(e)
		if same {
			h.Zones, h.SameZone = []string{"zone-a"}, true
		} else {
			h.Zones, h.SameZone = []string{"zone-b"}, false
		}
	}
}

// node gives the endpoint node hints, naming this node when same.
func node(same bool) opt {
	return func(e *model.Endpoint) {
		h := hints(e)
		if same {
			h.Nodes, h.SameNode = []string{"this-node"}, true
		} else {
			h.Nodes, h.SameNode = []string{"other-node"}, false
		}
	}
}

// emptyHints gives the endpoint a non-nil Hints with no hint at all.
func emptyHints(e *model.Endpoint) { hints(e) }

// ports sets the endpoint's port overrides.
func ports(m map[string]int32) opt {
	return func(e *model.Endpoint) { e.PortOverrides = m }
}

// keys maps endpoints to their keys; nil for an empty list.
func keys(eps []*model.Endpoint) []string {
	var out []string
	for _, e := range eps {
		out = append(out, e.Key())
	}
	return out
}

// result is Categories plus the verdicts of both policies, with endpoints
// as keys, for readable diffs.
type result struct {
	Cluster []string
	Local   []string
	HasAny  bool
	Mode    TopologyMode

	// ClusterPolicy and LocalPolicy are what Internal returns for a
	// service with internalTrafficPolicy Cluster and Local.
	ClusterPolicy verdict
	LocalPolicy   verdict
}

type verdict struct {
	Endpoints []string
	Verdict   Verdict
}

var (
	svcCluster = &model.Service{Namespace: "ns", Name: "cluster"}
	svcLocal   = &model.Service{Namespace: "ns", Name: "local", InternalTrafficToLocal: true}
)

func summarize(c Categories) result {
	ce, cv := c.Internal(svcCluster)
	le, lv := c.Internal(svcLocal)
	return result{
		Cluster:       keys(c.Cluster),
		Local:         keys(c.Local),
		HasAny:        c.HasAny,
		Mode:          c.TopologyMode,
		ClusterPolicy: verdict{keys(ce), cv},
		LocalPolicy:   verdict{keys(le), lv},
	}
}

// fwd is a Forward verdict to the given endpoints.
func fwd(keys ...string) verdict { return verdict{keys, Forward} }

var (
	reject = verdict{nil, Reject}
	drop   = verdict{nil, Drop}
)

// copyEndpoints deep-copies eps, to check they are not modified.
func copyEndpoints(eps []*model.Endpoint) []*model.Endpoint {
	if eps == nil {
		return nil
	}
	out := make([]*model.Endpoint, len(eps))
	for i, e := range eps {
		c := *e
		c.IPs.V4 = append([]string(nil), e.IPs.V4...)
		c.IPs.V6 = append([]string(nil), e.IPs.V6...)
		if e.Hints != nil {
			h := *e.Hints
			h.Zones = append([]string(nil), e.Hints.Zones...)
			h.Nodes = append([]string(nil), e.Hints.Nodes...)
			c.Hints = &h
		}
		if e.PortOverrides != nil {
			c.PortOverrides = map[string]int32{}
			for k, v := range e.PortOverrides {
				c.PortOverrides[k] = v
			}
		}
		out[i] = &c
	}
	return out
}

func TestCategorize(t *testing.T) {
	for _, tc := range []struct {
		name string
		eps  []*model.Endpoint
		want result
	}{{
		name: "no endpoints: reject",
		eps:  nil,
		want: result{ClusterPolicy: reject, LocalPolicy: reject},
	}, {
		name: "defaults: ready remote endpoints are cluster endpoints, local policy drops",
		eps:  []*model.Endpoint{ep("10.0.0.1"), ep("10.0.0.2"), ep("fd00::1")},
		want: result{
			Cluster:       []string{"10.0.0.1", "10.0.0.2", "fd00::1"},
			HasAny:        true,
			ClusterPolicy: fwd("10.0.0.1", "10.0.0.2", "fd00::1"),
			LocalPolicy:   drop,
		},
	}, {
		name: "output keeps input order",
		eps:  []*model.Endpoint{ep("10.0.0.3", local), ep("10.0.0.1"), ep("10.0.0.2", local)},
		want: result{
			Cluster:       []string{"10.0.0.3", "10.0.0.1", "10.0.0.2"},
			Local:         []string{"10.0.0.3", "10.0.0.2"},
			HasAny:        true,
			ClusterPolicy: fwd("10.0.0.3", "10.0.0.1", "10.0.0.2"),
			LocalPolicy:   fwd("10.0.0.3", "10.0.0.2"),
		},
	}, {
		name: "not ready endpoints are excluded",
		eps: []*model.Endpoint{
			ep("10.0.0.1", notReady), ep("10.0.0.2"),
			ep("10.0.0.3", notReady, local), ep("10.0.0.4", local),
		},
		want: result{
			Cluster:       []string{"10.0.0.2", "10.0.0.4"},
			Local:         []string{"10.0.0.4"},
			HasAny:        true,
			ClusterPolicy: fwd("10.0.0.2", "10.0.0.4"),
			LocalPolicy:   fwd("10.0.0.4"),
		},
	}, {
		name: "only not ready endpoints: reject",
		eps:  []*model.Endpoint{ep("10.0.0.1", notReady), ep("10.0.0.2", notReady, local)},
		want: result{ClusterPolicy: reject, LocalPolicy: reject},
	}, {
		name: "serving but neither ready nor terminating never counts",
		eps:  []*model.Endpoint{ep("10.0.0.1", servingNotReady), ep("10.0.0.2", servingNotReady, local)},
		want: result{ClusterPolicy: reject, LocalPolicy: reject},
	}, {
		name: "no ready endpoint: cluster falls back to serving terminating ones",
		eps: []*model.Endpoint{
			ep("10.0.0.1", terminating), ep("10.0.0.2", notReady),
			ep("10.0.0.3", terminatingNotServing), ep("10.0.0.4", terminating),
		},
		want: result{
			Cluster:       []string{"10.0.0.1", "10.0.0.4"},
			HasAny:        true,
			ClusterPolicy: fwd("10.0.0.1", "10.0.0.4"),
			LocalPolicy:   drop,
		},
	}, {
		name: "terminating but not serving never counts: reject",
		eps: []*model.Endpoint{
			ep("10.0.0.1", terminatingNotServing),
			ep("10.0.0.2", terminatingNotServing, local),
		},
		want: result{ClusterPolicy: reject, LocalPolicy: reject},
	}, {
		name: "ready endpoints are preferred over serving terminating ones",
		eps: []*model.Endpoint{
			ep("10.0.0.1", terminating), ep("10.0.0.2"),
			ep("10.0.0.3", terminating), ep("10.0.0.4"),
		},
		want: result{
			Cluster:       []string{"10.0.0.2", "10.0.0.4"},
			HasAny:        true,
			ClusterPolicy: fwd("10.0.0.2", "10.0.0.4"),
			LocalPolicy:   drop,
		},
	}, {
		name: "zone hints: only endpoints for this zone",
		eps: []*model.Endpoint{
			ep("10.0.0.1", zone(true)), ep("10.0.0.2", zone(false)),
			ep("10.0.0.3", zone(true)), ep("10.0.0.4", zone(false), local),
		},
		want: result{
			Cluster:       []string{"10.0.0.1", "10.0.0.3"},
			Local:         []string{"10.0.0.4"},
			HasAny:        true,
			Mode:          PreferSameZone,
			ClusterPolicy: fwd("10.0.0.1", "10.0.0.3"),
			LocalPolicy:   fwd("10.0.0.4"),
		},
	}, {
		name: "node hints are preferred over zone hints",
		eps: []*model.Endpoint{
			ep("10.0.0.1", zone(true), node(false)),
			ep("10.0.0.2", zone(false), node(true)),
			ep("10.0.0.3", zone(true), node(false)),
		},
		want: result{
			Cluster:       []string{"10.0.0.2"},
			HasAny:        true,
			Mode:          PreferSameNode,
			ClusterPolicy: fwd("10.0.0.2"),
			LocalPolicy:   drop,
		},
	}, {
		name: "node hints only",
		eps: []*model.Endpoint{
			ep("10.0.0.1", node(true)), ep("10.0.0.2", node(false)),
		},
		want: result{
			Cluster:       []string{"10.0.0.1"},
			HasAny:        true,
			Mode:          PreferSameNode,
			ClusterPolicy: fwd("10.0.0.1"),
			LocalPolicy:   drop,
		},
	}, {
		name: "node hints naming no endpoint for this node: zone hints are used",
		eps: []*model.Endpoint{
			ep("10.0.0.1", zone(true), node(false)),
			ep("10.0.0.2", zone(false), node(false)),
		},
		want: result{
			Cluster:       []string{"10.0.0.1"},
			HasAny:        true,
			Mode:          PreferSameZone,
			ClusterPolicy: fwd("10.0.0.1"),
			LocalPolicy:   drop,
		},
	}, {
		name: "one ready endpoint lacks node hints: zone hints are used",
		eps: []*model.Endpoint{
			ep("10.0.0.1", zone(true), node(false)),
			ep("10.0.0.2", zone(false), node(true)),
			ep("10.0.0.3", zone(false)),
		},
		want: result{
			Cluster:       []string{"10.0.0.1"},
			HasAny:        true,
			Mode:          PreferSameZone,
			ClusterPolicy: fwd("10.0.0.1"),
			LocalPolicy:   drop,
		},
	}, {
		name: "one ready endpoint lacks zone hints: hints are ignored",
		eps: []*model.Endpoint{
			ep("10.0.0.1", zone(true)), ep("10.0.0.2", zone(false)), ep("10.0.0.3"),
		},
		want: result{
			Cluster:       []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"},
			HasAny:        true,
			ClusterPolicy: fwd("10.0.0.1", "10.0.0.2", "10.0.0.3"),
			LocalPolicy:   drop,
		},
	}, {
		name: "one ready endpoint has empty non-nil hints: hints are ignored",
		eps: []*model.Endpoint{
			ep("10.0.0.1", zone(true), node(true)), ep("10.0.0.2", emptyHints),
		},
		want: result{
			Cluster:       []string{"10.0.0.1", "10.0.0.2"},
			HasAny:        true,
			ClusterPolicy: fwd("10.0.0.1", "10.0.0.2"),
			LocalPolicy:   drop,
		},
	}, {
		name: "no hint names this node or zone: hints are ignored",
		eps: []*model.Endpoint{
			ep("10.0.0.1", zone(false), node(false)),
			ep("10.0.0.2", zone(false), node(false)),
		},
		want: result{
			Cluster:       []string{"10.0.0.1", "10.0.0.2"},
			HasAny:        true,
			ClusterPolicy: fwd("10.0.0.1", "10.0.0.2"),
			LocalPolicy:   drop,
		},
	}, {
		name: "not ready endpoints without hints do not disable hints",
		eps: []*model.Endpoint{
			ep("10.0.0.1", zone(true)), ep("10.0.0.2", notReady),
			ep("10.0.0.3", terminating), ep("10.0.0.4", zone(false)),
		},
		want: result{
			Cluster:       []string{"10.0.0.1"},
			HasAny:        true,
			Mode:          PreferSameZone,
			ClusterPolicy: fwd("10.0.0.1"),
			LocalPolicy:   drop,
		},
	}, {
		name: "hints of not ready endpoints do not select a mode",
		eps: []*model.Endpoint{
			ep("10.0.0.1", zone(false), node(false)),
			ep("10.0.0.2", notReady, zone(true), node(true)),
			ep("10.0.0.3", terminating, zone(true), node(true)),
			ep("10.0.0.4", zone(false), node(false)),
		},
		want: result{
			Cluster:       []string{"10.0.0.1", "10.0.0.4"},
			HasAny:        true,
			ClusterPolicy: fwd("10.0.0.1", "10.0.0.4"),
			LocalPolicy:   drop,
		},
	}, {
		name: "no ready endpoint: no topology mode, all serving terminating ones",
		eps: []*model.Endpoint{
			ep("10.0.0.1", terminating, zone(true), node(true)),
			ep("10.0.0.2", terminating, zone(false), node(false)),
		},
		want: result{
			Cluster:       []string{"10.0.0.1", "10.0.0.2"},
			HasAny:        true,
			ClusterPolicy: fwd("10.0.0.1", "10.0.0.2"),
			LocalPolicy:   drop,
		},
	}, {
		name: "topology does not filter local endpoints",
		eps: []*model.Endpoint{
			ep("10.0.0.1", zone(true)), ep("10.0.0.2", zone(false), local),
		},
		want: result{
			Cluster:       []string{"10.0.0.1"},
			Local:         []string{"10.0.0.2"},
			HasAny:        true,
			Mode:          PreferSameZone,
			ClusterPolicy: fwd("10.0.0.1"),
			LocalPolicy:   fwd("10.0.0.2"),
		},
	}, {
		name: "local ready endpoints",
		eps: []*model.Endpoint{
			ep("10.0.0.1", local), ep("10.0.0.2"), ep("10.0.0.3", local),
		},
		want: result{
			Cluster:       []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"},
			Local:         []string{"10.0.0.1", "10.0.0.3"},
			HasAny:        true,
			ClusterPolicy: fwd("10.0.0.1", "10.0.0.2", "10.0.0.3"),
			LocalPolicy:   fwd("10.0.0.1", "10.0.0.3"),
		},
	}, {
		name: "local ready endpoints are preferred over local serving terminating ones",
		eps: []*model.Endpoint{
			ep("10.0.0.1", local, terminating), ep("10.0.0.2", local),
			ep("10.0.0.3", terminating),
		},
		want: result{
			Cluster:       []string{"10.0.0.2"},
			Local:         []string{"10.0.0.2"},
			HasAny:        true,
			ClusterPolicy: fwd("10.0.0.2"),
			LocalPolicy:   fwd("10.0.0.2"),
		},
	}, {
		name: "no local ready endpoint: local falls back to serving terminating ones",
		eps: []*model.Endpoint{
			ep("10.0.0.1", local, terminating), ep("10.0.0.2"),
			ep("10.0.0.3", local, terminatingNotServing), ep("10.0.0.4", local, notReady),
			ep("10.0.0.5", local, terminating), ep("10.0.0.6", local, servingNotReady),
		},
		want: result{
			Cluster:       []string{"10.0.0.2"},
			Local:         []string{"10.0.0.1", "10.0.0.5"},
			HasAny:        true,
			ClusterPolicy: fwd("10.0.0.2"),
			LocalPolicy:   fwd("10.0.0.1", "10.0.0.5"),
		},
	}, {
		name: "only local serving terminating endpoints",
		eps:  []*model.Endpoint{ep("10.0.0.1", local, terminating)},
		want: result{
			Cluster:       []string{"10.0.0.1"},
			Local:         []string{"10.0.0.1"},
			HasAny:        true,
			ClusterPolicy: fwd("10.0.0.1"),
			LocalPolicy:   fwd("10.0.0.1"),
		},
	}, {
		name: "no usable local endpoint while others exist: local policy drops",
		eps: []*model.Endpoint{
			ep("10.0.0.1", local, notReady), ep("10.0.0.2", local, terminatingNotServing),
			ep("10.0.0.3", local, servingNotReady), ep("10.0.0.4", terminating),
		},
		want: result{
			Cluster:       []string{"10.0.0.4"},
			HasAny:        true,
			ClusterPolicy: fwd("10.0.0.4"),
			LocalPolicy:   drop,
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			orig := copyEndpoints(tc.eps)
			got := summarize(Categorize(tc.eps))
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Categorize (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(orig, tc.eps); diff != "" {
				t.Errorf("Categorize modified its input (-before +after):\n%s", diff)
			}
		})
	}
}

func TestCategorizePort(t *testing.T) {
	http := &model.PortMapping{Name: "http", Protocol: model.TCP, Port: 80, TargetPort: 8080}
	metrics := &model.PortMapping{Name: "metrics", Protocol: model.TCP, Port: 9090, TargetPortName: "metrics"}
	unnamed := &model.PortMapping{Protocol: model.UDP, Port: 53, TargetPort: 53}

	for _, tc := range []struct {
		name string
		port *model.PortMapping
		eps  []*model.Endpoint
		want result
	}{{
		name: "numeric target port without overrides: all endpoints serve it",
		port: http,
		eps:  []*model.Endpoint{ep("10.0.0.1"), ep("10.0.0.2", local)},
		want: result{
			Cluster:       []string{"10.0.0.1", "10.0.0.2"},
			Local:         []string{"10.0.0.2"},
			HasAny:        true,
			ClusterPolicy: fwd("10.0.0.1", "10.0.0.2"),
			LocalPolicy:   fwd("10.0.0.2"),
		},
	}, {
		name: "override 0 removes the endpoint from the port",
		port: http,
		eps: []*model.Endpoint{
			ep("10.0.0.1", ports(map[string]int32{"http": 0})),
			ep("10.0.0.2", ports(map[string]int32{"http": 8081})),
			ep("10.0.0.3", local, ports(map[string]int32{"http": 0})),
			ep("10.0.0.4", ports(map[string]int32{"metrics": 0})),
		},
		want: result{
			Cluster:       []string{"10.0.0.2", "10.0.0.4"},
			HasAny:        true,
			ClusterPolicy: fwd("10.0.0.2", "10.0.0.4"),
			LocalPolicy:   drop,
		},
	}, {
		name: "named target port: only endpoints with a port for the name",
		port: metrics,
		eps: []*model.Endpoint{
			ep("10.0.0.1", ports(map[string]int32{"metrics": 9100})),
			ep("10.0.0.2"),
			ep("10.0.0.3", local, ports(map[string]int32{"metrics": 9101})),
			ep("10.0.0.4", local, ports(map[string]int32{"metrics": 0})),
		},
		want: result{
			Cluster:       []string{"10.0.0.1", "10.0.0.3"},
			Local:         []string{"10.0.0.3"},
			HasAny:        true,
			ClusterPolicy: fwd("10.0.0.1", "10.0.0.3"),
			LocalPolicy:   fwd("10.0.0.3"),
		},
	}, {
		name: "unnamed port",
		port: unnamed,
		eps: []*model.Endpoint{
			ep("10.0.0.1", ports(map[string]int32{"": 0})),
			ep("10.0.0.2", ports(map[string]int32{"http": 0})),
		},
		want: result{
			Cluster:       []string{"10.0.0.2"},
			HasAny:        true,
			ClusterPolicy: fwd("10.0.0.2"),
			LocalPolicy:   drop,
		},
	}, {
		name: "no endpoint serves the port: reject",
		port: metrics,
		eps:  []*model.Endpoint{ep("10.0.0.1"), ep("10.0.0.2", local)},
		want: result{ClusterPolicy: reject, LocalPolicy: reject},
	}, {
		name: "port filter comes before the serving terminating fallback",
		port: http,
		eps: []*model.Endpoint{
			ep("10.0.0.1", ports(map[string]int32{"http": 0})),
			ep("10.0.0.2", terminating),
		},
		want: result{
			Cluster:       []string{"10.0.0.2"},
			HasAny:        true,
			ClusterPolicy: fwd("10.0.0.2"),
			LocalPolicy:   drop,
		},
	}, {
		name: "port filter comes before the local fallback",
		port: http,
		eps: []*model.Endpoint{
			ep("10.0.0.1", local, ports(map[string]int32{"http": 0})),
			ep("10.0.0.2", local, terminating),
		},
		want: result{
			Cluster:       []string{"10.0.0.2"},
			Local:         []string{"10.0.0.2"},
			HasAny:        true,
			ClusterPolicy: fwd("10.0.0.2"),
			LocalPolicy:   fwd("10.0.0.2"),
		},
	}, {
		name: "port filter comes before the topology mode",
		port: http,
		eps: []*model.Endpoint{
			ep("10.0.0.1", ports(map[string]int32{"http": 0})),
			ep("10.0.0.2", zone(true)),
			ep("10.0.0.3", zone(false)),
		},
		want: result{
			Cluster:       []string{"10.0.0.2"},
			HasAny:        true,
			Mode:          PreferSameZone,
			ClusterPolicy: fwd("10.0.0.2"),
			LocalPolicy:   drop,
		},
	}, {
		name: "nil port keeps all endpoints",
		port: nil,
		eps: []*model.Endpoint{
			ep("10.0.0.1", ports(map[string]int32{"http": 0})),
			ep("10.0.0.2", zone(true)),
			ep("10.0.0.3", zone(false)),
		},
		want: result{
			Cluster:       []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"},
			HasAny:        true,
			ClusterPolicy: fwd("10.0.0.1", "10.0.0.2", "10.0.0.3"),
			LocalPolicy:   drop,
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			orig := copyEndpoints(tc.eps)
			got := summarize(CategorizePort(tc.port, tc.eps))
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("CategorizePort (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(orig, tc.eps); diff != "" {
				t.Errorf("CategorizePort modified its input (-before +after):\n%s", diff)
			}
		})
	}
}

func TestPolicies(t *testing.T) {
	// Cluster and local lists are disjoint so the diff shows which one a
	// helper picked.
	cats := Categories{
		Cluster: []*model.Endpoint{ep("10.0.0.1"), ep("10.0.0.2")},
		Local:   []*model.Endpoint{ep("10.0.0.3", local)},
		HasAny:  true,
	}
	noLocal := Categories{Cluster: cats.Cluster, HasAny: true}
	none := Categories{}

	type both struct{ Internal, External verdict }
	run := func(c Categories, svc *model.Service) both {
		ie, iv := c.Internal(svc)
		ee, ev := c.External(svc)
		return both{verdict{keys(ie), iv}, verdict{keys(ee), ev}}
	}
	svc := func(internalLocal, externalLocal bool) *model.Service {
		return &model.Service{
			Namespace: "ns", Name: "svc", Type: "LoadBalancer",
			InternalTrafficToLocal: internalLocal,
			ExternalTrafficToLocal: externalLocal,
		}
	}
	cluster := fwd("10.0.0.1", "10.0.0.2")
	loc := fwd("10.0.0.3")

	for _, tc := range []struct {
		name string
		cats Categories
		svc  *model.Service
		want both
	}{
		{"both Cluster", cats, svc(false, false), both{cluster, cluster}},
		{"internal Local", cats, svc(true, false), both{loc, cluster}},
		{"external Local", cats, svc(false, true), both{cluster, loc}},
		{"both Local", cats, svc(true, true), both{loc, loc}},
		{"internal Local without local endpoints: drop", noLocal, svc(true, false), both{drop, cluster}},
		{"external Local without local endpoints: drop", noLocal, svc(false, true), both{cluster, drop}},
		{"both Local without local endpoints: drop", noLocal, svc(true, true), both{drop, drop}},
		{"no endpoints, Cluster: reject", none, svc(false, false), both{reject, reject}},
		{"no endpoints, Local: reject", none, svc(true, true), both{reject, reject}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, run(tc.cats, tc.svc)); diff != "" {
				t.Errorf("Internal/External (-want +got):\n%s", diff)
			}
		})
	}
}

func TestOutputDoesNotAliasInput(t *testing.T) {
	eps := []*model.Endpoint{ep("10.0.0.1", local), ep("10.0.0.2")}
	c := Categorize(eps)
	c.Cluster[0] = nil
	c.Local[0] = nil
	_ = append(c.Cluster[:0], ep("10.0.0.9"))
	if diff := cmp.Diff([]string{"10.0.0.1", "10.0.0.2"}, keys(eps)); diff != "" {
		t.Errorf("changing the result changed the input (-want +got):\n%s", diff)
	}
}

func TestVerdictString(t *testing.T) {
	got := []string{Forward.String(), Reject.String(), Drop.String(), Verdict(42).String()}
	want := []string{"Forward", "Reject", "Drop", "Unknown"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Verdict.String (-want +got):\n%s", diff)
	}
}
