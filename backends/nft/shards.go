package nft

import (
	"fmt"
	"math/bits"
	"net/netip"
	"strconv"
	"strings"

	"sigs.k8s.io/kpng/model"
)

// This file holds the shard maps: how most services are added and
// removed without a chain, a rule or a goto element, any of which makes
// the kernel validate every chain of the table at commit (about 100 ms at
// 50,000 services; docs/benchmarks.md, "What makes a commit validate the
// whole table").
//
// A plain service port (ClusterIP only, no session affinity, one cluster
// IP in the family, 1 to maxShardEndpoints usable endpoints) has no chain
// of its own: its endpoints are elements of one of the shard maps of its
// family (256 to 4,096, following the table's size: shardBitsFor), chosen
// by the last bits of its cluster IP, keyed by
// (cluster IP . protocol . port . draw), the draw being a random number in
// [0, shardRange) of which each endpoint owns an interval:
//
//	map shard-endpoints-v4-17 {
//		typeof ip daddr . meta l4proto . th dport . numgen random mod 4096 : ip daddr . th dport
//		flags interval
//		elements = { 10.96.0.17 . tcp . 80 . 0-2047 : 10.1.0.1 . 8080, … }
//	}
//
// The services chain sends a packet to a cluster IP that no verdict map
// element took to its shard's chain (`ip daddr @cluster-ips-v4 ip daddr &
// 0.0.15.255 vmap @shards-v4` with 4,096 shards), whose rules ask for
// masquerading (as a service chain does) and DNAT through the shard's map:
//
//	chain shard4-17 {
//		ip saddr != 10.0.0.0/16 jump mark-for-masquerade
//		dnat ip to ip daddr . meta l4proto . tcp dport . numgen random mod 4096 map @shard-endpoints-v4-17
//		…udp, sctp
//	}
//
// A shard's chain, map and jump element exist while the shard holds a
// service port: at 50,000 services nearly all 4,096 do (and at 10,000
// nearly all 2,048 of that size's table), and adding a service is
// adding its endpoints' elements (and its cluster IP, its hairpin pairs):
// no walk. The first service of a shard creates them, which does walk the
// table once. Other services keep a chain per service port (docs/backends/nft.md).

// maxShardBits is the most bits of a cluster IP that choose its shard:
// 4,096 shards of a family. A shard map is a concatenation with a range,
// which the kernel keeps in its pipapo set type, whose insertions and
// commits cost more the more the set holds, and whose deletions much more
// (each one cuts a bit out of every bucket of every group of its lookup
// tables): BenchmarkEndpointChange and BenchmarkServiceAddDelete at 50,000
// services, in one sitting, with 1,024 shards of about 50 services: an
// endpoint change 10.7 ms, a service deleted 21.8 ms; with 4,096 shards of
// about 12: 3.5 and 3.5 ms, and the cold start no longer (23.8 against
// 29.0 s on that slow day).
const maxShardBits = 12

// maxShards is the most shards of a family.
const maxShards = 1 << maxShardBits

// minShardBits is the fewest bits that choose a shard: 256 shards, so
// that a small table's shards stay small (an endpoint change costs in
// proportion to its shard: see shardTarget).
const minShardBits = 8

// shardTarget is how many service ports a shard holds at most when the
// table is written whole (between the least and the most shards). Each
// shard in use costs a chain of 3 or 4 rules, a set and a jump element,
// and the kernel finds a set by name by walking the table's sets: at
// 10,000 services, the whole process's first sync took 4.4–4.9 s with
// 4,096 shards, 3.3–3.4 s with 2,048 (8 a shard), 2.9–3.0 s with 1,024
// (16); but an endpoint change, whose pipapo deletions cost in
// proportion to the shard, took 1.3, 1.7 and 2.7 ms (medians), and at
// 1,000 services 1.2 ms with 4,096 shards, 2.1 with 256, 3.7 with 128 and
// 7.4 with 64 (docs/benchmarks.md, "A shard count that follows the
// table"). 8 a shard, at least 256 shards, is the middle way.
const shardTarget = 8

// shardBitsFor returns the shard bits of a table written whole whose
// largest family has n service ports in the shard maps: enough shards for
// shardTarget ports each, within [minShardBits, maxShardBits]. The count
// changes only when the table is written whole, which a sync does once
// a cluster-ips (or hairpin) set outgrows its capacity (twice its
// addresses at the last full write, rounded up to a power of two;
// capacity.go) or the shard maps outgrow 4·shardTarget ports a shard
// (tracker.shardsOutgrown): a table growing by partial syncs holds at
// most 4·shardTarget ports a shard (beyond maxShards·shardTarget ports,
// more).
func shardBitsFor(n int) uint8 {
	need := max((n+shardTarget-1)/shardTarget, 1)
	return uint8(min(max(bits.Len(uint(need-1)), minShardBits), maxShardBits))
}

// shardRange is the range of the draw of a shard map: each of a service
// port's N endpoints owns [i·R/N, (i+1)·R/N) of it. A power of two, so
// that the kernel's expansion of a range into prefixes stays short (at
// most 22 for 12 bits): a range of 10^7, as the endpoint maps', made the
// same load twice as long. With maxShardEndpoints endpoints at most, an
// endpoint gets 64 numbers or more, so the shares differ by 1.6% at most.
const shardRange = 4096

// maxShardEndpoints is the most endpoints a service port of the shard
// maps has in a family; one with more keeps a chain and a block of an
// endpoint map, whose draw shares the endpoints to one in 10^7.
const maxShardEndpoints = 64

// shardSlotBase is the first slot of the blocks of the shard maps: their
// slots identify their elements (endpointElement.ID) and comments, apart
// from the endpoint maps' blocks, whose slots place them in their maps.
const shardSlotBase = 1 << 30

// shardOf returns the shard of a cluster IP in a table of shardBits
// bits: its last shardBits bits.
func shardOf(a netip.Addr, shardBits uint8) uint32 {
	b := a.As16()
	return (uint32(b[14])<<8 | uint32(b[15])) & (1<<shardBits - 1)
}

// shardChainName names the chain of shard s of family f: "shard4-17".
func shardChainName(f ipFamily, s uint32) string {
	return "shard" + familySuffix(f) + "-" + strconv.Itoa(int(s))
}

// shardMapName names the map of shard s of family f:
// "shard-endpoints-v4-17".
func shardMapName(f ipFamily, s uint32) string {
	return "shard-endpoints-v" + familySuffix(f) + "-" + strconv.Itoa(int(s))
}

// isShardEndpointMap reports whether the set name is a shard map.
func isShardEndpointMap(name string) bool { return strings.HasPrefix(name, "shard-endpoints-v") }

// mapShards returns the name of the verdict map of a family sending the
// shard bits of a cluster IP (its address masked: 0.0.0.17) to the
// shard's chain: "shards-v4" or "shards-v6".
func mapShards(f ipFamily) string { return "shards-v" + familySuffix(f) }

// shardKey returns the key of shard s in the shards map of family f: the
// address holding only the shard's bits (0.0.0.17, ::11).
func shardKey(f ipFamily, s uint32) netip.Addr {
	if f == ipv4 {
		return netip.AddrFrom4([4]byte{0, 0, byte(s >> 8), byte(s)})
	}
	var b [16]byte
	b[14], b[15] = byte(s>>8), byte(s)
	return netip.AddrFrom16(b)
}

// shardMaskAddr is the mask of shardBits shard bits as an address of
// family f: 0.0.15.255 or ::fff for 12.
func shardMaskAddr(f ipFamily, shardBits uint8) netip.Addr { return shardKey(f, 1<<shardBits-1) }

// shardJumpElement is the element of the shards map of family f sending
// shard s to its chain: a jump, so that a packet the shard does not DNAT
// (a port no service of the cluster IP defines) goes on to the node-port
// lookups, as before the shards.
func shardJumpElement(f ipFamily, s uint32) mapElement {
	return mapElement{Map: mapShards(f), Family: f, Key: mapKey{Addr: shardKey(f, s)}, Verdict: verdict{Goto: shardChainName(f, s), Jump: true}}
}

// shardChain returns the chain of shard s of family f: the masquerading
// rule of a cluster IP's traffic, as a service chain has it (with opts'
// cluster CIDRs or masquerade-all), then a DNAT through the shard's map
// per protocol.
func shardChain(f ipFamily, s uint32, opts Options) *regularChain {
	var rules []rule
	if cidrs := prefixesOf(opts.ClusterCIDRs, f); opts.MasqueradeAll || len(cidrs) > 0 {
		if opts.MasqueradeAll {
			cidrs = nil
		}
		rules = append(rules, markRule{Family: f, Except: cidrs})
	}
	for _, p := range []model.Protocol{model.TCP, model.UDP, model.SCTP} {
		rules = append(rules, shardDnatRule{Family: f, Proto: p, Map: shardMapName(f, s)})
	}
	return &regularChain{Name: shardChainName(f, s), Rules: rules}
}

// shardDnatRule DNATs a packet of protocol Proto to the endpoint its
// destination and a random draw find in the shard map Map, as nft lists
// it: "dnat ip to ip daddr . meta l4proto . tcp dport . numgen random mod
// 4096 map @shard-endpoints-v4-17" (nft writes the protocol match into the
// port's name).
type shardDnatRule struct {
	Family ipFamily
	Proto  model.Protocol
	Map    string
}

// String implements rule.
func (r shardDnatRule) String() string {
	nft := r.Family.info().nft
	return fmt.Sprintf("dnat %s to %s daddr . meta l4proto . %s dport . %s map @%s", nft, nft, protoName(r.Proto), numgenText(shardRange, 0), r.Map)
}

// shardLookupText is the rule of the services chain sending a packet to
// a cluster IP to its shard's chain, in a table of shardBits bits.
func shardLookupText(f ipFamily, shardBits uint8) string {
	return fmt.Sprintf("%s @%s %s & %s vmap @%s", daddrText(f), setClusterIPs(f), daddrText(f), shardMaskAddr(f, shardBits), mapShards(f))
}

// shardMapTypeof is the typeof declaration of a shard map of family f.
func shardMapTypeof(f ipFamily) string {
	return fmt.Sprintf("%s . meta l4proto . th dport . %s : %s", daddrText(f), numgenText(shardRange, 0), endpointDataTypeof(f))
}
