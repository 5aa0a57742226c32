package nft

import (
	"net/netip"
	"slices"
	"strconv"
	"time"

	"sigs.k8s.io/kpng/model"
	"sigs.k8s.io/kpng/model/endpoints"
)

// serviceObjects are the chains, sets and map elements that implement one
// service.
type serviceObjects struct {
	Chains   []*regularChain
	Sets     []*namedSet
	Elements []mapElement
	// Blocks are the endpoint blocks of the service's chains (their
	// elements are theirs: block.appendElements, once the tracker has
	// placed them).
	Blocks []*block
	// Hairpin are the addresses of the service's endpoints that may run
	// on this node (a pod may reach itself through the service; see
	// hairsPin), without repeats.
	Hairpin []netip.Addr
	// ClusterIPs are the service's cluster IPs, without repeats: traffic
	// to them on a port no service defines is rejected, never routed out.
	ClusterIPs []netip.Addr
}

// buildService computes the objects of one service as seen from this node
// (the endpoints' Local and hints are already computed for it). Parts of
// the service that cannot be programmed (unknown protocol, port out of
// range, bad address) are left out and reported in problems; the rest is
// built.
func buildService(se *model.ServiceEndpoints, opts Options) (serviceObjects, []error) {
	var objs serviceObjects
	var problems []error
	svc := se.Service
	if svc == nil || (svc.IPs.Headless && opts.IgnoreHeadless) {
		return objs, nil
	}
	key := svc.Key()
	epChains := map[string]bool{}
	ranges, rangeProblems := svc.UsableSourceRanges()
	ports, nodePorts, portProblems := svc.UsablePorts(func(p model.Protocol) bool { _, ok := l4proto(p); return ok })
	// External and load-balancer IPs of a family without a cluster IP
	// are left alone, as kube-proxy does (but for headless services).
	servedExternal, servedLB, addrProblems := svc.ServedExternalIPs()
	problems = append(append(append(problems, rangeProblems...), portProblems...), addrProblems...)
	for i, p := range ports {
		nodePort := nodePorts[i]
		for _, f := range []ipFamily{ipv4, ipv6} {
			var clusterIPs []string
			if !svc.IPs.Headless {
				clusterIPs = familyAddrs(svc.IPs.ClusterIPs, f)
			}
			externalIPs := familyAddrs(servedExternal, f)
			lbIPs := familyAddrs(servedLB, f)
			// A node port is served in a family only if the service
			// has a cluster IP in it (as kube-proxy, whose per-family
			// proxiers only see the service in its own families).
			hasNodePort := nodePort > 0 && len(familyAddrs(svc.IPs.ClusterIPs, f)) > 0
			if len(clusterIPs) == 0 && len(externalIPs) == 0 && len(lbIPs) == 0 && !hasNodePort {
				continue
			}
			// As kube-proxy, which runs one proxier per family: only the
			// endpoints of this family count, also for reject vs forward.
			cats := endpoints.CategorizePort(p, familyEndpoints(se.Endpoints, f))
			b := portBuilder{svc: svc, key: key, port: p, family: f, opts: opts, objs: &objs, epChains: epChains, problems: &problems}
			internal, iv := cats.Internal(svc)
			// Masquerading of cluster-IP traffic (kube-proxy's
			// --masquerade-all / --cluster-cidr): only for packets to the
			// cluster IPs, not for those the Local-policy short-circuits
			// send through the same chain.
			var clusterMasq []rule
			if cidrs := prefixesOf(opts.ClusterCIDRs, f); opts.MasqueradeAll || len(cidrs) > 0 {
				if opts.MasqueradeAll {
					cidrs = nil
				}
				for _, a := range clusterIPs {
					if addr, err := netip.ParseAddr(a); err == nil && familyOf(addr.Unmap()) == f {
						clusterMasq = append(clusterMasq, markRule{Family: f, Dst: addr.Unmap(), Except: cidrs})
					}
				}
			}
			if !opts.NoShardMaps {
				b.shard = shardKeyFor(svc, clusterIPs, externalIPs, lbIPs, hasNodePort, p, f)
			}
			clusterTarget := b.target("svc", clusterMasq, internal, iv)
			b.elements(mapServices(f), mapNoEndpoints(f), "clusterIPs", clusterIPs, 0, clusterTarget, iv)
			if len(externalIPs) == 0 && len(lbIPs) == 0 && !hasNodePort {
				continue
			}
			external, ev := cats.External(svc)
			target, alsoDrop := b.externalTarget(external, ev, internal, iv, clusterTarget, clusterMasq, cats.Cluster)
			add := func(forward, blocked, field string, addrs []string, nodePort uint16) {
				if !alsoDrop {
					b.elements(forward, blocked, field, addrs, nodePort, target, ev)
					return
				}
				// Local policy without a local endpoint: the external
				// chain takes pods and the node itself to the cluster
				// endpoints; what it leaves is not DNATed and meets the
				// drop element in the filter hooks.
				b.elements(forward, blocked, field, addrs, nodePort, target, endpoints.Forward)
				b.elements(forward, blocked, field, addrs, nodePort, verdict{}, endpoints.Drop)
			}
			add(mapServices(f), mapNoEndpoints(f), "externalIPs", externalIPs, 0)
			add(mapServices(f), mapNoEndpoints(f), "loadBalancer ingress IPs", lbIPs, 0)
			if hasNodePort {
				add(mapNodePorts(f), mapNoEndpointNodePorts(f), "nodePort", []string{""}, uint16(nodePort))
			}
			// As kube-proxy: the ranges of this family restrict its
			// load-balancer IPs; without any, they are open.
			if allowed := prefixesOf(ranges, f); len(allowed) > 0 && len(lbIPs) > 0 {
				b.firewall(lbIPs, allowed)
			}
		}
	}
	slices.SortFunc(objs.Hairpin, netip.Addr.Compare)
	objs.Hairpin = slices.Compact(objs.Hairpin)
	if !svc.IPs.Headless {
		for _, a := range svc.IPs.ClusterIPs.All() {
			if addr, err := netip.ParseAddr(a); err == nil && addr.Zone() == "" {
				objs.ClusterIPs = append(objs.ClusterIPs, addr.Unmap())
			}
		}
		slices.SortFunc(objs.ClusterIPs, netip.Addr.Compare)
		objs.ClusterIPs = slices.Compact(objs.ClusterIPs)
	}
	return objs, problems
}

// portBuilder builds the objects of one service port and family.
type portBuilder struct {
	svc      *model.Service
	key      model.ServiceKey
	port     *model.PortMapping
	family   ipFamily
	opts     Options
	objs     *serviceObjects
	epChains map[string]bool
	problems *[]error
	// shard is the key of the port in the shard maps when it is plain
	// enough to be served there (shardKeyFor); Addr not valid otherwise.
	shard mapKey
}

// shardKeyFor returns the key in the shard maps of service port p of
// family f (cluster IP, protocol, port) when it can be served there: a
// cluster IP only (no external or load-balancer IP, no node port), one in
// the family, and no session affinity. The key's Addr is not valid
// otherwise.
func shardKeyFor(svc *model.Service, clusterIPs, externalIPs, lbIPs []string, hasNodePort bool, p *model.PortMapping, f ipFamily) mapKey {
	if svc.ClientIPAffinity != nil || len(clusterIPs) != 1 || len(externalIPs) > 0 || len(lbIPs) > 0 || hasNodePort {
		return mapKey{}
	}
	addr, err := netip.ParseAddr(clusterIPs[0])
	if err != nil || addr.Zone() != "" || familyOf(addr.Unmap()) != f {
		return mapKey{}
	}
	return mapKey{Addr: addr.Unmap(), Proto: p.Protocol, Port: uint16(p.Port)}
}

// target returns the verdict for traffic using eps with verdict v: goto a
// new service chain of the given kind (first rules, then the choice among
// eps) for Forward, goto the reject chain for Reject, or drop for Drop.
// The chain DNATs to a block of an endpoint map; with session affinity, it
// goes to endpoint chains through a balance map instead, after the
// affinity checks.
func (b *portBuilder) target(kind string, first []rule, eps []*model.Endpoint, v endpoints.Verdict) verdict {
	switch v {
	case endpoints.Reject:
		return verdict{Goto: chainReject}
	case endpoints.Drop:
		return verdict{}
	}
	var tos []netip.AddrPort
	for _, ep := range eps {
		if to, ok := b.endpointAddr(ep); ok {
			tos = append(tos, to)
		}
	}
	if len(tos) == 0 {
		// Every endpoint was unusable (reported): as if there were none.
		return verdict{Goto: chainReject}
	}
	if kind == "svc" && b.shard.Addr.IsValid() && len(tos) <= maxShardEndpoints {
		// A plain service port: its endpoints in its shard's map, the
		// masquerading rule in the shard's chain (shards.go).
		id := kind + familySuffix(b.family) + "/" + portID(b.key, b.port)
		n := uint32(len(tos))
		b.objs.Blocks = append(b.objs.Blocks, &block{ID: id, Family: b.family, Service: b.key, Endpoints: tos, Shard: b.shard, ShardIdx: n})
		return verdict{Goto: shardChainName(b.family, n), Shard: n, Block: id}
	}
	name := serviceChainName(kind, b.family, b.key, b.port)
	rules := slices.Clip(first)
	if b.svc.ClientIPAffinity == nil {
		id := kind + familySuffix(b.family) + "/" + portID(b.key, b.port)
		b.objs.Blocks = append(b.objs.Blocks, &block{ID: id, Family: b.family, Service: b.key, Endpoints: tos})
		rules = append(rules, dnatMapRule{Family: b.family, Proto: b.port.Protocol, Block: id})
	} else {
		var targets []string
		for _, to := range tos {
			name, set := b.endpointChain(to)
			targets = append(targets, name)
			rules = append(rules, affinityCheckRule{Family: b.family, Set: set, Goto: name})
		}
		balance := balanceRule{Targets: targets}
		if len(targets) > 1 {
			balance.Map = balanceMapName(b.family, kind, b.key, b.port, targets)
			b.objs.Sets = append(b.objs.Sets, &namedSet{Name: balance.Map, Family: b.family, Targets: targets, Service: b.key})
		}
		rules = append(rules, balance)
	}
	b.objs.Chains = append(b.objs.Chains, &regularChain{Name: name, Family: b.family, Service: b.key, Rules: rules})
	return verdict{Goto: name}
}

// externalTarget returns the verdict for external traffic (external IPs,
// load-balancer IPs, node ports), as kube-proxy handles it: with the
// Cluster policy, masquerade and use the cluster endpoints; with Local,
// keep the client's address and use the local endpoints, but send pods
// (sources in the cluster CIDRs) and the node itself (masqueraded) to all
// the cluster endpoints, which they could reach anyway. alsoDrop reports a
// Local-policy chain without local endpoints: it only holds those
// short-circuits, and the rest of the traffic must be dropped.
func (b *portBuilder) externalTarget(external []*model.Endpoint, ev endpoints.Verdict, internal []*model.Endpoint, iv endpoints.Verdict, clusterTarget verdict, clusterMasq []rule, cluster []*model.Endpoint) (target verdict, alsoDrop bool) {
	f := b.family
	if !b.svc.ExternalTrafficToLocal {
		if ev != endpoints.Forward {
			return b.target("ext", nil, nil, ev), false
		}
		first := []rule{markRule{Family: f}}
		if iv == endpoints.Forward && clusterTarget.Goto != chainReject && slices.Equal(external, internal) {
			name := serviceChainName("ext", f, b.key, b.port)
			b.objs.Chains = append(b.objs.Chains, &regularChain{Name: name, Family: b.family, Service: b.key, Rules: append(first, balanceRule{Targets: []string{clusterTarget.Goto}})})
			return verdict{Goto: name}, false
		}
		return b.target("ext", first, external, ev), false
	}
	if ev == endpoints.Reject {
		return b.target("ext", nil, nil, ev), false
	}
	// The chain of all the cluster endpoints: the service chain, unless
	// internalTrafficPolicy: Local makes that one local only.
	clusterChain := ""
	switch {
	case !b.svc.InternalTrafficToLocal && iv == endpoints.Forward && clusterTarget.Goto != chainReject:
		clusterChain = clusterTarget.Goto
	case b.svc.InternalTrafficToLocal && len(cluster) > 0:
		if v := b.target("clu", clusterMasq, cluster, endpoints.Forward); v.Goto != chainReject {
			clusterChain = v.Goto
		}
	}
	var first []rule
	if clusterChain != "" {
		for _, cidr := range prefixesOf(b.opts.ClusterCIDRs, f) {
			first = append(first, sourceRule{Family: f, Prefix: cidr, Goto: clusterChain})
		}
		first = append(first,
			sourceRule{Family: f, LocalSource: true, Mark: true},
			sourceRule{Family: f, LocalSource: true, Goto: clusterChain})
	}
	if ev == endpoints.Forward {
		return b.target("ext", first, external, ev), false
	}
	if len(first) == 0 {
		return verdict{}, false
	}
	name := serviceChainName("ext", f, b.key, b.port)
	b.objs.Chains = append(b.objs.Chains, &regularChain{Name: name, Family: b.family, Service: b.key, Rules: first})
	return verdict{Goto: name}, true
}

// endpointAddr returns the address (of the builder's family) and target
// port of ep for the service port, reporting a bad address or port, and
// records the address for hairpin masquerading if the endpoint may run on
// this node (hairsPin).
func (b *portBuilder) endpointAddr(ep *model.Endpoint) (netip.AddrPort, bool) {
	text := ep.Key()
	if as := familyAddrs(ep.IPs, b.family); len(as) > 0 {
		text = as[0]
	}
	addr, err := netip.ParseAddr(text)
	if err != nil || familyOf(addr.Unmap()) != b.family {
		*b.problems = append(*b.problems, model.NewProblem(b.key, "endpoints[].addresses", model.ReasonBadField,
			"service %s: endpoint %q is not an %s address", b.key, text, b.family))
		return netip.AddrPort{}, false
	}
	addr = addr.Unmap()
	port, ok := ep.PortFor(b.port)
	if !ok || port <= 0 || port > 65535 {
		*b.problems = append(*b.problems, model.NewProblem(b.key, "endpoints[].ports", model.ReasonBadField,
			"service %s port %q: endpoint %s: target port %d out of range", b.key, b.port.Name, addr, port))
		return netip.AddrPort{}, false
	}
	if hairsPin(ep) {
		b.objs.Hairpin = append(b.objs.Hairpin, addr)
	}
	return netip.AddrPortFrom(addr, uint16(port)), true
}

// hairsPin reports whether ep's address goes in the hairpin sets: a pod
// reaching itself through a service sends from the endpoint's address to
// the endpoint's address, and only the node it runs on sees that packet.
// So a local endpoint does, and one whose node is not known (a state
// without node names); an endpoint of another node does not, as
// kube-proxy leaves it out of its hairpin set. At 10,000 services of 10
// endpoints spread over the nodes, that keeps 100,000 addresses out of a
// set every new connection's packets look up (and out of the cold start).
func hairsPin(ep *model.Endpoint) bool { return ep.Local || ep.NodeName == "" }

// endpointChain adds (once) the chain DNATing to an endpoint of a service
// with session affinity, and its affinity set, and returns their names.
func (b *portBuilder) endpointChain(to netip.AddrPort) (string, string) {
	ep := to.Addr().String() + "/" + strconv.Itoa(int(to.Port()))
	name := endpointChainName(b.family, b.key, b.port, ep)
	timeout := model.DefaultAffinityTimeoutSeconds * time.Second
	if a := b.svc.ClientIPAffinity; a.TimeoutSeconds > 0 {
		timeout = time.Duration(a.TimeoutSeconds) * time.Second
	}
	set := chainName("aff"+familySuffix(b.family), portID(b.key, b.port)+"__"+ep+"__"+strconv.Itoa(int(timeout/time.Second))+"s")
	if !b.epChains[name] {
		b.epChains[name] = true
		b.objs.Sets = append(b.objs.Sets, &namedSet{Name: set, Family: b.family, Timeout: timeout, Service: b.key})
		b.objs.Chains = append(b.objs.Chains, &regularChain{Name: name, Family: b.family, Service: b.key, Rules: []rule{
			affinityUpdateRule{Family: b.family, Set: set},
			dnatRule{Proto: b.port.Protocol, To: to},
		}})
	}
	return name, set
}

// elements adds, for each address, the element sending the service port
// to target: in the map forward when forwarding, in the map blocked
// otherwise. field names the addresses in problems. An empty address is a node port: the key is the protocol and
// nodePort.
func (b *portBuilder) elements(forward, blocked, field string, addrs []string, nodePort uint16, target verdict, v endpoints.Verdict) {
	m := forward
	if v != endpoints.Forward || target.Goto == chainReject || target.Goto == "" {
		m = blocked
	}
	if m == mapNoEndpointNodePorts(b.family) {
		// The address check is in the chain the element goes to. A
		// blocked element rejects or drops (target, externalTarget):
		// anything else would skip the check, so it drops too.
		if target.Goto == chainReject {
			target = verdict{Goto: chainNodePortReject(b.family)}
		} else {
			target = verdict{Goto: chainNodePortDrop(b.family)}
		}
	}
	for _, a := range addrs {
		k := mapKey{Proto: b.port.Protocol, Port: uint16(b.port.Port)}
		if a == "" {
			k.Port = nodePort
		} else {
			addr, err := netip.ParseAddr(a)
			if err != nil || familyOf(addr.Unmap()) != b.family {
				*b.problems = append(*b.problems, model.NewProblem(b.key, b.fieldPath(field), model.ReasonBadField,
					"service %s: %s: bad %s address %q", b.key, field, b.family, a))
				continue
			}
			k.Addr = addr.Unmap()
		}
		b.objs.Elements = append(b.objs.Elements, mapElement{Map: m, Family: b.family, Key: k, Verdict: target, Service: b.key, Field: b.fieldPath(field)})
	}
}

// fieldPath returns the API path of the field the builder's addresses
// come from, named field in messages.
func (b *portBuilder) fieldPath(field string) string { return b.svc.AddressFieldPath(field, b.port) }

// firewall adds the chain enforcing the service's loadBalancerSourceRanges
// on its load-balancer IPs (of this family: allowed, the prefixes of this
// family, and the load-balancer IPs themselves when a prefix contains a
// node IP), and the elements sending those IPs to it.
func (b *portBuilder) firewall(lbIPs []string, allowed []netip.Prefix) {
	name := serviceChainName("fw", b.family, b.key, b.port)
	var rules []rule
	fromNode := false
	for _, p := range allowed {
		rules = append(rules, allowRule{Family: b.family, Prefix: p})
		for _, ip := range b.opts.NodeIPs {
			fromNode = fromNode || p.Contains(ip.Unmap())
		}
	}
	if fromNode {
		for _, a := range lbIPs {
			if addr, err := netip.ParseAddr(a); err == nil && familyOf(addr.Unmap()) == b.family {
				rules = append(rules, allowRule{Family: b.family, Prefix: netip.PrefixFrom(addr.Unmap(), addr.Unmap().BitLen())})
			}
		}
	}
	rules = append(rules, dropRule{})
	b.objs.Chains = append(b.objs.Chains, &regularChain{Name: name, Family: b.family, Service: b.key, Rules: rules})
	b.elements(mapFirewall(b.family), mapFirewall(b.family), "loadBalancer ingress IPs", lbIPs, 0, verdict{Goto: name}, endpoints.Forward)
}

// familyAddrs returns the addresses of s of family f.
func familyAddrs(s model.IPSet, f ipFamily) []string {
	return [2][]string{ipv4: s.V4, ipv6: s.V6}[f]
}

// familyEndpoints returns the endpoints whose address is of family f.
func familyEndpoints(eps []*model.Endpoint, f ipFamily) []*model.Endpoint {
	var out []*model.Endpoint
	for _, ep := range eps {
		if ep != nil && len(familyAddrs(ep.IPs, f)) > 0 {
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
