package nft

import (
	"fmt"
	"net/netip"
	"strings"
)

// nodePortMatch is the address match of one node-port rule (a lookup of
// service-nodeports, a rule of nodeport-reject/-drop): the destination is
// local and, if set, inside Prefix, or not inside NotPrefix.
type nodePortMatch struct {
	Prefix, NotPrefix netip.Prefix
}

// nodePortMatches returns the address matches of a family's node-port
// rules: one per
// node-port address prefix of the family, or, as kube-proxy, one for every
// local address (loopback excluded) when opts gives no prefix of the
// family (whatever it gives for the other) or a /0 one.
func nodePortMatches(opts Options, f ipFamily) []nodePortMatch {
	prefixes := prefixesOf(opts.NodePortAddresses, f)
	var out []nodePortMatch
	for _, p := range prefixes {
		if p.Bits() == 0 {
			return []nodePortMatch{{NotPrefix: f.info().loopback}}
		}
		out = append(out, nodePortMatch{Prefix: p})
	}
	if len(out) == 0 {
		return []nodePortMatch{{NotPrefix: f.info().loopback}}
	}
	return out
}

// daddrText is "ip daddr" or "ip6 daddr".
func daddrText(f ipFamily) string { return f.info().nft + " daddr" }

// lookupRuleText is the text of the rule looking up the map m of kind k
// and family f (node-port maps: with the address match npm, but for
// checkedAfter kinds).
func lookupRuleText(f ipFamily, k mapKind, npm nodePortMatch) string {
	m := k.name(f)
	switch {
	case !k.nodePort:
		return fmt.Sprintf("%s . meta l4proto . th dport vmap @%s", daddrText(f), m)
	case k.checkedAfter:
		return fmt.Sprintf("meta l4proto . th dport vmap @%s", m)
	}
	return fmt.Sprintf("%s meta l4proto . th dport vmap @%s", nodePortMatchText(f, npm), m)
}

// nodePortMatchText is the text of the address match npm of family f:
// "[ip daddr PREFIX] fib daddr type local [ip daddr != PREFIX]".
func nodePortMatchText(f ipFamily, npm nodePortMatch) string {
	var b strings.Builder
	if npm.Prefix.IsValid() {
		fmt.Fprintf(&b, "%s %s ", daddrText(f), prefixText(npm.Prefix))
	}
	b.WriteString("fib daddr type local")
	if npm.NotPrefix.IsValid() {
		fmt.Fprintf(&b, " %s != %s", daddrText(f), prefixText(npm.NotPrefix))
	}
	return b.String()
}

// lookupChains are the fixed chains that look maps up, with the map kinds
// each looks up (in this order, in each family's table).
var lookupChains = []struct {
	name  string
	kinds []mapKind
}{
	{chainServices, []mapKind{mapKinds[0], mapKinds[2]}},
	{chainNoEndpoints, []mapKind{mapKinds[1]}},
	{chainNoEndpointNodePorts, []mapKind{mapKinds[3]}},
	{chainFirewallCheck, []mapKind{mapKinds[4]}},
}

// lookupRule is one rule of a lookup chain: the lookup of the map of
// kind k and family f (with the address match npm, for a node-port kind),
// or, when shard is not 0, the services chain's rule of shard shard of f
// (shardRuleText), or, when guard is set, its jump to the shards chain of
// f (shardGuardText).
type lookupRule struct {
	f     ipFamily
	k     mapKind
	npm   nodePortMatch
	shard uint32
	guard bool
}

// lookupRules calls fn for each rule of a lookup chain's kinds in family
// f's table, in order: for the services kind, the rules of the family's
// shards sh first (their sets hold none of the map's keys), or the jump
// to them when they are behind the cluster-IP check (guarded), for
// node-port kinds one rule per address match.
func lookupRules(f ipFamily, opts Options, sh shards, kinds []mapKind, fn func(lookupRule)) {
	for _, k := range kinds {
		switch {
		case k.name(f) != mapServices(f):
		case sh.guarded(f):
			fn(lookupRule{f: f, k: k, guard: true})
		default:
			sh.each(f, func(n uint32) { fn(lookupRule{f: f, k: k, shard: n}) })
		}
		if !k.nodePort || k.checkedAfter {
			fn(lookupRule{f: f, k: k})
			continue
		}
		for _, npm := range nodePortMatches(opts, f) {
			fn(lookupRule{f: f, k: k, npm: npm})
		}
	}
}

// text returns the rule in nft syntax.
func (r lookupRule) text() string {
	if r.guard {
		return shardGuardText(r.f)
	}
	if r.shard > 0 {
		return shardRuleText(r.f, r.shard)
	}
	return lookupRuleText(r.f, r.k, r.npm)
}

// Text renders the ruleset in nft's syntax, for reading and golden files:
// its IPv4 table, then its IPv6 table (tableText), each chain, set and map
// as `nft list table` prints it once the ruleset is programmed, which
// TestKernelListingMatchesText checks against the kernel (but for the
// order of the objects and elements one per line and in the ruleset's
// order); TestKernelListingReloads loads that listing back with nft -f.
func (rs *ruleset) Text() string {
	var b strings.Builder
	caps := wholeCapacities(rs)
	comments := commentsOf(rs.Blocks)
	byMap := map[string][]endpointElement{}
	for _, e := range rs.endpoints() {
		byMap[e.Map()] = append(byMap[e.Map()], e)
	}
	keys := map[string][]mapElement{}
	for _, e := range rs.Elements {
		if e.Verdict.Shard > 0 {
			keys[e.set()] = append(keys[e.set()], e)
		}
	}
	for _, f := range []ipFamily{ipv4, ipv6} {
		if f == ipv6 {
			b.WriteString("\n")
		}
		rs.tableText(&b, f, caps, comments, byMap, keys)
	}
	return b.String()
}

// tableText writes the table of family f: "table ip NAME { … }".
func (rs *ruleset) tableText(b *strings.Builder, f ipFamily, caps capacities, comments blockComments, byMap map[string][]endpointElement, keys map[string][]mapElement) {
	fmt.Fprintf(b, "table %s %s {\n", f.info().nft, rs.Table)
	for _, k := range mapKinds {
		m := k.name(f)
		typ := f.info().addrType + " . inet_proto . inet_service"
		if k.nodePort {
			typ = "inet_proto . inet_service"
		}
		fmt.Fprintf(b, "\tmap %s {\n\t\ttype %s : verdict\n", m, typ)
		if m == mapServices(f) {
			fmt.Fprintf(b, "\t\tsize %d\n", caps[sizedSet{services: true, family: f}].capacity)
		}
		var els []string
		for _, e := range rs.Elements {
			if e.set() == m {
				els = append(els, "\t\t\t"+e.text())
			}
		}
		writeElements(b, els)
	}
	typ := f.info().addrType + " . " + f.info().addrType
	fmt.Fprintf(b, "\tset %s {\n\t\ttype %s\n\t\tsize %d\n", mapHairpin(f), typ, caps[sizedSet{family: f}].capacity)
	var els []string
	for _, a := range rs.Hairpin {
		if familyOf(a) == f {
			els = append(els, fmt.Sprintf("\t\t\t%s . %s", a, a))
		}
	}
	writeElements(b, els)
	fmt.Fprintf(b, "\tset %s {\n\t\ttype %s\n\t\tsize %d\n", setClusterIPs(f), f.info().addrType, caps[sizedSet{clusterIPs: true, family: f}].capacity)
	els = nil
	for _, a := range rs.ClusterIPs {
		if familyOf(a) == f {
			els = append(els, "\t\t\t"+a.String())
		}
	}
	writeElements(b, els)
	for _, s := range rs.Sets {
		if s.Family == f {
			fmt.Fprintf(b, "\t%s\n\n", s.Text(caps[shardSized(s.Name)].capacity, byMap[s.Name], comments, keys[s.Name]))
		}
	}
	for _, c := range baseChains {
		fmt.Fprintf(b, "\tchain %s {\n\t\ttype %s hook %s priority %s; policy accept;\n", c.name, c.typ, c.hook, priorityText(c.priority, c.hook))
		for _, j := range c.jumps {
			b.WriteString("\t\t")
			if j.newOnly {
				b.WriteString("ct state new ")
			}
			fmt.Fprintf(b, "jump %s\n", j.chain)
		}
		b.WriteString("\t}\n\n")
	}
	fmt.Fprintf(b, "\tchain %s {\n", chainClusterIPsCheck)
	fmt.Fprintf(b, "\t\t%s @%s goto %s\n", daddrText(f), setClusterIPs(f), chainReject)
	for _, r := range rs.ServiceCIDRs {
		if r.family() == f {
			fmt.Fprintf(b, "\t\t%s %s drop\n", daddrText(f), r)
		}
	}
	b.WriteString("\t}\n\n")
	sh := shardsOf(rs.Sets)
	for _, lc := range lookupChains {
		fmt.Fprintf(b, "\tchain %s {\n", lc.name)
		lookupRules(f, rs.Options, sh, lc.kinds, func(r lookupRule) {
			fmt.Fprintf(b, "\t\t%s\n", r.text())
		})
		b.WriteString("\t}\n\n")
	}
	if sh.guarded(f) {
		fmt.Fprintf(b, "\tchain %s {\n", shardsChainName(f))
		sh.each(f, func(n uint32) { fmt.Fprintf(b, "\t\t%s\n", shardRuleText(f, n)) })
		b.WriteString("\t}\n\n")
	}
	// A TCP reset implies the protocol's match (nft lists it without);
	// "reject" alone is an ICMP (ICMPv6) port unreachable.
	fmt.Fprintf(b, "\tchain %s {\n\t\treject with tcp reset\n\t\treject\n\t}\n\n", chainReject)
	for _, c := range nodePortChecks(f) {
		verdict := "goto " + chainReject
		if c.drop {
			verdict = "drop"
		}
		fmt.Fprintf(b, "\tchain %s {\n", c.name)
		for _, npm := range nodePortMatches(rs.Options, f) {
			fmt.Fprintf(b, "\t\t%s %s\n", nodePortMatchText(f, npm), verdict)
		}
		b.WriteString("\t}\n\n")
	}
	mark := rs.Options.mark()
	fmt.Fprintf(b, "\tchain %s {\n", chainMasquerading)
	fmt.Fprintf(b, "\t\tmeta mark & 0x%08x != 0x00000000 meta mark set meta mark ^ 0x%08x masquerade fully-random\n", mark, mark)
	fmt.Fprintf(b, "\t\tct status dnat %s . %s @%s masquerade fully-random\n", saddrText(f), daddrText(f), mapHairpin(f))
	b.WriteString("\t}\n\n")
	fmt.Fprintf(b, "\tchain %s {\n\t\tmeta mark set meta mark | 0x%08x\n\t}\n", chainMarkForMasquerade, mark)
	for _, c := range rs.Chains {
		if c.Family != f {
			continue
		}
		fmt.Fprintf(b, "\n\tchain %s {\n", c.Name)
		for _, r := range c.Rules {
			fmt.Fprintf(b, "\t\t%s\n", r)
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
}

// writeElements ends the declaration of a set or map in a listing: its
// elements, if any, and its closing brace.
func writeElements(b *strings.Builder, els []string) {
	if len(els) > 0 {
		fmt.Fprintf(b, "\t\telements = {\n%s\n\t\t}\n", strings.Join(els, ",\n"))
	}
	b.WriteString("\t}\n\n")
}
