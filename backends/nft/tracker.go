package nft

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"sigs.k8s.io/kpng/diffstore"
	"sigs.k8s.io/kpng/model"
)

// tracker holds the desired objects of every service and computes, round
// after round, the minimal change to the table: the chains and map
// elements created, updated and deleted. It is pure Go (no netlink); the
// applier turns its output into a transaction. A tracker is not safe for
// concurrent use.
type tracker struct {
	opts     Options
	services map[model.ServiceKey]serviceObjects
	chains   *diffstore.Store[string, *regularChain]
	sets     *diffstore.Store[string, *namedSet]
	elements *diffstore.Store[string, mapElement]
	// owner is the service owning each element key (address . protocol
	// . port, whatever the map): when two services claim the same key, the
	// first in key order has it, whatever the order they came in (as a
	// fresh start decides); values are the services' current states, for
	// the one that must give a key up.
	owner  map[string]model.ServiceKey
	values map[model.ServiceKey]*model.ServiceEndpoints
	// losers are the services that lost a key to another one, with their
	// state; released says that a key was let go in the round, so Done
	// gives the losers another chance.
	losers   map[model.ServiceKey]*model.ServiceEndpoints
	released bool
	// problems are the problems of each service as of its last Update
	// (with those of the addresses another service took from it since).
	problems map[model.ServiceKey][]model.Problem

	// blocks are the endpoint blocks by ID, placed by slot (the elements
	// of the endpoint maps are theirs: endpointChanges): slotOf the slot
	// of each block, free the slots of each family, mapBlocks the number
	// of blocks in each endpoint map (a map exists while it holds one).
	blocks    *diffstore.Store[string, *block]
	slotOf    map[string]uint32
	free      [2]slots
	mapBlocks map[string]int
	// shardAt is where each shard block placed is (its key and shard),
	// shardSlots the slots of each family's shard blocks (from
	// shardSlotBase), shardBlocks the number of blocks of each shard (a
	// shard's map and chain exist while it holds one).
	shardAt     map[string]shardPlace
	shardSlots  [2]slots
	shardBlocks [2][maxShardEndpoints + 1]int32
	// hairpin holds the endpoint addresses of the hairpin sets, and
	// clusterIPs the cluster IPs of the cluster-ips sets, each while some
	// service uses it.
	hairpin    sharedAddrs
	clusterIPs sharedAddrs
	// cidrs are the service CIDR ranges as of the last Done;
	// stagedCIDRs those of the round in progress (when cidrsStaged).
	cidrs, stagedCIDRs []addrRange
	cidrsStaged        bool
}

// newTracker returns an empty tracker building rules with opts.
func newTracker(opts Options) *tracker {
	return &tracker{
		opts:     opts,
		services: map[model.ServiceKey]serviceObjects{},
		chains:   diffstore.New[string](equalChains),
		sets:     diffstore.New[string](equalSets),
		elements: diffstore.NewComparable[string, mapElement](),
		owner:    map[string]model.ServiceKey{},
		values:   map[model.ServiceKey]*model.ServiceEndpoints{},
		losers:   map[model.ServiceKey]*model.ServiceEndpoints{},
		problems: map[model.ServiceKey][]model.Problem{},

		blocks:     diffstore.New[string](equalBlocks),
		slotOf:     map[string]uint32{},
		mapBlocks:  map[string]int{},
		shardAt:    map[string]shardPlace{},
		hairpin:    newSharedAddrs(),
		clusterIPs: newSharedAddrs(),
	}
}

// delta is the change of one round. Sets are never updated: a set's name
// says all of its content, and an endpoint map's elements are in
// Endpoints.
type delta struct {
	Chains   diffstore.Changes[string, *regularChain]
	Sets     diffstore.Changes[string, *namedSet]
	Elements diffstore.Changes[string, mapElement]
	// Endpoints are the endpoint maps' element changes (none when the
	// round is written whole: tracker.done).
	Endpoints diffstore.Changes[uint64, endpointElement]
	Hairpin   addrChanges
	// ClusterIPs are the addresses added to and deleted from the
	// cluster-ips sets.
	ClusterIPs addrChanges
	// ServiceCIDRs are the service CIDR ranges added and deleted (the
	// rules of cluster-ips-check).
	ServiceCIDRs rangeChanges
	// Blocks are the endpoint blocks changed (their elements are in
	// Endpoints): what the conntrack cleanup compares.
	Blocks diffstore.Changes[string, *block]
}

// addrChanges are the addresses added to and deleted from the hairpin
// or cluster-ips sets in a round, sorted.
type addrChanges struct {
	Created, Deleted []netip.Addr
}

// Len returns the number of addresses changed.
func (c addrChanges) Len() int { return len(c.Created) + len(c.Deleted) }

// Len returns the number of objects changed in the table.
func (d delta) Len() int {
	return d.Chains.Len() + d.Sets.Len() + d.Elements.Len() + d.Endpoints.Len() + d.Hairpin.Len() + d.ClusterIPs.Len() + d.ServiceCIDRs.Len()
}

// Services returns the services the change concerns, sorted (for logs).
func (d delta) Services() []model.ServiceKey {
	var keys []model.ServiceKey
	for _, items := range [][]diffstore.Item[string, *regularChain]{d.Chains.Created, d.Chains.Updated, d.Chains.Deleted} {
		for _, it := range items {
			c := it.Value
			if c == nil {
				c = it.Prev
			}
			if c != nil {
				keys = append(keys, c.Service)
			}
		}
	}
	for _, items := range [][]diffstore.Item[string, mapElement]{d.Elements.Created, d.Elements.Updated, d.Elements.Deleted} {
		for _, it := range items {
			keys = append(keys, it.Value.Service, it.Prev.Service)
		}
	}
	for _, items := range [][]diffstore.Item[string, *block]{d.Blocks.Created, d.Blocks.Updated, d.Blocks.Deleted} {
		for _, it := range items {
			for _, bl := range []*block{it.Value, it.Prev} {
				if bl != nil {
					keys = append(keys, bl.Service)
				}
			}
		}
	}
	slices.SortFunc(keys, model.ServiceKey.Compare)
	keys = slices.Compact(keys)
	if len(keys) > 0 && keys[0] == (model.ServiceKey{}) {
		keys = keys[1:]
	}
	return keys
}

// Update sets the state of the service key to se (nil: the service is
// gone) for the current round, and returns the problems that kept parts of
// it out of the table. Call Done to end the round.
func (t *tracker) Update(key model.ServiceKey, se *model.ServiceEndpoints) []error {
	var objs serviceObjects
	var problems []error
	if se != nil && se.Service != nil {
		objs, problems = buildService(se, t.opts)
	}
	old := t.services[key]

	t.hairpin.count(old.Hairpin, objs.Hairpin)
	t.clusterIPs.count(old.ClusterIPs, objs.ClusterIPs)

	newElems, newKeys := map[string]bool{}, map[string]bool{}
	kept := objs.Elements[:0:0]
	delete(t.losers, key)
	for _, e := range objs.Elements {
		id, k := e.ID(), e.Key.String()
		if o, ok := t.owner[k]; ok && o != key {
			if o.Compare(key) < 0 {
				problems = append(problems, model.NewProblem(key, e.Field, model.ReasonAddressConflict,
					"service %s: %s %s is already used by service %s: ignored", key, strings.ToLower(e.Family.String()), e.Key, o))
				t.losers[key] = se
				continue
			}
			field := e.Field
			for _, oe := range t.services[o].Elements {
				if oe.Key.String() == k {
					field = oe.Field
					break
				}
			}
			t.yield(o, k)
			p := model.NewProblem(o, field, model.ReasonAddressConflict,
				"service %s: %s %s is taken by service %s, first in order: ignored", o, strings.ToLower(e.Family.String()), e.Key, key)
			problems = append(problems, p)
			t.problems[o] = append(t.problems[o], *p)
		}
		if newElems[id] {
			continue
		}
		newElems[id], newKeys[k] = true, true
		t.owner[k] = key
		t.elements.Set(id, e)
		kept = append(kept, e)
	}
	for _, e := range old.Elements {
		if id := e.ID(); !newElems[id] {
			t.elements.Delete(id)
			if k := e.Key.String(); !newKeys[k] && t.owner[k] == key {
				delete(t.owner, k)
				t.released = true
			}
		}
	}
	objs.Elements = kept
	// A shard block whose key the service lost (its element in the
	// services map) is left out with it: its elements would be the
	// other service's keys.
	objs.Blocks = slices.DeleteFunc(objs.Blocks, func(bl *block) bool { return bl.sharded() && !newKeys[bl.Shard.String()] })
	// The blocks placed before the chains are stored: their dnatMapRules
	// name their slots (a chain stored first compares unequal to itself).
	t.placeBlocks(&objs, old)
	replaceNamed(t.sets, old.Sets, objs.Sets, func(s *namedSet) string { return s.Name })
	replaceNamed(t.chains, old.Chains, objs.Chains, func(c *regularChain) string { return c.Name })

	var own []model.Problem
	for _, err := range problems {
		if p := model.ProblemOf(key, err); p.Service == key {
			own = append(own, p)
		}
	}
	if len(own) > 0 {
		t.problems[key] = own
	} else {
		delete(t.problems, key)
	}
	if se == nil || se.Service == nil {
		delete(t.services, key)
		delete(t.losers, key)
		delete(t.values, key)
	} else {
		t.services[key] = objs
		t.values[key] = se
	}
	return problems
}

// SetCluster sets the cluster-level facts for the current round: the
// ranges of the service CIDRs, whose addresses no service holds are
// dropped (nil: none). It returns the problems that kept a CIDR out.
func (t *tracker) SetCluster(c *model.Cluster) []error {
	var problems []error
	var prefixes []netip.Prefix
	if c != nil {
		var bad []netip.Prefix
		prefixes, bad = model.CanonicalCIDRs(c.ServiceCIDRs)
		for _, b := range bad {
			problems = append(problems, fmt.Errorf("cluster: service CIDR %s: not a usable CIDR: ignored", b))
		}
	}
	t.stagedCIDRs, t.cidrsStaged = mergedRanges(prefixes), true
	return problems
}

// cidrsDone ends a round of the service CIDRs: the ranges deleted and
// added, and all of them when any changed.
func (t *tracker) cidrsDone() rangeChanges {
	var ch rangeChanges
	if !t.cidrsStaged {
		return ch
	}
	old, cur := t.cidrs, t.stagedCIDRs
	t.cidrs, t.stagedCIDRs, t.cidrsStaged = cur, nil, false
	for _, r := range old {
		if !slices.Contains(cur, r) {
			ch.Deleted = append(ch.Deleted, r)
		}
	}
	for _, r := range cur {
		if !slices.Contains(old, r) {
			ch.Created = append(ch.Created, r)
		}
	}
	if ch.Len() > 0 {
		ch.Now = slices.Clone(cur)
	}
	return ch
}

// yield takes the element key k from service o, which had it, for a
// service before it in key order: o's elements of k are deleted, and o
// waits among the losers for k to be let go.
func (t *tracker) yield(o model.ServiceKey, k string) {
	objs := t.services[o]
	kept := objs.Elements[:0:0]
	for _, e := range objs.Elements {
		if e.Key.String() == k {
			t.elements.Delete(e.ID())
			continue
		}
		kept = append(kept, e)
	}
	objs.Elements = kept
	blocks := objs.Blocks[:0:0]
	for _, bl := range objs.Blocks {
		if bl.sharded() && bl.Shard.String() == k {
			t.blocks.Delete(bl.ID)
			t.release(bl.ID, bl.Family)
			continue
		}
		blocks = append(blocks, bl)
	}
	objs.Blocks = blocks
	t.services[o] = objs
	delete(t.owner, k)
	t.losers[o] = t.values[o]
}

// placeBlocks gives the blocks of objs their slots (those they had in old,
// or new ones), fills the dnatMapRules of objs' chains with them, sets the
// blocks and their elements in the stores, and releases the slots of the
// blocks of old that objs lacks (adding and deleting endpoint maps and
// shards as they get their first block or lose their last).
func (t *tracker) placeBlocks(objs *serviceObjects, old serviceObjects) {
	byID := make(map[string]*block, len(objs.Blocks))
	blocks := objs.Blocks[:0:0]
	for _, bl := range objs.Blocks {
		if byID[bl.ID] != nil {
			continue // one block per ID (buildService gives no repeats)
		}
		blocks = append(blocks, bl)
		bl.Slot = t.place(bl)
		byID[bl.ID] = bl
	}
	for _, c := range objs.Chains {
		for i, r := range c.Rules {
			if dr, ok := r.(dnatMapRule); ok {
				if bl := byID[dr.Block]; bl != nil {
					dr.Slot, dr.Map = bl.Slot, bl.Map()
					c.Rules[i] = dr
				}
			}
		}
	}
	objs.Blocks = blocks
	for _, bl := range old.Blocks {
		if byID[bl.ID] == nil {
			t.release(bl.ID, bl.Family)
		}
	}
	replaceNamed(t.blocks, old.Blocks, objs.Blocks, func(bl *block) string { return bl.ID })
}

// shardPlace is where a block of the shard maps is: its key there and
// its shard.
type shardPlace struct {
	Key   mapKey
	Shard uint32
}

// place returns the slot of bl: the one its ID has, if it is in the same
// map kind and shard (a block of the shard maps whose number of endpoints
// changed moves to another shard), or a new one (counting the block in
// its endpoint map or shard).
func (t *tracker) place(bl *block) uint32 {
	var at shardPlace
	if bl.sharded() {
		bl.ShardIdx = uint32(len(bl.Endpoints))
		at = shardPlace{Key: bl.Shard, Shard: bl.ShardIdx}
	}
	slot, ok := t.slotOf[bl.ID]
	if ok && t.shardAt[bl.ID] == at {
		return slot
	}
	if ok {
		t.release(bl.ID, bl.Family)
	}
	if bl.sharded() {
		slot = shardSlotBase + t.shardSlots[bl.Family].get()
		t.shardAt[bl.ID] = at
		t.useShard(bl.Family, bl.ShardIdx, 1)
	} else {
		slot = t.free[bl.Family].get()
		t.useMap(bl.Family, slot, 1)
	}
	t.slotOf[bl.ID] = slot
	return slot
}

// release lets the slot of the block id (of family f) go, if it has one.
func (t *tracker) release(id string, f ipFamily) {
	slot, ok := t.slotOf[id]
	if !ok {
		return
	}
	delete(t.slotOf, id)
	if at, sharded := t.shardAt[id]; sharded {
		delete(t.shardAt, id)
		t.shardSlots[f].put(slot - shardSlotBase)
		t.useShard(f, at.Shard, -1)
		return
	}
	t.free[f].put(slot)
	t.useMap(f, slot, -1)
}

// useMap counts one block more (delta 1) or less (-1) in the endpoint map
// of slot, adding or deleting the map when it gets its first block or
// loses its last.
func (t *tracker) useMap(f ipFamily, slot uint32, delta int) {
	name := endpointMapName(f, slot/blocksPerMap)
	t.mapBlocks[name] += delta
	switch n := t.mapBlocks[name]; {
	case n == 1 && delta > 0:
		t.sets.Set(name, &namedSet{Name: name, Family: f, EndpointMap: true})
	case n == 0:
		delete(t.mapBlocks, name)
		t.sets.Delete(name)
	}
}

// useShard counts one block more (delta 1) or less (-1) in shard n of
// family f, adding its map, set and chain when it gets its first block
// and deleting them when it loses its last.
func (t *tracker) useShard(f ipFamily, n uint32, delta int) {
	t.shardBlocks[f][n] += int32(delta)
	switch c := t.shardBlocks[f][n]; {
	case c == 1 && delta > 0:
		name := shardMapName(f, n)
		t.sets.Set(name, &namedSet{Name: name, Family: f, Shard: n})
		name = shardSetName(f, n)
		t.sets.Set(name, &namedSet{Name: name, Family: f, ShardSet: n})
		ch := shardChain(f, n, t.opts)
		t.chains.Set(ch.Name, ch)
	case c == 0:
		t.sets.Delete(shardMapName(f, n))
		t.sets.Delete(shardSetName(f, n))
		t.chains.Delete(shardChainName(f, n))
	}
}

// sharedAddrs are the addresses of a kernel set that several services
// may need (the hairpin sets' endpoints, the cluster-ips sets' cluster
// IPs): each is in the set while some service needs it.
type sharedAddrs struct {
	// refs holds, for each address that a service needs or that is in
	// the set, the services needing it and whether it is in the set as
	// of the last done (one map: at 50,000 services × 10 endpoints, a
	// map of 500,000 addresses is tens of MiB); touched are the
	// addresses whose count went to or from 0 since (some more than
	// once).
	refs    map[netip.Addr]addrRefs
	touched []netip.Addr
}

// addrRefs is what sharedAddrs knows of one address.
type addrRefs struct {
	services int32
	in       bool
}

func newSharedAddrs() sharedAddrs {
	return sharedAddrs{refs: map[netip.Addr]addrRefs{}}
}

// count counts the addresses of one service: those of now, not those of
// old (each list without repeats).
func (s *sharedAddrs) count(old, now []netip.Addr) {
	for _, a := range now {
		r := s.refs[a]
		if r.services++; r.services == 1 {
			s.touched = append(s.touched, a)
		}
		s.refs[a] = r
	}
	for _, a := range old {
		r := s.refs[a]
		if r.services--; r.services == 0 {
			s.touched = append(s.touched, a)
		}
		s.refs[a] = r
	}
}

// done ends a round: the addresses whose count went to or from 0, and
// are (or are no longer) in the set.
func (s *sharedAddrs) done() addrChanges {
	var ch addrChanges
	for _, a := range s.touched {
		r, ok := s.refs[a]
		switch now := r.services > 0; {
		case !ok:
			// Already gone: listed twice.
		case now && !r.in:
			r.in = true
			s.refs[a] = r
			ch.Created = append(ch.Created, a)
		case !now && r.in:
			delete(s.refs, a)
			ch.Deleted = append(ch.Deleted, a)
		case !now:
			delete(s.refs, a)
		}
	}
	// A first round touches every address: let its list go.
	if cap(s.touched) > 1024 {
		s.touched = nil
	} else {
		s.touched = s.touched[:0]
	}
	slices.SortFunc(ch.Created, netip.Addr.Compare)
	slices.SortFunc(ch.Deleted, netip.Addr.Compare)
	return ch
}

// sorted returns the addresses in the set as of the last done, sorted.
func (s *sharedAddrs) sorted() []netip.Addr {
	out := make([]netip.Addr, 0, len(s.refs))
	for a, r := range s.refs {
		if r.in {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// replaceNamed sets the objects of one service in store: every one of
// current, and the deletion of those of old that current lacks.
func replaceNamed[K cmp.Ordered, V any](store *diffstore.Store[K, V], old, current []V, name func(V) K) {
	keep := make(map[K]bool, len(current))
	for _, v := range current {
		keep[name(v)] = true
		store.Set(name(v), v)
	}
	for _, v := range old {
		if !keep[name(v)] {
			store.Delete(name(v))
		}
	}
}

// retryLosers updates again, once keys have been let go in the round, the
// services that lost a key to another service (in key order): the key's
// owner may be gone. Their problems were reported when they lost.
func (t *tracker) retryLosers() {
	if !t.released {
		return
	}
	t.released = false
	keys := slices.SortedFunc(maps.Keys(t.losers), model.ServiceKey.Compare)
	for _, k := range keys {
		t.Update(k, t.losers[k])
	}
}

// Problems returns the problems of the services held, in key order.
func (t *tracker) Problems() []model.Problem {
	var out []model.Problem
	for _, k := range slices.SortedFunc(maps.Keys(t.problems), model.ServiceKey.Compare) {
		out = append(out, t.problems[k]...)
	}
	return out
}

// ServiceKeys returns the services held as of the last Done, sorted.
func (t *tracker) ServiceKeys() []model.ServiceKey {
	keys := make([]model.ServiceKey, 0, len(t.services))
	for k := range t.services {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, model.ServiceKey.Compare)
	return keys
}

// ChainNames returns the names of the regular chains as of the last
// Done, sorted.
func (t *tracker) ChainNames() []string {
	names := make([]string, 0, t.chains.Len())
	t.chains.Each(func(name string, _ *regularChain) { names = append(names, name) })
	return names
}

// RuleCount returns the place (family and name) and the number of rules
// of the regular chain name, and whether there is one.
func (t *tracker) RuleCount(name string) (chainKey, int, bool) {
	c, ok := t.chains.Get(name)
	if !ok {
		return chainKey{}, 0, false
	}
	return chainKey{c.Family, c.Name}, len(c.Rules), true
}

// Done ends a round and returns what changed since the previous one. A
// service that lost an address to another one gets it in the same round
// when the other lets it go.
func (t *tracker) Done() delta { return t.done(true) }

// done is Done; endpoints says whether the endpoint maps' element changes
// (delta.Endpoints) are derived from the block changes: a partial sync
// sends them, a full one writes every element from Ruleset, and at 10,000
// services × 10 endpoints deriving them in a full sync allocated a
// seventh of what the cold start did (about 64 MB; BenchmarkColdStart).
func (t *tracker) done(endpoints bool) delta {
	t.retryLosers()
	blocks := t.blocks.DonePartial()
	var els diffstore.Changes[uint64, endpointElement]
	if endpoints {
		els = endpointChanges(blocks)
	}
	return delta{
		Chains:       t.chains.DonePartial(),
		Sets:         t.sets.DonePartial(),
		Elements:     t.elements.DonePartial(),
		Endpoints:    els,
		Hairpin:      t.hairpin.done(),
		ClusterIPs:   t.clusterIPs.done(),
		Blocks:       blocks,
		ServiceCIDRs: t.cidrsDone(),
	}
}

// endpointChanges returns the changes of the endpoint maps' elements that
// the block changes ch make, as a store of the elements would report them:
// the elements of the blocks deleted or updated go, those of the blocks
// created or updated come, and an element whose key both goes and comes
// is updated, or left alone when it is equal. The elements of a block
// follow from it (its slot and endpoints), so the tracker keeps only the
// blocks: a store of the elements took a third of its memory (500,000
// elements at 50,000 services × 10 endpoints, about 100 MiB).
func endpointChanges(ch diffstore.Changes[string, *block]) diffstore.Changes[uint64, endpointElement] {
	var out diffstore.Changes[uint64, endpointElement]
	var gone map[uint64]endpointElement
	for _, items := range [][]diffstore.Item[string, *block]{ch.Updated, ch.Deleted} {
		for _, it := range items {
			if gone == nil {
				gone = map[uint64]endpointElement{}
			}
			for _, e := range it.Prev.appendElements(nil) {
				gone[e.ID()] = e
			}
		}
	}
	var els []endpointElement
	for _, items := range [][]diffstore.Item[string, *block]{ch.Created, ch.Updated} {
		for _, it := range items {
			els = it.Value.appendElements(els[:0])
			for _, e := range els {
				k := e.ID()
				prev, was := gone[k]
				switch {
				case !was:
					out.Created = append(out.Created, diffstore.Item[uint64, endpointElement]{Key: k, Value: e})
				case prev != e:
					out.Updated = append(out.Updated, diffstore.Item[uint64, endpointElement]{Key: k, Value: e, Prev: prev})
				}
				delete(gone, k)
			}
		}
	}
	for k, e := range gone {
		out.Deleted = append(out.Deleted, diffstore.Item[uint64, endpointElement]{Key: k, Value: e, Prev: e})
	}
	byKey := func(a, b diffstore.Item[uint64, endpointElement]) int { return cmp.Compare(a.Key, b.Key) }
	slices.SortFunc(out.Created, byKey)
	slices.SortFunc(out.Updated, byKey)
	slices.SortFunc(out.Deleted, byKey)
	return out
}

// Ruleset returns the whole desired content of the table as of the last
// Done, sorted.
func (t *tracker) Ruleset(table string) *ruleset {
	rs := &ruleset{Table: table, Options: t.opts}
	t.chains.Each(func(_ string, c *regularChain) { rs.Chains = append(rs.Chains, c) })
	slices.SortFunc(rs.Chains, func(a, b *regularChain) int { return strings.Compare(a.Name, b.Name) })
	t.sets.Each(func(_ string, st *namedSet) { rs.Sets = append(rs.Sets, st) })
	slices.SortFunc(rs.Sets, func(a, b *namedSet) int { return strings.Compare(a.Name, b.Name) })
	t.elements.Each(func(_ string, e mapElement) { rs.Elements = append(rs.Elements, e) })
	sortElements(rs.Elements)
	t.blocks.Each(func(_ string, bl *block) { rs.Blocks = append(rs.Blocks, bl) })
	slices.SortFunc(rs.Blocks, compareBlocks)
	rs.Hairpin = t.hairpin.sorted()
	rs.ClusterIPs = t.clusterIPs.sorted()
	rs.ServiceCIDRs = t.cidrs
	return rs
}

// buildRuleset computes the ruleset of a whole state built with opts (on
// conflicts, the first service in key order has the address), with the
// problems found.
func buildRuleset(table string, opts Options, items []*model.ServiceEndpoints) (*ruleset, []error) {
	return buildRulesetCluster(table, opts, nil, items)
}

// buildRulesetCluster is buildRuleset with the cluster-level facts c.
func buildRulesetCluster(table string, opts Options, c *model.Cluster, items []*model.ServiceEndpoints) (*ruleset, []error) {
	t := newTracker(opts)
	problems := t.SetCluster(c)
	for _, se := range items {
		if se == nil || se.Service == nil {
			continue
		}
		problems = append(problems, t.Update(se.Service.Key(), se)...)
	}
	t.done(false)
	return t.Ruleset(table), problems
}
