// Package endpoints is the endpoint-selection helper every backend shares.
// It reproduces the semantics of kube-proxy's CategorizeEndpoints
// (pkg/proxy/topology.go in Kubernetes) on the client model, so that all
// backends pick the same endpoints for the same service and node.
//
// The rules, applied to the endpoints of one service (and, with
// [CategorizePort], only to those that serve the given service port, as
// told by [model.Endpoint.PortFor]; that filter comes before everything
// else):
//
//   - Topology mode. It is computed from the ready endpoints only. If every
//     ready endpoint has node hints and at least one of them names this
//     node (Hints.SameNode), the mode is [PreferSameNode]. Otherwise, if
//     every ready endpoint has zone hints and at least one of them names
//     this node's zone (Hints.SameZone), the mode is [PreferSameZone].
//     Otherwise there is no mode and hints are ignored. With no ready
//     endpoint the mode is always empty.
//   - Cluster endpoints are the ready endpoints that the topology mode keeps
//     (PreferSameNode keeps SameNode ones, PreferSameZone keeps SameZone
//     ones). When a ready endpoint exists this is never empty. When none is
//     ready, they are the endpoints that are both serving and terminating
//     (the mode is then empty, so all of them). An endpoint that is
//     terminating but not serving is never used.
//   - Local endpoints are the local ready endpoints; when there is none,
//     the local endpoints that are serving and terminating.
//   - HasAny is true when some endpoint is ready, or serving and
//     terminating.
//   - Internal (cluster IP) traffic uses the local endpoints when the
//     service has internalTrafficPolicy: Local, the cluster endpoints
//     otherwise. External traffic (node ports, external IPs, load-balancer
//     IPs) does the same with externalTrafficPolicy.
//   - When the chosen list is empty, a packet is rejected (ICMP unreachable
//     or TCP reset) if the service has no usable endpoint at all, and
//     dropped if it has some but none on this node (Local policy).
//
// The node-specific facts (Local, Hints.SameZone, Hints.SameNode) and the
// condition defaults are computed by the watcher; this package only reads
// them. Outputs keep the order of the inputs, and the input endpoints are
// never modified.
package endpoints

import "sigs.k8s.io/kpng/model"

// TopologyMode is the topology filter applied to cluster endpoints.
type TopologyMode string

// The topology modes, named after spec.trafficDistribution values.
const (
	// NoTopology means hints are ignored: all cluster endpoints are used.
	NoTopology TopologyMode = ""
	// PreferSameZone keeps the endpoints whose zone hints name this
	// node's zone.
	PreferSameZone TopologyMode = "PreferSameZone"
	// PreferSameNode keeps the endpoints whose node hints name this node.
	PreferSameNode TopologyMode = "PreferSameNode"
)

// Categories are a service's endpoints sorted by the traffic they may
// serve on this node.
type Categories struct {
	// Cluster are the endpoints for traffic with the Cluster policy.
	Cluster []*model.Endpoint
	// Local are the endpoints for traffic with the Local policy.
	Local []*model.Endpoint
	// HasAny is true when the service has a usable endpoint anywhere in
	// the cluster (ready, or serving and terminating).
	HasAny bool
	// TopologyMode is the topology filter that was applied to Cluster.
	TopologyMode TopologyMode
}

// Categorize sorts all the endpoints of a service into Categories.
func Categorize(eps []*model.Endpoint) Categories {
	var c Categories
	c.TopologyMode = topologyMode(eps)

	for _, ep := range eps {
		if ep.Ready && keep(ep, c.TopologyMode) {
			c.Cluster = append(c.Cluster, ep)
		}
	}
	if len(c.Cluster) == 0 {
		for _, ep := range eps {
			if servingTerminating(ep) && keep(ep, c.TopologyMode) {
				c.Cluster = append(c.Cluster, ep)
			}
		}
	}

	var localReady bool
	for _, ep := range eps {
		if ep.Ready || servingTerminating(ep) {
			c.HasAny = true
		}
		if ep.Local && ep.Ready {
			localReady = true
		}
	}
	for _, ep := range eps {
		if !ep.Local {
			continue
		}
		if localReady && ep.Ready || !localReady && servingTerminating(ep) {
			c.Local = append(c.Local, ep)
		}
	}
	return c
}

// CategorizePort is Categorize on the endpoints that serve the service
// port p only. A nil p keeps all endpoints.
func CategorizePort(p *model.PortMapping, eps []*model.Endpoint) Categories {
	if p == nil {
		return Categorize(eps)
	}
	var serving []*model.Endpoint
	for _, ep := range eps {
		if _, ok := ep.PortFor(p); ok {
			serving = append(serving, ep)
		}
	}
	return Categorize(serving)
}

// Verdict is what to do with a packet for a service.
type Verdict int

// The verdicts.
const (
	// Forward sends the packet to one of the chosen endpoints; the list
	// is not empty.
	Forward Verdict = iota
	// Reject answers with ICMP unreachable or a TCP reset: the service has
	// no usable endpoint anywhere.
	Reject
	// Drop silently discards the packet: the policy is Local and this
	// node has no usable endpoint, though other nodes do.
	Drop
)

// String returns the verdict's name.
func (v Verdict) String() string {
	switch v {
	case Forward:
		return "Forward"
	case Reject:
		return "Reject"
	case Drop:
		return "Drop"
	}
	return "Unknown"
}

// Internal returns the endpoints for traffic to svc's cluster IPs, following
// its internalTrafficPolicy, and what to do with the packets.
func (c Categories) Internal(svc *model.Service) ([]*model.Endpoint, Verdict) {
	return c.choose(svc.InternalTrafficToLocal)
}

// External returns the endpoints for traffic to svc's node ports, external
// IPs and load-balancer IPs, following its externalTrafficPolicy, and what
// to do with the packets.
func (c Categories) External(svc *model.Service) ([]*model.Endpoint, Verdict) {
	return c.choose(svc.ExternalTrafficToLocal)
}

func (c Categories) choose(local bool) ([]*model.Endpoint, Verdict) {
	eps := c.Cluster
	if local {
		eps = c.Local
	}
	switch {
	case len(eps) > 0:
		return eps, Forward
	case !c.HasAny:
		return nil, Reject
	}
	return nil, Drop
}

// topologyMode computes the topology mode from the ready endpoints.
func topologyMode(eps []*model.Endpoint) TopologyMode {
	allNode, anyNode := true, false
	allZone, anyZone := true, false
	for _, ep := range eps {
		if !ep.Ready {
			continue
		}
		h := ep.Hints
		if h == nil {
			h = &model.Hints{}
		}
		if len(h.Nodes) == 0 {
			allNode = false
		} else if h.SameNode {
			anyNode = true
		}
		if len(h.Zones) == 0 {
			allZone = false
		} else if h.SameZone {
			anyZone = true
		}
	}
	switch {
	case allNode && anyNode:
		return PreferSameNode
	case allZone && anyZone:
		return PreferSameZone
	}
	return NoTopology
}

// keep reports whether the topology mode lets ep serve this node.
func keep(ep *model.Endpoint, mode TopologyMode) bool {
	switch mode {
	case PreferSameNode:
		return ep.Hints != nil && ep.Hints.SameNode
	case PreferSameZone:
		return ep.Hints != nil && ep.Hints.SameZone
	}
	return true
}

func servingTerminating(ep *model.Endpoint) bool {
	return ep.Serving && ep.Terminating
}
