package nft

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"sigs.k8s.io/kpng/model"
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
	// Shard, when not 0, says that the service port is served through
	// the shard maps (shards.go) and is in shard Shard (its number of
	// endpoints): Goto is that shard's chain, Block the ID of the service
	// port's block there, which holds its endpoints. The element is then
	// not in the services map but in the shard's set (mapElement.set),
	// whose rule in the services chain goes to Goto.
	Shard uint32
	Block string
}

// String returns the verdict in nft syntax.
func (v verdict) String() string {
	if v.Goto == "" {
		return "drop"
	}
	return "goto " + v.Goto
}

// mapElement is one element of one of the table's verdict maps, or of a
// shard's set for a plain service port (Verdict.Shard; set).
type mapElement struct {
	// Map is the map's name (mapServices or mapNoEndpoints).
	Map     string
	Family  ipFamily
	Key     mapKey
	Verdict verdict
	// Service is the service the element belongs to (for logs, and the
	// element's comment), Field the field of the service it comes from
	// (for problems).
	Service model.ServiceKey
	Field   string
}

// ID returns the element's identity in the table: its map and key. A
// plain service port's element (Verdict.Shard) has the services map's
// identity, although the kernel holds it in its shard's set: the key is
// owned by one service port, whichever of the two holds it.
func (e mapElement) ID() string { return e.Map + " " + e.Key.String() }

// set returns the name of the kernel set or map holding the element: its
// shard's set (shardSetName) for a plain service port, else Map.
func (e mapElement) set() string {
	if e.Verdict.Shard > 0 {
		return shardSetName(e.Family, e.Verdict.Shard)
	}
	return e.Map
}

// inServicesMap reports whether the element is one of the kernel's
// services map of its family (not a shard set's).
func (e mapElement) inServicesMap() bool {
	return e.Map == mapServices(e.Family) && e.Verdict.Shard == 0
}

// Comment returns the comment of the element in the kernel: the service
// it belongs to ("default/web"), which its key and verdict do not always
// say (a reject or drop element).
func (e mapElement) Comment() string {
	if e.Service == (model.ServiceKey{}) {
		return ""
	}
	return comment(e.Service.String())
}

// text returns the element in nft syntax, as nft lists it:
// `10.96.0.10 . tcp . 80 comment "default/web" : goto svc4-…`, without
// the verdict in a shard's set (`10.96.0.10 . tcp . 80 comment
// "default/web"`).
func (e mapElement) text() string {
	if e.Verdict.Shard > 0 {
		return fmt.Sprintf("%s comment %q", e.Key, e.Comment())
	}
	if e.Comment() == "" {
		return fmt.Sprintf("%s : %s", e.Key, e.Verdict)
	}
	return fmt.Sprintf("%s comment %q : %s", e.Key, e.Comment(), e.Verdict)
}

// regularChain is a regular (non-base) chain of its family's table,
// owned by one service (or a shard's chain).
type regularChain struct {
	Name    string
	Family  ipFamily
	Service model.ServiceKey
	Rules   []rule
}

// equalChains reports whether two chains have the same name, family and
// rules.
func equalChains(a, b *regularChain) bool {
	return a.Name == b.Name && a.Family == b.Family && slices.EqualFunc(a.Rules, b.Rules, func(x, y rule) bool { return x.String() == y.String() })
}

// rule is one rule of a service, endpoint or firewall chain (balanceRule,
// dnatRule, dnatMapRule, markRule, sourceRule, allowRule, dropRule,
// affinityCheckRule, affinityUpdateRule).
type rule interface {
	// String returns the rule in nft syntax, as `nft list` prints the
	// rule its netlink expressions program (netlinkRule, on Linux;
	// TestKernelListingMatchesText checks it).
	String() string
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
// "meta l4proto tcp dnat to 10.1.2.3:8080" (nft names no family for an
// address in a table of one family; it does for a map's, "dnat ip to …
// map": dnatMapRule).
type dnatRule struct {
	Proto model.Protocol
	To    netip.AddrPort
}

// String implements rule.
func (r dnatRule) String() string {
	return fmt.Sprintf("meta l4proto %s dnat to %s", protoName(r.Proto), r.To)
}

// ruleset is the desired content of the tables (one per family: tables):
// their regular chains, named
// sets and map elements (the base chains, the lookup chains, the reject and
// masquerade chains and the maps themselves are fixed: see Text), sorted by
// name and by map and key.
type ruleset struct {
	Table    string
	Options  Options
	Chains   []*regularChain
	Sets     []*namedSet
	Elements []mapElement
	// Blocks are the endpoint blocks, sorted by family and slot: the
	// elements of the endpoint maps (named in Sets) are theirs
	// (endpoints).
	Blocks []*block
	// Hairpin are the endpoint addresses of the hairpin sets.
	Hairpin []netip.Addr
	// ClusterIPs are the addresses of the cluster-ips sets: every
	// cluster IP of the services held.
	ClusterIPs []netip.Addr
	// ServiceCIDRs are the ranges of cluster-ips-check's drop rules (the
	// cluster's service CIDRs, for the default proxier).
	ServiceCIDRs []addrRange
}

// endpoints returns the elements of the endpoint maps, sorted. A full sync
// does not list them (txn.blockElements): at 10,000 services, 100,000
// intervals.
func (rs *ruleset) endpoints() []endpointElement {
	n := 0
	for _, bl := range rs.Blocks {
		n += len(bl.Endpoints)
	}
	els := make([]endpointElement, 0, n)
	for _, bl := range rs.Blocks {
		els = bl.appendElements(els)
	}
	slices.SortFunc(els, compareEndpointElements)
	return els
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

// blockRange is the range of the random number that chooses an endpoint
// of a block: the block's rule draws in [0, blockRange), and each endpoint
// of the block owns an interval of it in proportion (1 / N, give or take
// one number in 10^7: uniform for any N). The range being fixed, the rule
// that draws never changes with the endpoints: only map elements do. A
// power of ten, so that the keys of a listing read as the blocks they
// belong to: block 3 of a map is 30000000-39999999.
const blockRange = 10_000_000

// blocksPerMap is the number of blocks that share one endpoint map. The
// kernel walks the rules bound to a map for every element added to it
// (more blocks a map: longer walks), and the table's list of sets, by
// name, for every rule naming one (fewer blocks a map: more maps, longer
// walks). BenchmarkColdStart at 50,000 services: 16 blocks a map (3,125
// maps a family) 10.6 s, 32 9.3 s, 64 8.7 s, 128 8.7–9.3 s; at 1,000 and
// 10,000 the same within the noise. blocksPerMap·blockRange must fit in
// 32 bits (the key of an endpoint map).
const blocksPerMap = 64

// blockOffset is the first key of the block of slot in its endpoint map:
// the rule of the block draws numgen random mod blockRange offset
// blockOffset(slot), one 32-bit number that is the whole key.
func blockOffset(slot uint32) uint32 { return slot % blocksPerMap * blockRange }

// maxCommentLen is the longest comment nft reads back (its
// NFTNL_UDATA_COMMENT_MAXLEN): a listing with a longer one fails to load.
const maxCommentLen = 128

// comment returns s as a comment nft lists and reads back: a listing
// writes it between double quotes, unescaped, and the kernel keeps it
// up to its first NUL, so a quote, backslash, NUL, newline or other
// control character (from a name a state file or another controller
// gave, which Kubernetes does not check) becomes "_", as do bytes that
// are not UTF-8; then it is cut to at most maxCommentLen bytes, on a
// character boundary.
func comment(s string) string {
	s = strings.Map(func(r rune) rune {
		if r == '"' || r == '\\' || r == utf8.RuneError || !unicode.IsPrint(r) {
			return '_'
		}
		return r
	}, s)
	if len(s) <= maxCommentLen {
		return s
	}
	cut := maxCommentLen
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// block is the set of endpoints one service chain DNATs to (without
// session affinity): a block of an endpoint map, keyed by a random number
// in the block's range. The chain's dnatMapRule draws the number;
// changing the endpoints changes only the block's elements.
type block struct {
	// ID identifies the block: its chain's kind and family and its
	// service port ("svc4/default/web/tcp/80").
	ID      string
	Family  ipFamily
	Service model.ServiceKey
	// Endpoints are the addresses and ports to DNAT to, in order.
	Endpoints []netip.AddrPort
	// Slot is the block's place, set by the tracker: its number among
	// the family's blocks (from shardSlotBase for a shard block).
	Slot uint32
	// Shard is, for a block of the shard maps (a plain service port,
	// shards.go), its key there: cluster IP, protocol and port. Its
	// Addr is not valid for a block of the endpoint maps.
	Shard mapKey
	// ShardIdx is the shard of a block of the shard maps: the number of
	// its endpoints.
	ShardIdx uint32
}

// sharded reports whether the block is in a shard map.
func (bl *block) sharded() bool { return bl.Shard.Addr.IsValid() }

// Map returns the name of the endpoint or shard map holding the block.
func (bl *block) Map() string {
	if bl.sharded() {
		return shardMapName(bl.Family, bl.ShardIdx)
	}
	return endpointMapName(bl.Family, bl.Slot/blocksPerMap)
}

// compareBlocks orders blocks by family, then those of the endpoint maps
// by slot (so by map), then those of the shard maps by shard and slot: the
// blocks of a map are together.
func compareBlocks(a, b *block) int {
	if c := cmp.Compare(a.Family, b.Family); c != 0 {
		return c
	}
	if a.sharded() != b.sharded() {
		if a.sharded() {
			return 1
		}
		return -1
	}
	if a.sharded() {
		if c := cmp.Compare(a.ShardIdx, b.ShardIdx); c != 0 {
			return c
		}
	}
	return cmp.Compare(a.Slot, b.Slot)
}

// Comment returns the comment of the block's elements in the kernel, what
// an operator reads in a listing: its chain's kind and family, and its
// service port, as in the chain's name ("svc4 default/web/tcp/80").
func (bl *block) Comment() string { return comment(strings.Replace(bl.ID, "/", " ", 1)) }

// equalBlocks reports whether two blocks are the same.
func equalBlocks(a, b *block) bool {
	return a.ID == b.ID && a.Family == b.Family && a.Service == b.Service && a.Slot == b.Slot && a.Shard == b.Shard && a.ShardIdx == b.ShardIdx && slices.Equal(a.Endpoints, b.Endpoints)
}

// appendElements appends to els the intervals of the block in its endpoint
// map (element).
func (bl *block) appendElements(els []endpointElement) []endpointElement {
	owner := ownerOf(bl.ID)
	for i := range bl.Endpoints {
		els = append(els, bl.element(i, owner))
	}
	return els
}

// element returns the interval of the i-th endpoint of the block, whose
// owner (ownerOf its ID) is given: the i-th endpoint of N owns
// [i·R/N, (i+1)·R/N) of the draw, R being blockRange (N in a shard map:
// the draw i alone).
func (bl *block) element(i int, owner uint64) endpointElement {
	n, r := uint64(len(bl.Endpoints)), uint64(blockRange)
	if bl.sharded() {
		r = n
	}
	return endpointElement{
		Family:   bl.Family,
		Slot:     bl.Slot,
		From:     uint32(uint64(i) * r / n),
		To:       uint32(uint64(i+1) * r / n),
		Target:   bl.Endpoints[i],
		Owner:    owner,
		Shard:    bl.Shard,
		ShardIdx: uint16(bl.ShardIdx),
	}
}

// ownerOf returns the 64-bit FNV-1a hash of a block's ID: what an
// endpoint element holds of the block it belongs to, so that the element
// of another block that takes the same slot with the same endpoint is
// another element (its comment names the new block), without a string.
func ownerOf(id string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(id); i++ {
		h ^= uint64(id[i])
		h *= 1099511628211
	}
	return h
}

// endpointElement is one interval of an endpoint map: the keys
// [From, To) of the block of Slot (offset by blockOffset) lead to Target.
// It holds no string, so that the hundreds of thousands of a large table
// cost the garbage collector little: its comment is its block's.
type endpointElement struct {
	Family ipFamily
	// ShardIdx is the block's shard, in a shard map (maxShardEndpoints
	// fit).
	ShardIdx uint16
	Slot     uint32
	From, To uint32
	Target   netip.AddrPort
	// Owner is ownerOf the block's ID.
	Owner uint64
	// Shard is the block's key in a shard map (Addr not valid in an
	// endpoint map).
	Shard mapKey
}

// Map returns the name of the endpoint or shard map holding the element.
func (e endpointElement) Map() string {
	if e.Shard.Addr.IsValid() {
		return shardMapName(e.Family, uint32(e.ShardIdx))
	}
	return endpointMapName(e.Family, e.Slot/blocksPerMap)
}

// ID returns the element's identity, which orders elements by family,
// slot and first key: the family in the top bit, the slot in the next 31
// (slots are handed out lowest first: a table never has 2^31 blocks), the
// first key in the low 32.
func (e endpointElement) ID() uint64 {
	return uint64(e.Family)<<63 | uint64(e.Slot&(1<<31-1))<<32 | uint64(e.From)
}

// keys returns the first and the last key of the element in its map.
func (e endpointElement) keys() (first, last uint32) {
	if e.Shard.Addr.IsValid() {
		return e.From, e.To - 1
	}
	off := blockOffset(e.Slot)
	return off + e.From, off + e.To - 1
}

// text returns the element in nft syntax, as nft lists it, with the
// comment of its block: slot 67's interval [0, 5000000) is
// `30000000-34999999 comment "svc4 default/web/tcp/80" : 10.1.0.2 . 8080`
// (slot 67 is block 3 of map 1; an interval of one number is that number
// alone); in a shard map, the key is the service port's and the draw:
// `10.96.0.17 . tcp . 80 . 0 comment "svc4 default/web/tcp/80" : …`.
func (e endpointElement) text(comment string) string {
	first, last := e.keys()
	key := fmt.Sprintf("%d-%d", first, last)
	if first == last {
		key = fmt.Sprint(first)
	}
	if e.Shard.Addr.IsValid() {
		key = e.Shard.String() + " . " + key
	}
	return fmt.Sprintf("%s comment %q : %s . %d", key, comment, e.Target.Addr(), e.Target.Port())
}

// compareEndpointElements orders elements by family, slot and first key
// (so by map too).
func compareEndpointElements(a, b endpointElement) int { return cmp.Compare(a.ID(), b.ID()) }

// dnatMapRule DNATs to an endpoint of a block drawn at random:
// "meta l4proto tcp dnat ip to numgen random mod 10000000 offset
// 30000000 map @endpoints-v4-1", where the offset is the first key of the
// block (slot 67, block 3 of map 1).
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
	return fmt.Sprintf("meta l4proto %s dnat %s to %s map @%s", protoName(r.Proto), r.Family.info().nft, numgenText(blockRange, blockOffset(r.Slot)), r.Map)
}

// numgenText writes "numgen random mod N [offset O]" as nft does (no
// offset when it is 0).
func numgenText(mod, offset uint32) string {
	if offset == 0 {
		return fmt.Sprintf("numgen random mod %d", mod)
	}
	return fmt.Sprintf("numgen random mod %d offset %d", mod, offset)
}

// blockComments are the comments of blocks by family and slot.
type blockComments map[blockPlace]string

// blockPlace is the family and slot of a block.
type blockPlace struct {
	family ipFamily
	slot   uint32
}

// commentsOf returns the comments of the blocks in lists.
func commentsOf(lists ...[]*block) blockComments {
	n := 0
	for _, l := range lists {
		n += len(l)
	}
	c := make(blockComments, n)
	for _, l := range lists {
		for _, bl := range l {
			c[blockPlace{bl.Family, bl.Slot}] = bl.Comment()
		}
	}
	return c
}

// of returns the comment of the block of e ("" if comments has none).
func (c blockComments) of(e endpointElement) string { return c[blockPlace{e.Family, e.Slot}] }
