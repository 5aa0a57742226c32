package nft

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"

	"sigs.k8s.io/kpng/client/endpoints"
	"sigs.k8s.io/kpng/client/model"
)

// serviceObjects are the chains and map elements that implement one
// service.
type serviceObjects struct {
	Chains   []*Chain
	Elements []Element
}

// buildService computes the objects of one service as seen from this node
// (the endpoints' Local and hints are already computed for it). Parts of
// the service that cannot be programmed (unknown protocol, port out of
// range, bad address) are left out and reported in problems; the rest is
// built.
func buildService(se *model.ServiceEndpoints) (serviceObjects, []error) {
	var objs serviceObjects
	var problems []error
	svc := se.Service
	if svc == nil {
		return objs, nil
	}
	key := svc.Key()
	epChains := map[string]bool{}
	for _, p := range svc.Ports {
		if p == nil {
			continue
		}
		if _, ok := l4proto(p.Protocol); !ok {
			problems = append(problems, fmt.Errorf("service %s port %q: protocol %d not supported", key, p.Name, p.Protocol))
			continue
		}
		if p.Port <= 0 || p.Port > 65535 {
			problems = append(problems, fmt.Errorf("service %s port %q: port %d out of range", key, p.Name, p.Port))
			continue
		}
		for _, f := range []Family{IPv4, IPv6} {
			var clusterIPs []string
			if !svc.IPs.Headless {
				clusterIPs = familyAddrs(svc.IPs.ClusterIPs, f)
			}
			externalIPs := familyAddrs(svc.IPs.ExternalIPs, f)
			if len(clusterIPs) == 0 && len(externalIPs) == 0 {
				continue
			}
			// As kube-proxy, which runs one proxier per family: only the
			// endpoints of this family count, also for reject vs forward.
			cats := endpoints.CategorizePort(p, familyEndpoints(se.Endpoints, f))
			b := portBuilder{key: key, port: p, family: f, objs: &objs, epChains: epChains, problems: &problems}
			internal, iv := cats.Internal(svc)
			clusterTarget := b.target("svc", internal, iv)
			b.elements(clusterIPs, clusterTarget, iv)
			if len(externalIPs) > 0 {
				external, ev := cats.External(svc)
				target := clusterTarget
				if ev != iv || !slices.Equal(external, internal) {
					target = b.target("ext", external, ev)
				}
				b.elements(externalIPs, target, ev)
			}
		}
	}
	return objs, problems
}

// portBuilder builds the objects of one service port and family.
type portBuilder struct {
	key      model.ServiceKey
	port     *model.PortMapping
	family   Family
	objs     *serviceObjects
	epChains map[string]bool
	problems *[]error
}

// target returns the verdict for traffic using eps with verdict v: goto a
// new service chain of the given kind balancing over eps' endpoint chains
// (Forward), goto the reject chain (Reject), or drop (Drop).
func (b *portBuilder) target(kind string, eps []*model.Endpoint, v endpoints.Verdict) Verdict {
	switch v {
	case endpoints.Reject:
		return Verdict{Goto: ChainReject}
	case endpoints.Drop:
		return Verdict{}
	}
	var targets []string
	for _, ep := range eps {
		if name, ok := b.endpointChain(ep); ok {
			targets = append(targets, name)
		}
	}
	if len(targets) == 0 {
		// Every endpoint was unusable (reported): as if there were none.
		return Verdict{Goto: ChainReject}
	}
	name := serviceChainName(kind, b.family, b.key, b.port)
	b.objs.Chains = append(b.objs.Chains, &Chain{Name: name, Service: b.key, Rules: []Rule{BalanceRule{Targets: targets}}})
	return Verdict{Goto: name}
}

// endpointChain adds (once) the chain DNATing to ep and returns its name.
func (b *portBuilder) endpointChain(ep *model.Endpoint) (string, bool) {
	text := ep.Key()
	if as := familyAddrs(ep.IPs, b.family); len(as) > 0 {
		text = as[0]
	}
	addr, err := netip.ParseAddr(text)
	if err != nil || familyOf(addr.Unmap()) != b.family {
		*b.problems = append(*b.problems, fmt.Errorf("service %s: endpoint %q is not an %s address", b.key, text, b.family))
		return "", false
	}
	port, ok := ep.PortFor(b.port)
	if !ok || port <= 0 || port > 65535 {
		*b.problems = append(*b.problems, fmt.Errorf("service %s port %q: endpoint %s: target port %d out of range", b.key, b.port.Name, addr, port))
		return "", false
	}
	to := netip.AddrPortFrom(addr.Unmap(), uint16(port))
	name := endpointChainName(b.family, b.key, b.port, to.Addr().String()+"/"+strconv.Itoa(int(port)))
	if !b.epChains[name] {
		b.epChains[name] = true
		b.objs.Chains = append(b.objs.Chains, &Chain{Name: name, Service: b.key, Rules: []Rule{DNATRule{Proto: b.port.Protocol, To: to}}})
	}
	return name, true
}

// elements adds, for each address, the element sending the service port
// to target: in the service map when forwarding, in the no-endpoint map
// otherwise.
func (b *portBuilder) elements(addrs []string, target Verdict, v endpoints.Verdict) {
	m := MapServices(b.family)
	if v != endpoints.Forward || target.Goto == ChainReject {
		m = MapNoEndpoints(b.family)
	}
	for _, a := range addrs {
		addr, err := netip.ParseAddr(a)
		if err != nil || familyOf(addr.Unmap()) != b.family {
			*b.problems = append(*b.problems, fmt.Errorf("service %s: bad %s address %q", b.key, b.family, a))
			continue
		}
		b.objs.Elements = append(b.objs.Elements, Element{
			Map:     m,
			Family:  b.family,
			Key:     Key{Addr: addr.Unmap(), Proto: b.port.Protocol, Port: uint16(b.port.Port)},
			Verdict: target,
			Service: b.key,
		})
	}
}

// familyAddrs returns the addresses of s of family f.
func familyAddrs(s model.IPSet, f Family) []string {
	if f == IPv6 {
		return s.V6
	}
	return s.V4
}

// familyEndpoints returns the endpoints whose address is of family f.
func familyEndpoints(eps []*model.Endpoint, f Family) []*model.Endpoint {
	var out []*model.Endpoint
	for _, ep := range eps {
		if len(familyAddrs(ep.IPs, f)) > 0 {
			out = append(out, ep)
		}
	}
	return out
}

// l4proto returns the IP protocol number of p.
func l4proto(p model.Protocol) (byte, bool) {
	switch p {
	case model.TCP:
		return 6, true
	case model.UDP:
		return 17, true
	case model.SCTP:
		return 132, true
	}
	return 0, false
}
