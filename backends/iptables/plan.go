package iptables

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/kpng/model"
	"sigs.k8s.io/kpng/model/endpoints"
)

// family is an IP family: IPv4 (iptables) or IPv6 (ip6tables).
type family int

const (
	ipv4 family = iota
	ipv6
)

// families are both families, IPv4 first.
var families = []family{ipv4, ipv6}

// String returns "IPv4" or "IPv6".
func (f family) String() string { return [...]string{"IPv4", "IPv6"}[f] }

// of reports whether a is of family f.
func (f family) of(a netip.Addr) bool { return a.Is4() == (f == ipv4) }

// loopback is the family's loopback network, never served by node ports.
func (f family) loopback() string { return [...]string{"127.0.0.0/8", "::1/128"}[f] }

// tables are the tables the proxier writes, in the order it writes them.
var tables = []string{"nat", "filter"}

// chain is one of the proxier's chains in a table, with its rules: each
// rule is the text after "-A <chain> " in iptables-restore input.
type chain struct {
	Name  string
	Rules []string
}

// tablePlan is the content of the proxier's chains in one table.
type tablePlan struct {
	Chains []*chain
	byName map[string]*chain
	// entries are the rules of the SERVICES chain, each matching one
	// destination address, and portEntries those of NODEPORTS, each
	// matching one protocol and port, before they are laid out
	// (dispatchTree).
	entries     []entry
	portEntries []portEntry
}

// portEntry is a rule of the node ports' dispatch: Addr is the port's
// portKey.
type portEntry struct {
	entry
	Proto model.Protocol
}

// dispatchPort adds a rule of the NODEPORTS chain for packets to the node
// port of protocol proto.
func (t *tablePlan) dispatchPort(proto model.Protocol, port int32, args ...string) {
	t.portEntries = append(t.portEntries, portEntry{entry: entry{Addr: portKey(port), Rule: strings.Join(args, " ")}, Proto: proto})
}

// entry is a rule of the dispatch, matching the destination Addr.
type entry struct {
	Addr netip.Addr
	Rule string
}

// dispatch adds a rule of the SERVICES chain for packets to addr (its
// args start with "-d addr").
func (t *tablePlan) dispatch(addr netip.Addr, args ...string) {
	t.entries = append(t.entries, entry{Addr: addr, Rule: strings.Join(args, " ")})
}

// chain returns the chain named name, added (empty) if it is new.
func (t *tablePlan) chain(name string) *chain {
	if c, ok := t.byName[name]; ok {
		return c
	}
	if t.byName == nil {
		t.byName = map[string]*chain{}
	}
	c := &chain{Name: name}
	t.byName[name] = c
	t.Chains = append(t.Chains, c)
	return c
}

// put adds the chain c itself (a service's, from its fragment).
func (t *tablePlan) put(c *chain) {
	if t.byName == nil {
		t.byName = map[string]*chain{}
	}
	t.byName[c.Name] = c
	t.Chains = append(t.Chains, c)
}

// add appends a rule to the chain named name.
func (t *tablePlan) add(name string, args ...string) {
	c := t.chain(name)
	c.Rules = append(c.Rules, strings.Join(args, " "))
}

// dst is what a UDP conntrack entry of a service is found by: its family,
// protocol, destination address (not valid for node ports: any local
// address) and port.
type dst struct {
	Family family
	Proto  model.Protocol
	Addr   netip.AddrPort
}

// familyPlan is what the proxier writes in one family (or what one
// service adds to it: a fragment's): its nat and filter chains, and, for
// the conntrack cleanup, the endpoints each UDP service destination is
// DNATed to.
type familyPlan struct {
	NAT, Filter tablePlan
	// Reach maps each UDP destination DNATed by the rules to the
	// endpoints it may reach.
	Reach map[dst][]netip.AddrPort
	// wants are the destinations (address, or node port without one,
	// protocol and port) a service's rules match, whoever owns them: the
	// first service in key order that wants one owns it, as in the nft
	// backend (state.update).
	wants []dst
	// lost are the destinations of wants that other services own (and
	// which): the service's rules leave them out.
	lost map[dst]model.ServiceKey
	// clusterIPs are the service's cluster IPs: new connections to them
	// that were not DNATed (a port no service defines) are rejected
	// (clusterIPChecks).
	clusterIPs []netip.Addr
}

// table returns the plan of the table named name.
func (p *familyPlan) table(name string) *tablePlan {
	if name == "nat" {
		return &p.NAT
	}
	return &p.Filter
}

// plan is the whole desired state of the proxier's chains.
type plan struct {
	Families [2]familyPlan
}

// planner builds a plan. It is pure: no command is run.
type planner struct {
	prefix      string
	opts        Options
	randomFully bool
}

// fixed returns the name of the fixed chain with the given suffix.
func (pl planner) fixed(suffix string) string { return pl.prefix + suffix }

// build returns the plan of services (on a conflict, the first in key
// order wins) and the parts of them that cannot be programmed: what a
// fresh sink programs from them, through the same incremental state a
// sink keeps.
func (pl planner) build(services []*model.ServiceEndpoints) (*plan, []error) {
	st := newState(pl)
	changed := map[model.ServiceKey]bool{}
	for _, se := range services {
		if se == nil || se.Service == nil {
			continue
		}
		st.services[se.Service.Key()] = se
		changed[se.Service.Key()] = true
	}
	st.update(changed)
	return st.plan(), st.problems()
}

// uniqueErrors returns errs without repeated messages (a problem of the
// service, not of one family, is found in both).
func uniqueErrors(errs []error) []error {
	seen := map[string]bool{}
	var out []error
	for _, e := range errs {
		if !seen[e.Error()] {
			seen[e.Error()] = true
			out = append(out, e)
		}
	}
	return out
}

// fixedChains adds the chains every plan has, in their order.
func (pl planner) fixedChains(f family, fp *familyPlan) {
	nat := &fp.NAT
	nat.chain(pl.fixed(chainServices))
	nat.chain(pl.fixed(chainNodePorts))
	mark := pl.opts.mark()
	// Hairpin: a connection DNATed to its own source (a pod reaching
	// itself through its service) must be masqueraded, or the pod answers
	// itself and the client never hears back. One rule for every
	// endpoint: a classic BPF program (xt_bpf) compares the source and
	// destination addresses of the IP header.
	nat.add(pl.fixed(chainPostrouting), "-m", "comment", "--comment", `"kpng hairpin"`, "-m", "conntrack", "--ctstate", "DNAT",
		"-m", "bpf", "--bytecode", `"`+sameAddrsBPF(f)+`"`, "-j", "MARK", "--or-mark", mark)
	nat.add(pl.fixed(chainPostrouting), "-m", "mark", "!", "--mark", mark+"/"+mark, "-j", "RETURN")
	nat.add(pl.fixed(chainPostrouting), "-j", "MARK", "--xor-mark", mark)
	masq := []string{"-m", "comment", "--comment", `"kpng masquerade"`, "-j", "MASQUERADE"}
	if pl.randomFully {
		masq = append(masq, "--random-fully")
	}
	nat.add(pl.fixed(chainPostrouting), masq...)
	nat.add(pl.fixed(chainMarkMasq), "-j", "MARK", "--or-mark", mark)
	if cidrs := prefixesOf(pl.opts.ClusterCIDRs, f); len(cidrs) > 0 && !pl.opts.MasqueradeAll {
		for _, c := range cidrs {
			nat.add(pl.fixed(chainMasqNonPod), "-s", c.String(), "-j", "RETURN")
		}
		nat.add(pl.fixed(chainMasqNonPod), "-j", pl.fixed(chainMarkMasq))
	}
	fp.Filter.chain(pl.fixed(chainServices))
	fp.Filter.chain(pl.fixed(chainNodePorts))
	fp.Filter.add(pl.fixed(chainClusterIPs), "-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset")
	fp.Filter.add(pl.fixed(chainClusterIPs), "-j", "REJECT")
	fp.Filter.add(pl.fixed(chainForward), "-m", "conntrack", "--ctstate", "NEW", "-j", pl.fixed(chainServices))
	fp.Filter.add(pl.fixed(chainForward), "-m", "comment", "--comment", `"kpng forwarding: marked for masquerading"`,
		"-m", "mark", "--mark", mark+"/"+mark, "-j", "ACCEPT")
	fp.Filter.add(pl.fixed(chainForward), "-m", "comment", "--comment", `"kpng forwarding: replies and related"`,
		"-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT")
	for _, t := range []*tablePlan{nat, &fp.Filter} {
		t.add(pl.fixed(chainCanary), canaryRule...)
	}
}

// canaryRule is the rule of the canary chains.
var canaryRule = []string{"-m", "comment", "--comment", `"kpng canary: if this rule goes, a full sync follows"`, "-j", "RETURN"}

// clusterIPChecks adds to the filter dispatch, after every service's
// entries, one rule per cluster IP held (ips: sorted, each once) sending
// new connections that were not DNATed, to a port no service defines, to
// the CLUSTER-IPS chain, which rejects them: a cluster IP is virtual and
// its packets must never be routed out (kube-proxy's rule). The dispatch
// sorts its entries stably, so that the rules for a port of the address
// (no endpoints: reject or drop) stay first.
func (pl planner) clusterIPChecks(t *tablePlan, ips []netip.Addr) {
	for _, ip := range ips {
		t.dispatch(ip, "-m", "comment", "--comment", `"kpng cluster IP, port not served"`, "-d", ip.String(), "-j", pl.fixed(chainClusterIPs))
	}
}

// serviceCIDRDrops adds to the filter SERVICES chain, after the dispatch,
// one DROP rule per service CIDR of family f: new connections to the
// addresses in them that no service holds (the cluster IPs held were
// DNATed or rejected before). Only the cluster's default proxier is given
// service CIDRs.
func (pl planner) serviceCIDRDrops(f family, t *tablePlan, cidrs []netip.Prefix) {
	for _, c := range prefixesOf(cidrs, f) {
		t.add(pl.fixed(chainServices), "-m", "comment", "--comment", `"kpng service CIDR, no service"`, "-d", c.String(), "-j", "DROP")
	}
}

// nodePortJumps ends the SERVICES chains with the jump to NODEPORTS, on
// the node's local addresses: those in the NodePortAddresses of the
// family or, as kube-proxy, all but loopback when the family has none
// there, or a /0.
func (pl planner) nodePortJumps(f family, fp *familyPlan) {
	var dsts [][]string
	for _, p := range prefixesOf(pl.opts.NodePortAddresses, f) {
		if p.Bits() == 0 {
			dsts = nil
			break
		}
		dsts = append(dsts, []string{"-d", p.String()})
	}
	if len(dsts) == 0 {
		dsts = [][]string{{"!", "-d", f.loopback()}}
	}
	for _, d := range dsts {
		for _, t := range []*tablePlan{&fp.NAT, &fp.Filter} {
			args := append([]string{"-m", "comment", "--comment", `"kpng node ports"`}, d...)
			t.add(pl.fixed(chainServices), append(args, "-m", "addrtype", "--dst-type", "LOCAL", "-j", pl.fixed(chainNodePorts))...)
		}
	}
}

// service adds the rules of one service in family f. Its problems are
// *model.Problem values, with the field and the reason.
func (pl planner) service(f family, fp *familyPlan, se *model.ServiceEndpoints) []error {
	svc := se.Service
	var problems []error
	usable, rangeProblems := svc.UsableSourceRanges()
	var ranges []netip.Prefix
	for _, r := range usable {
		if f.of(r.Addr()) {
			ranges = append(ranges, r)
		}
	}
	ports, nodePorts, portProblems := svc.UsablePorts(func(p model.Protocol) bool { return protoName(p) != "" })
	external, loadBalancer, addrProblems := svc.ServedExternalIPs()
	problems = append(append(append(problems, rangeProblems...), portProblems...), addrProblems...)
	if !svc.IPs.Headless {
		for _, t := range familyTexts(svc.IPs.ClusterIPs, f) {
			if a, err := netip.ParseAddr(t); err == nil && f.of(a.Unmap()) && a.Zone() == "" {
				fp.clusterIPs = append(fp.clusterIPs, a.Unmap())
			}
		}
	}
	for i, p := range ports {
		nodePort := nodePorts[i]
		b := portBuilder{planner: pl, f: f, fp: fp, se: se, svc: svc, port: p, problems: &problems, external: external, loadBalancer: loadBalancer}
		b.build(nodePort, ranges)
	}
	return problems
}

// portBuilder builds the rules of one service port in one family.
type portBuilder struct {
	planner
	f        family
	fp       *familyPlan
	se       *model.ServiceEndpoints
	svc      *model.Service
	port     *model.PortMapping
	problems *[]error
	// external and loadBalancer are the service's external and
	// load-balancer IPs that it serves (model.Service.ServedExternalIPs).
	external, loadBalancer model.IPSet
	// chains are the policy chains built (kindCluster, kindLocal).
	chains map[string]*policyChain
}

// policyChain is a chain choosing among endpoints (SVC or SVL): its
// first rules (masquerading) and its endpoints.
type policyChain struct {
	name  string
	first [][]string
	eps   []netip.AddrPort
}

// id is the identity of the service port in the family, which chain
// names hash.
func (b *portBuilder) id() string {
	return fmt.Sprintf("%s/%s/%s/%s/%d", b.f, b.svc.Namespace, b.svc.Name, protoName(b.port.Protocol), b.port.Port)
}

// comment is the service port as comments show it: "ns/name:80/tcp".
func (b *portBuilder) comment(what string) []string {
	text := fmt.Sprintf("%s/%s:%d/%s", nameSafe(b.svc.Namespace), nameSafe(b.svc.Name), b.port.Port, protoName(b.port.Protocol))
	if what != "" {
		text += " " + what
	}
	return []string{"-m", "comment", "--comment", `"` + text + `"`}
}

// nameSafe keeps in a Kubernetes name only what such names hold (a name
// from a state file or another controller is not checked by Kubernetes: a
// quote, a space or a newline would break, or write, the restore input);
// the rest becomes "_".
func nameSafe(name string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '-', r == '_':
			return r
		}
		return '_'
	}, name)
}

// match is the protocol and destination port match of the service port
// (or of its node port).
func (b *portBuilder) match(port int32) []string {
	proto := protoName(b.port.Protocol)
	return []string{"-p", proto, "-m", proto, "--dport", strconv.Itoa(int(port))}
}

// build adds the service port's rules.
func (b *portBuilder) build(nodePort int32, ranges []netip.Prefix) {
	svc, f := b.svc, b.f
	var clusterIPs []netip.Addr
	if !svc.IPs.Headless {
		clusterIPs = b.addrs("clusterIPs", svc.IPs.ClusterIPs)
	}
	externalIPs := b.addrs("externalIPs", b.external)
	lbIPs := b.addrs("loadBalancer ingress IPs", b.loadBalancer)
	// A node port is served in a family only if the service has a
	// cluster IP in it (as kube-proxy, whose per-family proxiers only see
	// the service in its own families).
	hasNodePort := nodePort > 0 && len(familyTexts(svc.IPs.ClusterIPs, f)) > 0
	clusterIPs = b.claim("clusterIPs", clusterIPs, b.port.Port)
	externalIPs = b.claim("externalIPs", externalIPs, b.port.Port)
	lbIPs = b.claim("loadBalancer ingress IPs", lbIPs, b.port.Port)
	if hasNodePort {
		hasNodePort = len(b.claim("nodePort", []netip.Addr{{}}, nodePort)) > 0
	}
	if len(clusterIPs) == 0 && len(externalIPs) == 0 && len(lbIPs) == 0 && !hasNodePort {
		return
	}
	defer b.finish()
	cats := endpoints.CategorizePort(b.port, b.usableEndpoints())
	internal, iv := cats.Internal(svc)

	// Cluster IPs.
	if len(clusterIPs) > 0 {
		if iv == endpoints.Forward {
			chain := b.policy(svc.InternalTrafficToLocal, internal)
			for _, ip := range clusterIPs {
				match := append([]string{"-d", ip.String()}, b.match(b.port.Port)...)
				switch {
				case b.opts.MasqueradeAll:
					chain.first = append(chain.first, append(slices.Clone(match), "-j", b.fixed(chainMarkMasq)))
				case len(prefixesOf(b.opts.ClusterCIDRs, f)) > 0:
					chain.first = append(chain.first, append(slices.Clone(match), "-j", b.fixed(chainMasqNonPod)))
				}
				b.fp.NAT.dispatch(ip, concat(b.comment("cluster IP"), match, []string{"-j", chain.name})...)
				b.reach(netip.AddrPortFrom(ip, uint16(b.port.Port)), chain.eps)
			}
		} else {
			for _, ip := range clusterIPs {
				b.fp.Filter.dispatch(ip, concat(b.comment(noEndpoints(iv)), []string{"-d", ip.String()}, b.match(b.port.Port), b.verdict(iv))...)
			}
		}
	}
	if len(externalIPs) == 0 && len(lbIPs) == 0 && !hasNodePort {
		return
	}

	// External IPs, load-balancer IPs and node ports.
	external, ev := cats.External(svc)
	var firewalled bool
	if len(ranges) > 0 && len(lbIPs) > 0 && cats.HasAny {
		firewalled = true
		for _, ip := range lbIPs {
			b.fp.Filter.dispatch(ip, concat(b.comment("not allowed by loadBalancerSourceRanges"), []string{"-d", ip.String()}, b.match(b.port.Port), []string{"-j", "DROP"})...)
		}
	}
	if ev != endpoints.Forward {
		for _, ip := range append(slices.Clone(externalIPs), lbIPs...) {
			b.fp.Filter.dispatch(ip, concat(b.comment(noEndpoints(ev)), []string{"-d", ip.String()}, b.match(b.port.Port), b.verdict(ev))...)
		}
		if hasNodePort {
			b.fp.Filter.dispatchPort(b.port.Protocol, nodePort, concat(b.comment(noEndpoints(ev)), b.match(nodePort), b.verdict(ev))...)
		}
	}
	if !cats.HasAny {
		return
	}
	ext, reach := b.externalChain(external, ev, cats.Cluster)
	for _, ip := range externalIPs {
		b.fp.NAT.dispatch(ip, concat(b.comment("external IP"), []string{"-d", ip.String()}, b.match(b.port.Port), []string{"-j", ext})...)
		b.reach(netip.AddrPortFrom(ip, uint16(b.port.Port)), reach)
	}
	lbTarget := ext
	if firewalled {
		lbTarget = b.firewall(ext, lbIPs, ranges)
	}
	for _, ip := range lbIPs {
		b.fp.NAT.dispatch(ip, concat(b.comment("load-balancer IP"), []string{"-d", ip.String()}, b.match(b.port.Port), []string{"-j", lbTarget})...)
		b.reach(netip.AddrPortFrom(ip, uint16(b.port.Port)), reach)
	}
	if hasNodePort {
		b.fp.NAT.dispatchPort(b.port.Protocol, nodePort, concat(b.comment("node port"), b.match(nodePort), []string{"-j", ext})...)
		b.reach(netip.AddrPortFrom(netip.Addr{}, uint16(nodePort)), reach)
	}
}

// externalChain adds the EXT chain of the service port and returns its
// name and the endpoints it may reach. With the Cluster policy it
// masquerades and goes to the cluster endpoints; with Local it keeps the
// client's address and goes to the local endpoints, but sends pods
// (sources in the cluster CIDRs) and the node itself (masqueraded) to the
// cluster endpoints, which they could reach anyway; without local
// endpoints, what it leaves falls through to the filter table's DROP.
func (b *portBuilder) externalChain(external []*model.Endpoint, ev endpoints.Verdict, cluster []*model.Endpoint) (string, []netip.AddrPort) {
	name := serviceChain(b.prefix, kindExternal, b.id())
	nat := &b.fp.NAT
	nat.chain(name)
	if !b.svc.ExternalTrafficToLocal {
		chain := b.policy(false, cluster)
		nat.add(name, concat(b.comment("masquerade external traffic"), []string{"-j", b.fixed(chainMarkMasq)})...)
		nat.add(name, "-j", chain.name)
		return name, chain.eps
	}
	all := b.policy(false, cluster)
	reach := slices.Clone(all.eps)
	for _, c := range prefixesOf(b.opts.ClusterCIDRs, b.f) {
		nat.add(name, concat(b.comment("pods use every endpoint"), []string{"-s", c.String(), "-j", all.name})...)
	}
	nat.add(name, concat(b.comment("masquerade the node's own traffic"), []string{"-m", "addrtype", "--src-type", "LOCAL", "-j", b.fixed(chainMarkMasq)})...)
	nat.add(name, concat(b.comment("the node uses every endpoint"), []string{"-m", "addrtype", "--src-type", "LOCAL", "-j", all.name})...)
	if ev == endpoints.Forward {
		local := b.policy(true, external)
		nat.add(name, "-j", local.name)
		reach = append(reach, local.eps...)
	}
	return name, reach
}

// firewall adds the chain enforcing loadBalancerSourceRanges (of this
// family) before the EXT chain ext, and returns its name. What it does
// not let through is not DNATed and meets the filter table's DROP.
func (b *portBuilder) firewall(ext string, lbIPs []netip.Addr, ranges []netip.Prefix) string {
	name := serviceChain(b.prefix, kindFirewall, b.id())
	nat := &b.fp.NAT
	fromNode := false
	for _, r := range ranges {
		nat.add(name, concat(b.comment("loadBalancerSourceRanges"), []string{"-s", r.String(), "-j", ext})...)
		for _, ip := range b.opts.NodeIPs {
			fromNode = fromNode || r.Contains(ip.Unmap())
		}
	}
	if fromNode {
		for _, ip := range lbIPs {
			nat.add(name, concat(b.comment("the node's requests from a load-balancer IP"), []string{"-s", ip.String(), "-j", ext})...)
		}
	}
	return name
}

// policy returns the SVC (local false) or SVL (local true) chain of the
// service port, choosing among eps, and adds it on first use.
func (b *portBuilder) policy(local bool, eps []*model.Endpoint) *policyChain {
	kind := kindCluster
	if local {
		kind = kindLocal
	}
	if c, ok := b.chains[kind]; ok {
		return c
	}
	if b.chains == nil {
		b.chains = map[string]*policyChain{}
	}
	c := &policyChain{name: serviceChain(b.prefix, kind, b.id())}
	for _, ep := range eps {
		if to, ok := b.endpointAddr(ep); ok {
			c.eps = append(c.eps, to)
		}
	}
	b.chains[kind] = c
	// The chain is declared now (its place in the table's order) and
	// filled when the port is done: its first rules may still come.
	b.fp.NAT.chain(c.name)
	return c
}

// claim returns the addresses (the invalid address: a node port) of
// addrs whose destination with port the service owns; each is recorded
// as wanted, and those another service owns (lost) are reported and left
// out.
func (b *portBuilder) claim(field string, addrs []netip.Addr, port int32) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		d := dst{Family: b.f, Proto: b.port.Protocol, Addr: netip.AddrPortFrom(a, uint16(port))}
		b.fp.wants = append(b.fp.wants, d)
		if owner, ok := b.fp.lost[d]; ok {
			what := a.String()
			if !a.IsValid() {
				what = "node port"
			}
			*b.problems = append(*b.problems, model.NewProblem(b.svc.Key(), b.fieldPath(field), model.ReasonAddressConflict,
				"service %s: %s: %s %d/%s already used by service %s: ignored", b.svc.Key(), field, what, port, protoName(b.port.Protocol), owner))
			continue
		}
		out = append(out, a)
	}
	return out
}

// fieldPath returns the API path of the field the builder's addresses
// come from, named field in messages.
func (b *portBuilder) fieldPath(field string) string { return b.svc.AddressFieldPath(field, b.port) }

// reach records the endpoints a UDP destination is DNATed to.
func (b *portBuilder) reach(d netip.AddrPort, eps []netip.AddrPort) {
	if b.port.Protocol != model.UDP {
		return
	}
	k := dst{Family: b.f, Proto: b.port.Protocol, Addr: d}
	b.fp.Reach[k] = append(b.fp.Reach[k], eps...)
}

// finish writes the rules of the policy chains: for each endpoint, one
// rule choosing it and DNATing to it (two with session affinity: the
// affinity check first). There is no chain per endpoint, as kube-proxy
// has (KUBE-SEP-…, three rules each): hairpin traffic is masqueraded by
// one rule in POSTROUTING (fixedChains), and the cost of a restore, in
// legacy iptables a whole table each time, is set by the number of rules
// and chains.
func (b *portBuilder) finish() {
	nat := &b.fp.NAT
	proto := protoName(b.port.Protocol)
	for _, kind := range []string{kindCluster, kindLocal} {
		c := b.chains[kind]
		if c == nil {
			continue
		}
		for _, r := range c.first {
			nat.add(c.name, concat(b.comment("masquerade traffic from outside the cluster"), r)...)
		}
		affinity := b.svc.ClientIPAffinity
		lists := make([]string, len(c.eps))
		if affinity != nil {
			timeout := affinity.TimeoutSeconds
			if timeout <= 0 {
				timeout = model.DefaultAffinityTimeoutSeconds
			}
			for i, ep := range c.eps {
				lists[i] = serviceChain(b.prefix, kindAffinity, b.id()+"/"+ep.String())
				nat.add(c.name, "-m", "recent", "--name", lists[i], "--rcheck", "--seconds", strconv.Itoa(int(timeout)), "--reap",
					"-p", proto, "-j", "DNAT", "--to-destination", ep.String())
			}
		}
		for i, ep := range c.eps {
			// No comment on the rules of each endpoint (kube-proxy drops
			// them in large clusters): the xt_comment match doubled the
			// restore input and the kernel's work at 10,000 services.
			var args []string
			if n := len(c.eps) - i; n > 1 {
				args = append(args, "-m", "statistic", "--mode", "random", "--probability", fmt.Sprintf("%0.10f", 1/float64(n)))
			}
			if affinity != nil {
				args = append(args, "-m", "recent", "--name", lists[i], "--set")
			}
			nat.add(c.name, append(args, "-p", proto, "-j", "DNAT", "--to-destination", ep.String())...)
		}
	}
}

// verdict is the filter target for packets to a service without usable
// endpoints: REJECT (a TCP reset for TCP, ICMP port unreachable
// otherwise), or DROP for the Local policy without local endpoints.
func (b *portBuilder) verdict(v endpoints.Verdict) []string {
	if v == endpoints.Drop {
		return []string{"-j", "DROP"}
	}
	if b.port.Protocol == model.TCP {
		return []string{"-j", "REJECT", "--reject-with", "tcp-reset"}
	}
	return []string{"-j", "REJECT"}
}

// noEndpoints is the comment of a REJECT or DROP rule.
func noEndpoints(v endpoints.Verdict) string {
	if v == endpoints.Drop {
		return "has no local endpoints"
	}
	return "has no endpoints"
}

// addrs returns the addresses of s in the builder's family, reporting
// bad ones.
func (b *portBuilder) addrs(field string, s model.IPSet) []netip.Addr {
	var out []netip.Addr
	for _, t := range familyTexts(s, b.f) {
		a, err := netip.ParseAddr(t)
		if err != nil || !b.f.of(a.Unmap()) || a.Zone() != "" {
			*b.problems = append(*b.problems, model.NewProblem(b.svc.Key(), b.fieldPath(field), model.ReasonBadField,
				"service %s: %s: bad %s address %q: ignored", b.svc.Key(), field, b.f, t))
			continue
		}
		out = append(out, a.Unmap())
	}
	return out
}

// usableEndpoints returns the endpoints of the builder's family that
// serve the port on a valid address and port; the others are reported.
func (b *portBuilder) usableEndpoints() []*model.Endpoint {
	var out []*model.Endpoint
	for _, ep := range b.se.Endpoints {
		if ep == nil || len(familyTexts(ep.IPs, b.f)) == 0 {
			continue
		}
		if _, ok := b.endpointAddr(ep); ok {
			out = append(out, ep)
		}
	}
	return out
}

// endpointAddr returns the address (of the builder's family) and target
// port of ep for the service port; false when it does not serve the port
// or either is invalid (reported).
func (b *portBuilder) endpointAddr(ep *model.Endpoint) (netip.AddrPort, bool) {
	texts := familyTexts(ep.IPs, b.f)
	if len(texts) == 0 {
		return netip.AddrPort{}, false
	}
	port, serves := ep.PortFor(b.port)
	if !serves {
		return netip.AddrPort{}, false
	}
	addr, err := netip.ParseAddr(texts[0])
	if err != nil || !b.f.of(addr.Unmap()) || addr.Zone() != "" {
		*b.problems = append(*b.problems, model.NewProblem(b.svc.Key(), "endpoints[].addresses", model.ReasonBadField,
			"service %s: endpoint %q is not an %s address: ignored", b.svc.Key(), texts[0], b.f))
		return netip.AddrPort{}, false
	}
	if port <= 0 || port > 65535 {
		*b.problems = append(*b.problems, model.NewProblem(b.svc.Key(), "endpoints[].ports", model.ReasonBadField,
			"service %s port %q: endpoint %s: target port %d out of range: ignored", b.svc.Key(), b.port.Name, addr, port))
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(addr.Unmap(), uint16(port)), true
}

// familyTexts returns the addresses of s of family f.
func familyTexts(s model.IPSet, f family) []string {
	if f == ipv4 {
		return s.V4
	}
	return s.V6
}

// prefixesOf returns the prefixes of family f.
func prefixesOf(ps []netip.Prefix, f family) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if f.of(p.Addr()) {
			out = append(out, p)
		}
	}
	return out
}

// protoName is the protocol as iptables names it; "" if unsupported.
func protoName(p model.Protocol) string {
	switch p {
	case model.TCP:
		return "tcp"
	case model.UDP:
		return "udp"
	case model.SCTP:
		return "sctp"
	}
	return ""
}

// concat joins argument lists.
func concat(parts ...[]string) []string {
	var out []string
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}
