package nft

import (
	"fmt"
	"strings"
)

// baseChain describes one of the fixed base chains of the table.
type baseChain struct {
	name     string
	typ      string // "nat" or "filter"
	hook     string
	priority int32
	jump     string
}

// Priorities of the base chains: dstnat (-100) for NAT, filter - 10 for
// the reject/drop chains (as kube-proxy: before the usual filter chains).
const (
	priorityDstNAT int32 = -100
	priorityFilter int32 = -10
)

// baseChains are the table's base chains, in the order they are created.
var baseChains = []baseChain{
	{ChainNATPrerouting, "nat", "prerouting", priorityDstNAT, ChainServices},
	{ChainNATOutput, "nat", "output", priorityDstNAT, ChainServices},
	{ChainFilterInput, "filter", "input", priorityFilter, ChainNoEndpoints},
	{ChainFilterForward, "filter", "forward", priorityFilter, ChainNoEndpoints},
	{ChainFilterOutput, "filter", "output", priorityFilter, ChainNoEndpoints},
}

// lookupRuleText is the text of the rule of a lookup chain for a family.
func lookupRuleText(f Family, m string) string {
	daddr := "ip daddr"
	if f == IPv6 {
		daddr = "ip6 daddr"
	}
	return fmt.Sprintf("%s . meta l4proto . th dport vmap @%s", daddr, m)
}

// Text renders the ruleset in nft's syntax (close to what `nft list table`
// prints, with elements one per line), for reading and golden files.
func (rs *Ruleset) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "table inet %s {\n", rs.Table)
	for _, f := range []Family{IPv4, IPv6} {
		for _, m := range []string{MapServices(f), MapNoEndpoints(f)} {
			addr := "ipv4_addr"
			if f == IPv6 {
				addr = "ipv6_addr"
			}
			fmt.Fprintf(&b, "\tmap %s {\n\t\ttype %s . inet_proto . inet_service : verdict\n", m, addr)
			var els []string
			for _, e := range rs.Elements {
				if e.Map == m {
					els = append(els, fmt.Sprintf("\t\t\t%s : %s", e.Key, e.Verdict))
				}
			}
			if len(els) > 0 {
				fmt.Fprintf(&b, "\t\telements = {\n%s\n\t\t}\n", strings.Join(els, ",\n"))
			}
			b.WriteString("\t}\n\n")
		}
	}
	for _, c := range baseChains {
		fmt.Fprintf(&b, "\tchain %s {\n\t\ttype %s hook %s priority %d; policy accept;\n\t\tjump %s\n\t}\n\n", c.name, c.typ, c.hook, c.priority, c.jump)
	}
	fmt.Fprintf(&b, "\tchain %s {\n", ChainServices)
	for _, f := range []Family{IPv4, IPv6} {
		fmt.Fprintf(&b, "\t\t%s\n", lookupRuleText(f, MapServices(f)))
	}
	fmt.Fprintf(&b, "\t}\n\n\tchain %s {\n", ChainNoEndpoints)
	for _, f := range []Family{IPv4, IPv6} {
		fmt.Fprintf(&b, "\t\t%s\n", lookupRuleText(f, MapNoEndpoints(f)))
	}
	fmt.Fprintf(&b, "\t}\n\n\tchain %s {\n\t\tmeta l4proto tcp reject with tcp reset\n\t\treject with icmpx port-unreachable\n\t}\n", ChainReject)
	for _, c := range rs.Chains {
		fmt.Fprintf(&b, "\n\tchain %s {\n", c.Name)
		for _, r := range c.Rules {
			fmt.Fprintf(&b, "\t\t%s\n", r)
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String()
}
