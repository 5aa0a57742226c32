package model

import "slices"

// Node is the node a state is seen from: it decides which endpoints are
// Local and which topology hints match.
type Node struct {
	// Name is the node's name; empty means no endpoint is local and no
	// node hint matches.
	Name string
	// Zone is the node's topology.kubernetes.io/zone label; empty means no
	// zone hint matches.
	Zone string
}

// View returns ep as seen from n: Local, Hints.SameZone and Hints.SameNode
// computed for n. It returns ep itself when they are already right, and a
// copy otherwise; ep is never modified.
func (n Node) View(ep *Endpoint) *Endpoint {
	local := n.Name != "" && ep.NodeName == n.Name
	var sameZone, sameNode bool
	if h := ep.Hints; h != nil {
		sameZone = n.Zone != "" && slices.Contains(h.Zones, n.Zone)
		sameNode = n.Name != "" && slices.Contains(h.Nodes, n.Name)
	}
	if local == ep.Local && (ep.Hints == nil || (sameZone == ep.Hints.SameZone && sameNode == ep.Hints.SameNode)) {
		return ep
	}
	out := *ep
	out.Local = local
	if ep.Hints != nil {
		h := *ep.Hints
		h.SameZone, h.SameNode = sameZone, sameNode
		out.Hints = &h
	}
	return &out
}

// ViewService returns se as seen from n (see View). It returns se itself
// when no endpoint changes.
func (n Node) ViewService(se *ServiceEndpoints) *ServiceEndpoints {
	var eps []*Endpoint
	for i, ep := range se.Endpoints {
		v := n.View(ep)
		if v != ep && eps == nil {
			eps = slices.Clone(se.Endpoints[:i:i])
		}
		if eps != nil {
			eps = append(eps, v)
		}
	}
	if eps == nil {
		return se
	}
	return &ServiceEndpoints{Service: se.Service, Endpoints: eps}
}
