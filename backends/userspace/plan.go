package userspace

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"sigs.k8s.io/kpng/model"
	"sigs.k8s.io/kpng/model/endpoints"
)

// frontendKey is where a frontend listens: a protocol on an address and
// port.
type frontendKey struct {
	proto model.Protocol
	addr  netip.AddrPort
}

func (k frontendKey) String() string { return fmt.Sprintf("%s %s", k.proto, k.addr) }

// kind is the kind of service address a frontend serves.
type kind int

const (
	clusterIP kind = iota
	externalIP
	loadBalancerIP
	nodePort
)

// holdsAddress reports whether the proxier must hold the frontend's
// address on its interface (every kind but node ports, which listen on
// the node's own addresses).
func (k kind) holdsAddress() bool { return k != nodePort }

// field is the field of the Service the frontends of kind k come from.
func (k kind) field() string {
	switch k {
	case clusterIP:
		return "spec.clusterIPs"
	case externalIP:
		return "spec.externalIPs"
	case loadBalancerIP:
		return "status.loadBalancer.ingress"
	}
	return "spec.ports[].nodePort"
}

// route is what a frontend does with a new connection or flow. A route is
// never modified once built: a change is a new route.
type route struct {
	service model.ServiceKey
	port    string
	kind    kind
	// verdict and targets are for every client, unless shortCircuit.
	verdict endpoints.Verdict
	targets []netip.AddrPort
	// shortCircuit is set for external traffic with the Local policy:
	// clients on the node itself or inside the cluster CIDRs use
	// clusterVerdict and clusterTargets, the cluster endpoints, instead
	// (kube-proxy's short-circuits).
	shortCircuit   bool
	clusterVerdict endpoints.Verdict
	clusterTargets []netip.AddrPort
	// affinity is the ClientIP session affinity timeout, 0 without.
	affinity time.Duration
	// sourceRanges, when not empty, are the only clients allowed
	// (load-balancer IPs with loadBalancerSourceRanges); when one holds a
	// node address (rangesHoldNode), the node itself is allowed too, as
	// with kube-proxy.
	sourceRanges   []netip.Prefix
	rangesHoldNode bool
}

// listens reports whether the frontend needs a socket. A frontend that
// rejects everything has none, so that the kernel itself refuses its
// traffic: a TCP reset, or ICMP port unreachable for UDP.
func (r *route) listens() bool {
	return r.verdict != endpoints.Reject || (r.shortCircuit && r.clusterVerdict != endpoints.Reject)
}

// equal reports whether two routes do the same.
func (r *route) equal(o *route) bool {
	return r.service == o.service && r.port == o.port && r.kind == o.kind &&
		r.verdict == o.verdict && slices.Equal(r.targets, o.targets) &&
		r.shortCircuit == o.shortCircuit && r.clusterVerdict == o.clusterVerdict &&
		slices.Equal(r.clusterTargets, o.clusterTargets) && r.affinity == o.affinity &&
		slices.Equal(r.sourceRanges, o.sourceRanges) && r.rangesHoldNode == o.rangesHoldNode
}

// node is what planning needs to know of the node.
type node struct {
	// ips are the node's addresses.
	ips []netip.Addr
	// nodePortAddrs are the addresses node ports listen on.
	nodePortAddrs []netip.Addr
	// clusterCIDRs are the pods' networks.
	clusterCIDRs []netip.Prefix
}

// plan returns the frontends of one service seen from n, and the
// problems found in it (each naming the service and the field; the rest
// of the service is still planned).
func plan(se *model.ServiceEndpoints, n node) (map[frontendKey]*route, []error) {
	svc := se.Service
	key := svc.Key()
	out := map[frontendKey]*route{}
	ranges, problems := svc.UsableSourceRanges()
	var affinity time.Duration
	if svc.ClientIPAffinity != nil {
		affinity = time.Duration(svc.ClientIPAffinity.TimeoutSeconds) * time.Second
		if affinity <= 0 {
			affinity = model.DefaultAffinityTimeoutSeconds * time.Second
		}
	}
	ports, nodePorts, portProblems := svc.UsablePorts(func(p model.Protocol) bool { return p == model.TCP || p == model.UDP })
	// External and load-balancer IPs of a family without a cluster IP
	// are left alone, as kube-proxy does (but for headless services).
	servedExternal, servedLB, addrProblems := svc.ServedExternalIPs()
	problems = append(append(problems, portProblems...), addrProblems...)
	for i, p := range ports {
		nodePortNum := nodePorts[i]
		for _, v4 := range []bool{true, false} {
			var clusterIPs []netip.Addr
			if !svc.IPs.Headless {
				clusterIPs = familyAddrs(svc.IPs.ClusterIPs, v4)
			}
			externalIPs := familyAddrs(servedExternal, v4)
			lbIPs := familyAddrs(servedLB, v4)
			// As kube-proxy, one proxier per family: a node port is
			// served in a family where the service has a cluster IP.
			var nodePorts []netip.Addr
			if nodePortNum > 0 && len(familyAddrs(svc.IPs.ClusterIPs, v4)) > 0 {
				nodePorts = familyOnly(n.nodePortAddrs, v4)
			}
			if len(clusterIPs)+len(externalIPs)+len(lbIPs)+len(nodePorts) == 0 {
				continue
			}
			cats := endpoints.CategorizePort(p, familyEndpoints(se.Endpoints, v4))
			internal, iv := cats.Internal(svc)
			internalTargets := targetsOf(internal, p, v4)
			base := route{service: key, port: p.Name, affinity: affinity}
			cluster := base
			cluster.kind, cluster.verdict, cluster.targets = clusterIP, iv, internalTargets
			for _, a := range clusterIPs {
				add(out, &problems, frontendKey{p.Protocol, netip.AddrPortFrom(a, uint16(p.Port))}, &cluster)
			}
			external, ev := cats.External(svc)
			ext := base
			ext.verdict, ext.targets = ev, targetsOf(external, p, v4)
			if svc.ExternalTrafficToLocal {
				// As kube-proxy: the short-circuited clients use the
				// cluster endpoints, whatever internalTrafficPolicy.
				ext.shortCircuit, ext.clusterTargets = true, targetsOf(cats.Cluster, p, v4)
				if ext.clusterVerdict = endpoints.Forward; len(ext.clusterTargets) == 0 {
					ext.clusterVerdict = endpoints.Reject
				}
			}
			for _, a := range externalIPs {
				r := ext
				r.kind = externalIP
				add(out, &problems, frontendKey{p.Protocol, netip.AddrPortFrom(a, uint16(p.Port))}, &r)
			}
			lb := ext
			lb.kind = loadBalancerIP
			lb.sourceRanges = familyPrefixes(ranges, v4)
			for _, a := range n.ips {
				lb.rangesHoldNode = lb.rangesHoldNode || inAny(lb.sourceRanges, a)
			}
			for _, a := range lbIPs {
				add(out, &problems, frontendKey{p.Protocol, netip.AddrPortFrom(a, uint16(p.Port))}, &lb)
			}
			np := ext
			np.kind = nodePort
			for _, a := range nodePorts {
				add(out, &problems, frontendKey{p.Protocol, netip.AddrPortFrom(a, uint16(nodePortNum))}, &np)
			}
		}
	}
	return out, problems
}

// add records r at k unless the service already uses k (the same address
// as a cluster and an external IP, say): the first use is kept.
func add(out map[frontendKey]*route, problems *[]error, k frontendKey, r *route) {
	if first, ok := out[k]; ok {
		*problems = append(*problems, model.NewProblem(r.service, r.kind.field(), model.ReasonAddressConflict,
			"service %s port %q: %s already used by port %q: ignored", r.service, r.port, k, first.port))
		return
	}
	out[k] = r
}

// familyAddrs parses the addresses of one family of s: those of its list
// of that family that are of that family (the model holds them valid and
// canonical when it comes from kpng's watcher or a state file; a model
// made by other code may hold an IPv4 address in V6, which a frontend of
// IPv6 must not target).
func familyAddrs(s model.IPSet, v4 bool) []netip.Addr {
	list := s.V6
	if v4 {
		list = s.V4
	}
	out := make([]netip.Addr, 0, len(list))
	for _, a := range list {
		if ip, err := netip.ParseAddr(a); err == nil && ip.Unmap().Is4() == v4 {
			out = append(out, ip.Unmap())
		}
	}
	return out
}

// familyOnly returns the addresses of one family.
func familyOnly(addrs []netip.Addr, v4 bool) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		if a.Is4() == v4 {
			out = append(out, a)
		}
	}
	return out
}

// familyPrefixes returns the prefixes of one family.
func familyPrefixes(ps []netip.Prefix, v4 bool) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if p.Addr().Is4() == v4 {
			out = append(out, p)
		}
	}
	return out
}

// familyEndpoints returns the endpoints with an address of one family.
func familyEndpoints(eps []*model.Endpoint, v4 bool) []*model.Endpoint {
	var out []*model.Endpoint
	for _, e := range eps {
		if e == nil {
			continue
		}
		if (v4 && len(e.IPs.V4) > 0) || (!v4 && len(e.IPs.V6) > 0) {
			out = append(out, e)
		}
	}
	return out
}

// targetsOf returns the address and port each endpoint serves p on, in
// the endpoints' order.
func targetsOf(eps []*model.Endpoint, p *model.PortMapping, v4 bool) []netip.AddrPort {
	out := make([]netip.AddrPort, 0, len(eps))
	for _, e := range eps {
		port, ok := e.PortFor(p)
		if !ok || port <= 0 || port > 65535 {
			continue
		}
		if addrs := familyAddrs(e.IPs, v4); len(addrs) > 0 {
			out = append(out, netip.AddrPortFrom(addrs[0], uint16(port)))
		}
	}
	return out
}
