// Package allip is the data plane of kpng-allip, the "all-IP" proxier of
// kpng's blog post: every packet sent to one of a Service's external IPs,
// whatever its protocol and port, is DNATed to a local endpoint of the
// Service, with one rule per external IP.
//
// Rules computes the rules from kpng's state; Apply installs them with
// nftables, replacing the previous ones in one netlink transaction; Current
// reads back what is installed; ClearConntrack removes the UDP conntrack
// entries that would keep sending a client to a former target. Proxier ties
// them together for a backend's handler.
//
// # nftables layout
//
// kpng-allip owns one table per family, both named TableName ("kpng-allip"):
// "ip kpng-allip" for the IPv4 rules and "ip6 kpng-allip" for the IPv6 ones.
// Per-family tables keep each rule a plain "daddr X dnat to Y" (an inet table
// would need the family in every match and NAT expression) and mirror the
// iptables/ip6tables split of the blog's script. Each table has two NAT base
// chains at priority -100 (dstnat, where iptables' nat PREROUTING and
// OUTPUT are): "prerouting", for traffic entering the
// node, and "output", for traffic from the node itself. Both hold the same
// rules:
//
//	table ip kpng-allip {
//		chain prerouting {
//			type nat hook prerouting priority dstnat; policy accept;
//			ip daddr 10.0.0.55 dnat to 11.0.2.2 comment "default/kpng-example"
//		}
//		chain output {
//			type nat hook output priority -100; policy accept;
//			ip daddr 10.0.0.55 dnat to 11.0.2.2 comment "default/kpng-example"
//		}
//	}
//
// A family without rules has no table at all, so an empty state leaves
// nothing of kpng-allip in the ruleset. The tables are kpng-allip's alone:
// Apply deletes and recreates them whole.
package allip

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"sigs.k8s.io/kpng/model"
)

// Rule sends all traffic for External to Target.
type Rule struct {
	// External is one of the service's external IPs.
	External netip.Addr
	// Target is the address of the local endpoint, of the same family.
	Target netip.Addr
	// Service is the service the rule is for; it is kept in the rule's
	// comment.
	Service model.ServiceKey
}

// String returns "External -> Target (namespace/name)".
func (r Rule) String() string {
	return fmt.Sprintf("%s -> %s (%s)", r.External, r.Target, r.Service)
}

// validate checks that both addresses are valid, unzoned and of one family.
func (r Rule) validate() error {
	switch {
	case !r.External.IsValid() || !r.Target.IsValid():
		return fmt.Errorf("rule %v: missing address", r)
	case r.External.Zone() != "" || r.Target.Zone() != "":
		return fmt.Errorf("rule %v: zoned address", r)
	case r.External.Is4In6() || r.Target.Is4In6():
		return fmt.Errorf("rule %v: IPv4-mapped IPv6 address", r)
	case r.External.Is4() != r.Target.Is4():
		return fmt.Errorf("rule %v: addresses of different families", r)
	}
	return nil
}

// compareRules orders rules IPv4 first, then by external address.
func compareRules(a, b Rule) int {
	return a.External.Compare(b.External)
}

// Rules computes the rules for a state: for each service, in the order of
// their keys, and for each family, each external IP of that family is sent
// to the first local endpoint of that family, preferring ready endpoints,
// then serving (terminating) ones, then any. A service without a local
// endpoint of a family gets no rule for that family. The rules come sorted,
// IPv4 first, then by external address.
//
// Bad input never stops the computation: what cannot be used (a nil service
// or endpoint, an address that does not parse or is of the wrong family, an
// external IP already claimed by an earlier service) is skipped and
// described in problems, and the rules of everything else are returned.
func Rules(items []*model.ServiceEndpoints) (rules []Rule, problems []error) {
	items = slices.Clone(items)
	items = slices.DeleteFunc(items, func(it *model.ServiceEndpoints) bool {
		if it == nil || it.Service == nil {
			problems = append(problems, fmt.Errorf("state: an item without a service"))
			return true
		}
		return false
	})
	slices.SortStableFunc(items, func(a, b *model.ServiceEndpoints) int {
		return a.Service.Key().Compare(b.Service.Key())
	})
	claimed := map[netip.Addr]model.ServiceKey{}
	for _, it := range items {
		key := it.Service.Key()
		for _, fam := range []family{v4, v6} {
			externals := parseList(key, "external IP", fam, fam.list(it.Service.IPs.ExternalIPs), &problems)
			if len(externals) == 0 {
				continue
			}
			target, ok := pickTarget(key, fam, it.Endpoints, &problems)
			if !ok {
				continue
			}
			for _, ext := range externals {
				if owner, dup := claimed[ext]; dup {
					if owner != key {
						problems = append(problems, fmt.Errorf("service %s: external IP %s is already used by service %s: skipped", key, ext, owner))
					}
					continue
				}
				claimed[ext] = key
				rules = append(rules, Rule{External: ext, Target: target, Service: key})
			}
		}
	}
	slices.SortFunc(rules, compareRules)
	return rules, problems
}

// family is an address family of the state's IPSets.
type family bool

const (
	v4 family = false
	v6 family = true
)

func (f family) String() string {
	if f == v6 {
		return "IPv6"
	}
	return "IPv4"
}

func (f family) list(s model.IPSet) []string {
	if f == v6 {
		return s.V6
	}
	return s.V4
}

func (f family) has(a netip.Addr) bool { return a.Is6() == bool(f) }

// parseList parses the addresses of one family, skipping (and reporting)
// those that do not parse or are of the other family.
func parseList(key model.ServiceKey, what string, fam family, list []string, problems *[]error) []netip.Addr {
	var out []netip.Addr
	for _, s := range list {
		a, err := netip.ParseAddr(s)
		switch {
		case err != nil:
			*problems = append(*problems, fmt.Errorf("service %s: %s %q: %w: skipped", key, what, s, err))
			continue
		case a.Zone() != "":
			*problems = append(*problems, fmt.Errorf("service %s: %s %q has a zone: skipped", key, what, s))
			continue
		case a.Is4In6() || !fam.has(a):
			*problems = append(*problems, fmt.Errorf("service %s: %s %q is not an %v address: skipped", key, what, s, fam))
			continue
		}
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// pickTarget returns the address of the best local endpoint of the family.
func pickTarget(key model.ServiceKey, fam family, eps []*model.Endpoint, problems *[]error) (netip.Addr, bool) {
	const none = 3
	best, bestRank := netip.Addr{}, none
	for _, ep := range eps {
		if ep == nil || !ep.Local {
			continue
		}
		addrs := parseList(key, "local endpoint", fam, fam.list(ep.IPs), problems)
		if len(addrs) == 0 {
			continue
		}
		rank := 2
		switch {
		case ep.Ready:
			rank = 0
		case ep.Serving:
			rank = 1
		}
		if rank < bestRank {
			best, bestRank = addrs[0], rank
		}
	}
	return best, bestRank != none
}

// Changed returns the external addresses whose target differs between two
// sets of rules: added, removed or sent elsewhere. Their UDP conntrack
// entries are stale. The result is sorted.
func Changed(old, new []Rule) []netip.Addr {
	before := map[netip.Addr]netip.Addr{}
	for _, r := range old {
		before[r.External] = r.Target
	}
	var out []netip.Addr
	for _, r := range new {
		if t, ok := before[r.External]; !ok || t != r.Target {
			out = append(out, r.External)
		}
		delete(before, r.External)
	}
	for ext := range before {
		out = append(out, ext)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// sortRules sorts rules in place the way Rules returns them.
func sortRules(rules []Rule) {
	slices.SortFunc(rules, func(a, b Rule) int {
		return cmp.Or(compareRules(a, b), a.Target.Compare(b.Target))
	})
}
