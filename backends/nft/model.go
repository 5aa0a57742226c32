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

// Family is an IP family.
type Family int

// The IP families.
const (
	IPv4 Family = iota
	IPv6
)

// String returns "ipv4" or "ipv6".
func (f Family) String() string { return f.info().name }

// familyOf returns the family of a.
func familyOf(a netip.Addr) Family {
	if a.Is4() {
		return IPv4
	}
	return IPv6
}

// Key is the key of a map element: destination address, protocol and
// port of a service, or only protocol and port (Addr not valid) in the
// node-port maps.
type Key struct {
	Addr  netip.Addr
	Proto model.Protocol
	Port  uint16
}

// String returns the key in nft syntax: "10.96.0.10 . tcp . 80", or
// "tcp . 30080" for a node port.
func (k Key) String() string {
	if !k.Addr.IsValid() {
		return fmt.Sprintf("%s . %d", protoName(k.Proto), k.Port)
	}
	return fmt.Sprintf("%s . %s . %d", k.Addr, protoName(k.Proto), k.Port)
}

// Verdict is the value of a map element: goto a chain, or drop.
type Verdict struct {
	// Goto is the chain to go to; empty means drop.
	Goto string
}

// String returns the verdict in nft syntax.
func (v Verdict) String() string {
	if v.Goto == "" {
		return "drop"
	}
	return "goto " + v.Goto
}

// Element is one element of one of the table's verdict maps.
type Element struct {
	// Map is the map's name (MapServices or MapNoEndpoints).
	Map     string
	Family  Family
	Key     Key
	Verdict Verdict
	// Service is the service the element belongs to (for logs).
	Service model.ServiceKey
}

// ID returns the element's identity in the table: its map and key.
func (e Element) ID() string { return e.Map + " " + e.Key.String() }

// Chain is a regular (non-base) chain of the table, owned by one service.
type Chain struct {
	Name    string
	Service model.ServiceKey
	Rules   []Rule
}

// equalChains reports whether two chains have the same name and rules.
func equalChains(a, b *Chain) bool {
	return a.Name == b.Name && slices.EqualFunc(a.Rules, b.Rules, func(x, y Rule) bool { return x.String() == y.String() })
}

// Rule is one rule of a service, endpoint or firewall chain (BalanceRule,
// DNATRule, DNATMapRule, MarkRule, SourceRule, AllowRule, DropRule,
// AffinityCheckRule, AffinityUpdateRule).
type Rule interface {
	// String returns the rule in nft syntax, as `nft list` prints the
	// rule exprs programs (TestKernelListingMatchesText checks it).
	String() string
	// exprs returns the rule's netlink expressions, what the kernel is
	// sent; sets holds the sets added in the same transaction, for the
	// IDs of those the rule refers to.
	exprs(sets map[string]*nftables.Set) ([]expr.Any, error)
}

// BalanceRule sends a packet to one of Targets (endpoint chains), chosen
// at random through the named verdict map Map, which holds them:
// "numgen random mod N vmap @bal4-…", or "goto A" when there is one
// target (and no map).
type BalanceRule struct {
	Targets []string
	Map     string
}

// String implements Rule.
func (r BalanceRule) String() string {
	if len(r.Targets) == 1 {
		return "goto " + r.Targets[0]
	}
	return fmt.Sprintf("numgen random mod %d vmap @%s", len(r.Targets), r.Map)
}

// DNATRule rewrites the destination of a packet of protocol Proto to To:
// "meta l4proto tcp dnat ip to 10.1.2.3:8080".
type DNATRule struct {
	Proto model.Protocol
	To    netip.AddrPort
}

// String implements Rule.
func (r DNATRule) String() string {
	return fmt.Sprintf("meta l4proto %s dnat %s to %s", protoName(r.Proto), familyOf(r.To.Addr()).info().nft, r.To)
}

// Ruleset is the desired content of the table: its regular chains, named
// sets and map elements (the base chains, the lookup chains, the reject and
// masquerade chains and the maps themselves are fixed: see Text), sorted by
// name and by map and key.
type Ruleset struct {
	Table    string
	Options  Options
	Chains   []*Chain
	Sets     []*Set
	Elements []Element
	// Endpoints are the elements of the endpoint maps (named in Sets).
	Endpoints []EndpointElement
	// Hairpin are the endpoint addresses of the hairpin sets.
	Hairpin []netip.Addr
}

// sortElements orders elements by map, then key (address, protocol, port).
func sortElements(els []Element) {
	slices.SortFunc(els, compareElements)
}

func compareElements(a, b Element) int {
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

// Block is the set of endpoints one service chain DNATs to (without
// session affinity): a block of an endpoint map, keyed by the block's
// slot and a random number. The chain's DNATMapRule draws the number;
// changing the endpoints changes only the block's elements.
type Block struct {
	// ID identifies the block: its chain's kind, family and service port.
	ID      string
	Family  Family
	Service model.ServiceKey
	// Endpoints are the addresses and ports to DNAT to, in order.
	Endpoints []netip.AddrPort
	// Slot is the block's place, set by the Tracker: its number among
	// the family's blocks.
	Slot uint32
}

// Map returns the name of the endpoint map holding the block.
func (bl *Block) Map() string { return EndpointMap(bl.Family, bl.Slot/blocksPerMap) }

// equalBlocks reports whether two blocks are the same.
func equalBlocks(a, b *Block) bool {
	return a.ID == b.ID && a.Family == b.Family && a.Service == b.Service && a.Slot == b.Slot && slices.Equal(a.Endpoints, b.Endpoints)
}

// elements returns the intervals of the block in its endpoint map: the
// i-th endpoint of N owns [i·M/N, (i+1)·M/N), M being endpointModulus.
func (bl *Block) elements() []EndpointElement {
	n := uint64(len(bl.Endpoints))
	els := make([]EndpointElement, len(bl.Endpoints))
	for i, ep := range bl.Endpoints {
		els[i] = EndpointElement{
			Family: bl.Family,
			Slot:   bl.Slot,
			From:   uint32(uint64(i) * endpointModulus / n),
			To:     uint32(uint64(i+1) * endpointModulus / n),
			Target: ep,
		}
	}
	return els
}

// EndpointElement is one interval of an endpoint map: the keys
// Slot . [From, To) lead to Target. It holds no string, so that the
// hundreds of thousands of a large table cost the garbage collector little.
type EndpointElement struct {
	Family   Family
	Slot     uint32
	From, To uint32
	Target   netip.AddrPort
}

// Map returns the name of the endpoint map holding the element.
func (e EndpointElement) Map() string { return EndpointMap(e.Family, e.Slot/blocksPerMap) }

// ID returns the element's identity, which orders elements by family,
// slot and first key: the family in the top bit, the slot in the next 31
// (slots are handed out lowest first: a table never has 2^31 blocks), the
// first key in the low 32.
func (e EndpointElement) ID() uint64 {
	return uint64(e.Family)<<63 | uint64(e.Slot&(1<<31-1))<<32 | uint64(e.From)
}

// String returns the element in nft syntax, as nft prints it: the key is
// one 8-byte integer, slot·2^32 + the random number, so slot 7's interval
// [0, 429496729) is "30064771072-30494267800 : 10.1.0.2 . 8080" (an
// interval of one number is that number alone).
func (e EndpointElement) String() string {
	from, last := uint64(e.Slot)<<32|uint64(e.From), uint64(e.Slot)<<32|uint64(e.To-1)
	if from == last {
		return fmt.Sprintf("%d : %s . %d", from, e.Target.Addr(), e.Target.Port())
	}
	return fmt.Sprintf("%d-%d : %s . %d", from, last, e.Target.Addr(), e.Target.Port())
}

// compareEndpointElements orders elements by family, slot and first key
// (so by map too).
func compareEndpointElements(a, b EndpointElement) int { return cmp.Compare(a.ID(), b.ID()) }

// DNATMapRule DNATs to an endpoint of a block drawn at random:
// "meta l4proto tcp dnat ip to 7 . numgen random mod 4294967295 map
// @endpoints-v4-0", where 7 is the block's slot.
type DNATMapRule struct {
	Family Family
	Proto  model.Protocol
	// Block is the ID of the block; Slot and Map its place (set by the
	// Tracker).
	Block string
	Slot  uint32
	Map   string
}

// String implements Rule.
func (r DNATMapRule) String() string {
	return fmt.Sprintf("meta l4proto %s dnat %s to %d . numgen random mod %d map @%s", protoName(r.Proto), r.Family.info().nft, r.Slot, uint32(endpointModulus), r.Map)
}
