package nft

import (
	"fmt"
	"math/bits"
	"strconv"
	"strings"

	"sigs.k8s.io/kpng/model"
)

// This file holds the shard maps: how most services are added, changed
// and removed with set elements only, without a chain or a rule of their
// own, and with no pipapo set (an interval map with a concatenated key),
// whose insertions cost the kernel tens of microseconds each
// (docs/benchmarks.md, "Shards by endpoint count").
//
// A plain service port (ClusterIP only, no session affinity, one cluster
// IP in the family, 1 to maxShardEndpoints usable endpoints) has no chain
// of its own: with N endpoints in the family, it is in shard N. Its key is
// an element of the shard's set, which a rule of the services chain looks
// up to go to the shard's chain; that chain draws one of N at random and
// DNATs through the shard's map, a hash keyed by (cluster IP . protocol .
// port . draw):
//
//	set shard-ips-v4-2 {
//		type ipv4_addr . inet_proto . inet_service
//		elements = { 10.96.0.17 . tcp . 80 comment "default/web", … }
//	}
//
//	map shard-endpoints-v4-2 {
//		typeof ip daddr . meta l4proto . th dport . numgen random mod 2 : ip daddr . th dport
//		elements = { 10.96.0.17 . tcp . 80 . 0 : 10.1.0.1 . 8080,
//			     10.96.0.17 . tcp . 80 . 1 : 10.1.0.2 . 8080, … }
//	}
//
//	chain services {
//		ip daddr . meta l4proto . th dport @shard-ips-v4-2 goto shard4-2
//		…the other shards of the family, then its services map
//	}
//
//	chain shard4-2 {
//		ip saddr != 10.0.0.0/16 jump mark-for-masquerade
//		dnat ip to ip daddr . meta l4proto . tcp dport . numgen random mod 2 map @shard-endpoints-v4-2
//		…udp, sctp
//	}
//
// The first packet of a plain service port crosses the same lookups as
// through kube-proxy's table (a set lookup in place of its verdict map's,
// a chain, a hash lookup of the endpoint), and one per shard of fewer
// endpoints before its own; a packet to another service crosses every
// shard's rule before the services map (about 0.3 µs each, measured). From
// shardGuardMin shards in a family, the shards' rules are in a chain of
// their own, shards-v4, which the services chain jumps to only for a
// cluster IP (`ip daddr @cluster-ips-v4 jump shards-v4`): a packet to no
// service, or to an external or load-balancer IP, then crosses one lookup
// whatever the shards, a cluster IP's one more. (A packet that fell off
// the end of a shard's chain, which a consistent table never lets happen,
// would then go on in the services chain after the jump.) Each endpoint is one hash
// element, as fair a draw as kube-proxy's (`numgen random mod N`).
//
// What it saves: a service port added, deleted or moved to another shard
// (its number of endpoints changed) is set elements without a verdict:
// the kernel does not validate the table at commit, which a `goto`
// element makes it do, walking every element of the verdict maps (9 ms
// for a service added at 50,000 services, 13 ms with cold caches, when
// plain ports were `goto` elements of the services map;
// docs/benchmarks.md). A shard appearing or going rewrites the services
// chain, and the family's shards chain from shardGuardMin shards (a walk,
// of the verdict maps' other elements only). An endpoint
// replaced by another (the same number) changes the elements whose
// draw's endpoint shifts (endpoints are in address order: from one to all
// N). A shard's set, chain and map exist while it holds a service port;
// there are at most maxShardEndpoints a family. Other services keep a
// chain per service port (docs/backends/nft.md).

// maxShardEndpoints is the most endpoints a service port of the shard
// maps has in a family, so the most shards a family has; one with more
// keeps a chain and a block of an endpoint map.
const maxShardEndpoints = 64

// shardSlotBase is the first slot of the blocks of the shard maps: their
// slots identify their elements (endpointElement.ID) and comments, apart
// from the endpoint maps' blocks, whose slots place them in their maps.
const shardSlotBase = 1 << 30

// shardChainName names the chain of shard n (the service ports of n
// endpoints) of family f: "shard4-2".
func shardChainName(f ipFamily, n uint32) string {
	return "shard" + familySuffix(f) + "-" + strconv.Itoa(int(n))
}

// shardMapName names the map of shard n of family f:
// "shard-endpoints-v4-2".
func shardMapName(f ipFamily, n uint32) string {
	return "shard-endpoints-v" + familySuffix(f) + "-" + strconv.Itoa(int(n))
}

// shardSetName names the set of the service ports of shard n of family
// f: "shard-ips-v4-2".
func shardSetName(f ipFamily, n uint32) string {
	return "shard-ips-v" + familySuffix(f) + "-" + strconv.Itoa(int(n))
}

// shards are the shards holding a service port, in each family: bit n-1
// of shards[f] for shard n of f.
type shards [2]uint64

// set records shard n of f (1 to maxShardEndpoints) present, or absent
// when !present.
func (s *shards) set(f ipFamily, n uint32, present bool) {
	if present {
		s[f] |= 1 << (n - 1)
	} else {
		s[f] &^= 1 << (n - 1)
	}
}

// each calls fn with each shard of f present, in increasing order.
func (s shards) each(f ipFamily, fn func(n uint32)) {
	for n := uint32(1); n <= maxShardEndpoints; n++ {
		if s[f]&(1<<(n-1)) != 0 {
			fn(n)
		}
	}
}

// shardsOf returns the shards whose sets are among sets.
func shardsOf(sets []*namedSet) shards {
	var s shards
	for _, st := range sets {
		if st.ShardSet > 0 {
			s.set(st.Family, st.ShardSet, true)
		}
	}
	return s
}

// after returns the shards present after the round d, which creates and
// deletes the shards' sets with their shards.
func (s shards) after(d delta) shards {
	for _, it := range d.Sets.Created {
		if it.Value.ShardSet > 0 {
			s.set(it.Value.Family, it.Value.ShardSet, true)
		}
	}
	for _, it := range d.Sets.Deleted {
		if it.Prev.ShardSet > 0 {
			s.set(it.Prev.Family, it.Prev.ShardSet, false)
		}
	}
	return s
}

// shardGuardMin is the number of shards of a family from which their
// rules are behind the cluster-IP check (shardsChainName): with fewer, the
// check would cost a plain port's packet more than it saves the others.
const shardGuardMin = 3

// count returns the number of shards of both families.
func (s shards) count() int { return bits.OnesCount64(s[ipv4]) + bits.OnesCount64(s[ipv6]) }

// guarded reports whether the shards' rules of family f are in its shards
// chain, behind the cluster-IP check.
func (s shards) guarded(f ipFamily) bool { return bits.OnesCount64(s[f]) >= shardGuardMin }

// sameServicesRules reports whether the services chain of family f's
// table has the same rules with the shards s and o: both behind the
// cluster-IP check (one jump, whatever the shards), or both not and the
// same shards.
func (s shards) sameServicesRules(f ipFamily, o shards) bool {
	return s.guarded(f) == o.guarded(f) && (s.guarded(f) || s[f] == o[f])
}

// shardsChainName names the chain holding the shards' rules of family f
// when they are behind the cluster-IP check (guarded): "shards-v4".
func shardsChainName(f ipFamily) string { return "shards-v" + familySuffix(f) }

// shardGuardText is the text of the services chain's rule jumping to the
// shards' rules of family f for a cluster IP, as nft lists it: "ip daddr
// @cluster-ips-v4 jump shards-v4".
func shardGuardText(f ipFamily) string {
	return fmt.Sprintf("%s @%s jump %s", daddrText(f), setClusterIPs(f), shardsChainName(f))
}

// shardRuleText is the text of the services chain's rule of shard n of
// family f, as nft lists it: "ip daddr . meta l4proto . th dport
// @shard-ips-v4-2 goto shard4-2".
func shardRuleText(f ipFamily, n uint32) string {
	return fmt.Sprintf("%s . meta l4proto . th dport @%s goto %s", daddrText(f), shardSetName(f, n), shardChainName(f, n))
}

// isShardEndpointMap reports whether the set name is a shard map.
func isShardEndpointMap(name string) bool { return strings.HasPrefix(name, "shard-endpoints-v") }

// shardChain returns the chain of shard n of family f: the masquerading
// rule of a cluster IP's traffic, as a service chain has it (with opts'
// cluster CIDRs or masquerade-all), then a DNAT through the shard's map
// per protocol.
func shardChain(f ipFamily, n uint32, opts Options) *regularChain {
	var rules []rule
	if cidrs := prefixesOf(opts.ClusterCIDRs, f); opts.MasqueradeAll || len(cidrs) > 0 {
		if opts.MasqueradeAll {
			cidrs = nil
		}
		rules = append(rules, markRule{Family: f, Except: cidrs})
	}
	for _, p := range []model.Protocol{model.TCP, model.UDP, model.SCTP} {
		rules = append(rules, shardDnatRule{Family: f, Proto: p, Map: shardMapName(f, n), Mod: n})
	}
	return &regularChain{Name: shardChainName(f, n), Family: f, Rules: rules}
}

// shardDnatRule DNATs a packet of protocol Proto to the endpoint its
// destination and a random draw in [0, Mod) find in the shard map Map, as
// nft lists it: "dnat ip to ip daddr . meta l4proto . tcp dport . numgen
// random mod 2 map @shard-endpoints-v4-2" (nft writes the protocol match
// into the port's name).
type shardDnatRule struct {
	Family ipFamily
	Proto  model.Protocol
	Map    string
	Mod    uint32
}

// String implements rule.
func (r shardDnatRule) String() string {
	nft := r.Family.info().nft
	return fmt.Sprintf("dnat %s to %s daddr . meta l4proto . %s dport . %s map @%s", nft, nft, protoName(r.Proto), numgenText(r.Mod, 0), r.Map)
}

// shardMapTypeof is the typeof declaration of the map of shard n of
// family f.
func shardMapTypeof(f ipFamily, n uint32) string {
	return fmt.Sprintf("%s . meta l4proto . th dport . %s : %s", daddrText(f), numgenText(n, 0), endpointDataTypeof(f))
}
