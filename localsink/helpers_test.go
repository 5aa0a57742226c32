package localsink_test

import (
	"maps"
	"reflect"
	"slices"

	"github.com/google/go-cmp/cmp"

	"sigs.k8s.io/kpng/model"
)

// countSink is a no-op Sink counting its calls.
type countSink struct {
	resets, updates, syncs int
}

func (c *countSink) Reset() { c.resets++ }
func (c *countSink) Update(model.ServiceKey, *model.ServiceEndpoints, *model.ServiceEndpoints) {
	c.updates++
}
func (c *countSink) Sync() error { c.syncs++; return nil }

func key(ns, name string) model.ServiceKey { return model.ServiceKey{Namespace: ns, Name: name} }

// testService returns a ClusterIP service with one TCP port.
func testService(ns, name string) *model.Service {
	return &model.Service{
		Namespace: ns,
		Name:      name,
		Type:      "ClusterIP",
		IPs:       model.ServiceIPs{ClusterIPs: model.IPSet{V4: []string{"10.96.0.1"}}},
		Ports:     []*model.PortMapping{{Name: "http", Protocol: model.TCP, Port: 80, TargetPort: 8080}},
	}
}

// testEndpoint returns a ready endpoint with address addr.
func testEndpoint(addr string) *model.Endpoint {
	set, bad := model.NewIPSet(addr)
	if len(bad) != 0 {
		panic("bad test address " + addr)
	}
	return &model.Endpoint{IPs: set, Ready: true, Serving: true}
}

func endpoints(addrs ...string) []*model.Endpoint {
	eps := make([]*model.Endpoint, 0, len(addrs))
	for _, a := range addrs {
		eps = append(eps, testEndpoint(a))
	}
	return eps
}

func svcEps(svc *model.Service, eps ...*model.Endpoint) *model.ServiceEndpoints {
	if eps == nil {
		eps = []*model.Endpoint{}
	}
	return &model.ServiceEndpoints{Service: svc, Endpoints: eps}
}

// deepCopy returns a deep copy of a full state, keeping nil and empty
// slices and maps apart.
func deepCopy(items []*model.ServiceEndpoints) []*model.ServiceEndpoints {
	if items == nil {
		return nil
	}
	out := make([]*model.ServiceEndpoints, len(items))
	for i, se := range items {
		if se == nil {
			continue
		}
		c := &model.ServiceEndpoints{Service: copyService(se.Service)}
		if se.Endpoints != nil {
			c.Endpoints = make([]*model.Endpoint, len(se.Endpoints))
			for j, ep := range se.Endpoints {
				c.Endpoints[j] = copyEndpoint(ep)
			}
		}
		out[i] = c
	}
	return out
}

func copyIPSet(s model.IPSet) model.IPSet {
	return model.IPSet{V4: slices.Clone(s.V4), V6: slices.Clone(s.V6)}
}

func copyService(s *model.Service) *model.Service {
	if s == nil {
		return nil
	}
	c := *s
	c.Labels = maps.Clone(s.Labels)
	c.IPs = model.ServiceIPs{
		ClusterIPs:      copyIPSet(s.IPs.ClusterIPs),
		ExternalIPs:     copyIPSet(s.IPs.ExternalIPs),
		LoadBalancerIPs: copyIPSet(s.IPs.LoadBalancerIPs),
		Headless:        s.IPs.Headless,
	}
	if s.Ports != nil {
		c.Ports = make([]*model.PortMapping, len(s.Ports))
		for i, p := range s.Ports {
			pc := *p
			c.Ports[i] = &pc
		}
	}
	if s.ClientIPAffinity != nil {
		a := *s.ClientIPAffinity
		c.ClientIPAffinity = &a
	}
	c.LoadBalancerSourceRanges = slices.Clone(s.LoadBalancerSourceRanges)
	return &c
}

func copyEndpoint(e *model.Endpoint) *model.Endpoint {
	if e == nil {
		return nil
	}
	c := *e
	c.IPs = copyIPSet(e.IPs)
	if e.Hints != nil {
		h := *e.Hints
		h.Zones = slices.Clone(e.Hints.Zones)
		h.Nodes = slices.Clone(e.Hints.Nodes)
		c.Hints = &h
	}
	c.PortOverrides = maps.Clone(e.PortOverrides)
	return &c
}

// stateDiff returns cmp.Diff(want, got), checking first with
// reflect.DeepEqual (the same equality for the model's types, which have no
// unexported fields) since cmp is slow on equal nested slices.
func stateDiff(want, got []*model.ServiceEndpoints) string {
	if reflect.DeepEqual(want, got) {
		return ""
	}
	if d := cmp.Diff(want, got); d != "" {
		return d
	}
	return "reflect.DeepEqual and cmp.Diff disagree"
}
