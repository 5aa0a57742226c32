//go:build linux

package nft

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"sigs.k8s.io/kpng/client/model"
)

// ipFamily is an IP family.
type ipFamily int

// The IP families.
const (
	ipv4 ipFamily = iota
	ipv6
)

// String returns "ipv4" or "ipv6".
func (f ipFamily) String() string { return f.info().name }

// familyOf returns the family of a.
func familyOf(a netip.Addr) ipFamily {
	if a.Is4() {
		return ipv4
	}
	return ipv6
}

// mapKey is the key of a map element: destination address, protocol and
// port of a service, or only protocol and port (Addr not valid) in the
// node-port maps.
type mapKey struct {
	Addr  netip.Addr
	Proto model.Protocol
	Port  uint16
}

// String returns the key in nft syntax: "10.96.0.10 . tcp . 80", or
// "tcp . 30080" for a node port.
func (k mapKey) String() string {
	if !k.Addr.IsValid() {
		return fmt.Sprintf("%s . %d", protoName(k.Proto), k.Port)
	}
	return fmt.Sprintf("%s . %s . %d", k.Addr, protoName(k.Proto), k.Port)
}

// verdict is the value of a map element: goto a chain, or drop.
type verdict struct {
	// Goto is the chain to go to; empty means drop.
	Goto string
}

// String returns the verdict in nft syntax.
func (v verdict) String() string {
	if v.Goto == "" {
		return "drop"
	}
	return "goto " + v.Goto
}

// mapElement is one element of one of the table's verdict maps.
type mapElement struct {
	// Map is the map's name (mapServices or mapNoEndpoints).
	Map     string
	Family  ipFamily
	Key     mapKey
	Verdict verdict
	// Service is the service the element belongs to (for logs), Field
	// the field of the service it comes from (for problems).
	Service model.ServiceKey
	Field   string
}

// ID returns the element's identity in the table: its map and key.
func (e mapElement) ID() string { return e.Map + " " + e.Key.String() }

// regularChain is a regular (non-base) chain of the table, owned by one service.
type regularChain struct {
	Name    string
	Service model.ServiceKey
	Rules   []rule
}

// equalChains reports whether two chains have the same name and rules.
func equalChains(a, b *regularChain) bool {
	return a.Name == b.Name && slices.EqualFunc(a.Rules, b.Rules, func(x, y rule) bool { return x.String() == y.String() })
}

// rule is one rule of a service, endpoint or firewall chain (balanceRule,
// dnatRule, dnatMapRule, markRule, sourceRule, allowRule, dropRule,
// affinityCheckRule, affinityUpdateRule).
type rule interface {
	// String returns the rule in nft syntax, as `nft list` prints the
	// rule exprs programs (TestKernelListingMatchesText checks it).
	String() string
	// exprs returns the rule's netlink expressions, what the kernel is
	// sent; sets holds the sets added in the same transaction, for the
	// IDs of those the rule refers to.
	exprs(sets map[string]*nftables.Set) ([]expr.Any, error)
}

// balanceRule sends a packet to one of Targets (endpoint chains), chosen
// at random through the named verdict map Map, which holds them:
// "numgen random mod N vmap @bal4-…", or "goto A" when there is one
// target (and no map).
type balanceRule struct {
	Targets []string
	Map     string
}

// String implements rule.
func (r balanceRule) String() string {
	if len(r.Targets) == 1 {
		return "goto " + r.Targets[0]
	}
	return fmt.Sprintf("numgen random mod %d vmap @%s", len(r.Targets), r.Map)
}

// dnatRule rewrites the destination of a packet of protocol Proto to To:
// "meta l4proto tcp dnat ip to 10.1.2.3:8080".
type dnatRule struct {
	Proto model.Protocol
	To    netip.AddrPort
}

// String implements rule.
func (r dnatRule) String() string {
	return fmt.Sprintf("meta l4proto %s dnat %s to %s", protoName(r.Proto), familyOf(r.To.Addr()).info().nft, r.To)
}

// ruleset is the desired content of the table: its regular chains, named
// sets and map elements (the base chains, the lookup chains, the reject and
// masquerade chains and the maps themselves are fixed: see Text), sorted by
// name and by map and key.
type ruleset struct {
	Table    string
	Options  Options
	Chains   []*regularChain
	Sets     []*namedSet
	Elements []mapElement
	// Endpoints are the elements of the endpoint maps (named in Sets).
	Endpoints []endpointElement
	// Hairpin are the endpoint addresses of the hairpin sets.
	Hairpin []netip.Addr
	// ClusterIPs are the addresses of the cluster-ips sets: every
	// cluster IP of the services held.
	ClusterIPs []netip.Addr
	// ServiceCIDRs are the ranges of the service-cidrs sets (the
	// cluster's service CIDRs, for the default proxier).
	ServiceCIDRs []addrRange
}

// sortElements orders elements by map, then key (address, protocol, port).
func sortElements(els []mapElement) {
	slices.SortFunc(els, compareElements)
}

func compareElements(a, b mapElement) int {
	if c := strings.Compare(a.Map, b.Map); c != 0 {
		return c
	}
	if c := a.Key.Addr.Compare(b.Key.Addr); c != 0 {
		return c
	}
	if a.Key.Proto != b.Key.Proto {
		return int(a.Key.Proto - b.Key.Proto)
	}
	return int(a.Key.Port) - int(b.Key.Port)
}

// endpointModulus is the range of the random number that chooses an
// endpoint: numgen draws in [0, endpointModulus), and each endpoint of a
// block owns an interval of it in proportion (1 / N, give or take one
// number in 2^32: uniform for any N). The number being fixed, the rule
// that draws it never changes with the endpoints: only map elements do.
const endpointModulus = 0xFFFFFFFF

// blocksPerMap is the number of blocks that share one endpoint map. The
// kernel walks the rules bound to a map for every element added to it, and
// the sets of a table by name for every message naming one: about sqrt of
// 10,000 blocks keeps both walks short.
const blocksPerMap = 16

// block is the set of endpoints one service chain DNATs to (without
// session affinity): a block of an endpoint map, keyed by the block's
// slot and a random number. The chain's dnatMapRule draws the number;
// changing the endpoints changes only the block's elements.
type block struct {
	// ID identifies the block: its chain's kind, family and service port.
	ID      string
	Family  ipFamily
	Service model.ServiceKey
	// Endpoints are the addresses and ports to DNAT to, in order.
	Endpoints []netip.AddrPort
	// Slot is the block's place, set by the tracker: its number among
	// the family's blocks.
	Slot uint32
}

// Map returns the name of the endpoint map holding the block.
func (bl *block) Map() string { return endpointMapName(bl.Family, bl.Slot/blocksPerMap) }

// equalBlocks reports whether two blocks are the same.
func equalBlocks(a, b *block) bool {
	return a.ID == b.ID && a.Family == b.Family && a.Service == b.Service && a.Slot == b.Slot && slices.Equal(a.Endpoints, b.Endpoints)
}

// elements returns the intervals of the block in its endpoint map: the
// i-th endpoint of N owns [i·M/N, (i+1)·M/N), M being endpointModulus.
func (bl *block) elements() []endpointElement {
	n := uint64(len(bl.Endpoints))
	els := make([]endpointElement, len(bl.Endpoints))
	for i, ep := range bl.Endpoints {
		els[i] = endpointElement{
			Family: bl.Family,
			Slot:   bl.Slot,
			From:   uint32(uint64(i) * endpointModulus / n),
			To:     uint32(uint64(i+1) * endpointModulus / n),
			Target: ep,
		}
	}
	return els
}

// endpointElement is one interval of an endpoint map: the keys
// Slot . [From, To) lead to Target. It holds no string, so that the
// hundreds of thousands of a large table cost the garbage collector little.
type endpointElement struct {
	Family   ipFamily
	Slot     uint32
	From, To uint32
	Target   netip.AddrPort
}

// Map returns the name of the endpoint map holding the element.
func (e endpointElement) Map() string { return endpointMapName(e.Family, e.Slot/blocksPerMap) }

// ID returns the element's identity, which orders elements by family,
// slot and first key: the family in the top bit, the slot in the next 31
// (slots are handed out lowest first: a table never has 2^31 blocks), the
// first key in the low 32.
func (e endpointElement) ID() uint64 {
	return uint64(e.Family)<<63 | uint64(e.Slot&(1<<31-1))<<32 | uint64(e.From)
}

// String returns the element in nft syntax, as nft prints it: the key is
// one 8-byte integer, slot·2^32 + the random number, so slot 7's interval
// [0, 429496729) is "30064771072-30494267800 : 10.1.0.2 . 8080" (an
// interval of one number is that number alone).
func (e endpointElement) String() string {
	from, last := uint64(e.Slot)<<32|uint64(e.From), uint64(e.Slot)<<32|uint64(e.To-1)
	if from == last {
		return fmt.Sprintf("%d : %s . %d", from, e.Target.Addr(), e.Target.Port())
	}
	return fmt.Sprintf("%d-%d : %s . %d", from, last, e.Target.Addr(), e.Target.Port())
}

// compareEndpointElements orders elements by family, slot and first key
// (so by map too).
func compareEndpointElements(a, b endpointElement) int { return cmp.Compare(a.ID(), b.ID()) }

// dnatMapRule DNATs to an endpoint of a block drawn at random:
// "meta l4proto tcp dnat ip to 7 . numgen random mod 4294967295 map
// @endpoints-v4-0", where 7 is the block's slot.
type dnatMapRule struct {
	Family ipFamily
	Proto  model.Protocol
	// Block is the ID of the block; Slot and Map its place (set by the
	// tracker).
	Block string
	Slot  uint32
	Map   string
}

// String implements rule.
func (r dnatMapRule) String() string {
	return fmt.Sprintf("meta l4proto %s dnat %s to %d . numgen random mod %d map @%s", protoName(r.Proto), r.Family.info().nft, r.Slot, uint32(endpointModulus), r.Map)
}
