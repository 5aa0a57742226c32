package nft

import (
	"fmt"
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
// of its own: with N endpoints in the family, it is in shard N, whose
// chain draws one of N at random and DNATs through the shard's map, a
// hash keyed by (cluster IP . protocol . port . draw):
//
//	map shard-endpoints-v4-2 {
//		typeof ip daddr . meta l4proto . th dport . numgen random mod 2 : ip daddr . th dport
//		elements = { 10.96.0.17 . tcp . 80 . 0 : 10.1.0.1 . 8080,
//			     10.96.0.17 . tcp . 80 . 1 : 10.1.0.2 . 8080, … }
//	}
//
//	chain shard4-2 {
//		ip saddr != 10.0.0.0/16 jump mark-for-masquerade
//		dnat ip to ip daddr . meta l4proto . tcp dport . numgen random mod 2 map @shard-endpoints-v4-2
//		…udp, sctp
//	}
//
// The service port's element in the services map sends it to its shard's
// chain (`10.96.0.17 . tcp . 80 : goto shard4-2`), as kube-proxy's
// sends it to the service's own chain: the first packet crosses the same
// lookups as through kube-proxy's table (a verdict map, a chain, a hash
// lookup of the endpoint). Each endpoint is one hash element, as
// fair a draw as kube-proxy's (`numgen random mod N`).
//
// What it costs: a `goto` element makes the kernel validate the table at
// commit, walking every element of the verdict maps (a service added took
// 4.7–8.5 ms at 50,000 services, BenchmarkServiceAddDelete, two sittings):
// when a service port is added, or its number of endpoints changes (it
// moves to another shard). An endpoint replaced by another (the same
// number) changes the elements whose draw's endpoint shifts (endpoints
// are in address order: from one to all N), with no walk. A shard's chain
// and map exist while it holds a service port; there are at most
// maxShardEndpoints a family. Other services keep a chain per service port
// (docs/backends/nft.md).

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
	return &regularChain{Name: shardChainName(f, n), Rules: rules}
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
