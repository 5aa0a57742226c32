//go:build linux

package nft

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/diffstore"
)

// elementsPerMessage bounds the number of elements sent in one netlink
// message, to keep messages well under the socket buffer sizes.
const elementsPerMessage = 1024

// minElementsPerMessage is the fewest elements a full message of elements
// carries (elementBytesPerMessage bytes of the largest elements): what
// transaction sizes are estimated with.
const minElementsPerMessage = 128

// elementBytesPerMessage bounds the encoded size of the elements of one
// message: they travel in one netlink attribute, whose length is 16 bits.
// Longer, the length wraps and the kernel silently sees only part of the
// elements (found by the 1,000-service benchmark: 219 elements of 1,000).
const elementBytesPerMessage = 60000

// elementBytes is an upper bound of the encoded size of a map element
// with a key and data of keyLen bytes going to chain, with comment: its
// nested attributes (list element, key, data, verdict code and chain, at
// most 64 bytes of headers and padding), key, data and chain name, and
// its comment (an attribute of user data holding one TLV and the
// comment's final NUL, at most 10 bytes more than the comment).
func elementBytes(keyLen int, chain, comment string) int {
	n := 64 + keyLen + len(chain)
	if comment != "" {
		n += 10 + len(comment)
	}
	return n
}

// chunkEnd returns the end of the message that carries the elements from
// start on, of n in all, the i-th of size(i) bytes: at most
// elementsPerMessage elements and, past the first, elementBytesPerMessage
// bytes.
func chunkEnd(start, n int, size func(int) int) int {
	bytes, end := 0, start
	for ; end < n && end-start < elementsPerMessage; end++ {
		bytes += size(end)
		if bytes > elementBytesPerMessage && end > start {
			break
		}
	}
	return end
}

// Stats counts the objects one transaction sends: its size.
type Stats struct {
	// Messages is the number of netlink messages in the transaction
	// (without the batch begin/end markers).
	Messages int
	// ChainsAdded, ChainsFlushed and ChainsDeleted count regular chains.
	ChainsAdded, ChainsFlushed, ChainsDeleted int
	// SetsAdded and SetsDeleted count named sets (balance maps, affinity
	// sets).
	SetsAdded, SetsDeleted int
	// Rules counts the rules added.
	Rules int
	// ElementsAdded and ElementsDeleted count the elements of the named
	// maps and sets as the kernel holds them (an interval of an endpoint
	// map is two: its start and its end), but for those of a balance map,
	// which are part of adding it (SetsAdded).
	ElementsAdded, ElementsDeleted int
}

// Objects returns the number of chains, rules and elements touched.
func (s Stats) Objects() int {
	return s.ChainsAdded + s.ChainsFlushed + s.ChainsDeleted + s.SetsAdded + s.SetsDeleted + s.Rules + s.ElementsAdded + s.ElementsDeleted
}

// lastingMessages and lastingElements bound the transactions sent on the
// applier's lasting connection, whose socket buffers are set once: larger
// ones get a connection of their own, with buffers sized for them.
const (
	lastingMessages = 2048
	lastingElements = 8192
)

// applier writes rulesets and deltas into the proxier's two nftables
// tables, one per family (table ip NAME, table ip6 NAME), each call one
// netlink transaction over both. It is not safe for concurrent use.
//
// Small transactions (partial syncs) go through one lasting netlink
// connection: closing a netlink socket that sent nftables messages waits
// for the kernel (4 to 25 ms measured with strace, the process idle
// meanwhile), many times the cost of a one-endpoint change. The connection is dropped after
// any error, so that nothing of a failed transaction stays in it.
//
// Each connection is an nftables.Conn from newConn sending through a relay
// (relay.go), which owns the socket and gives the endpoint and balance
// maps the user data nft reads their types from (typeof.go).
type applier struct {
	newConn func(...nftables.ConnOption) (*nftables.Conn, error)
	lasting *txnConn // reused across transactions; nil until needed
	// reader reads the tables for Check; nil until needed.
	reader *nftables.Conn
	// tables are the tables of the two families, indexed by ipFamily;
	// legacy is the inet table of the same name that kpng wrote before
	// it had one table per family, deleted by the first full write (an
	// upgrade restarts kpng); nil after it.
	tables [2]*nftables.Table
	legacy *nftables.Table
	// fixed are the tables' fixed chains (base, lookup, reject,
	// nodeport-reject/-drop, masquerading, cluster-ips-check and shards
	// chains) with the number of rules the last successful Full gave
	// each, or the last Partial for cluster-ips-check (rewritten when the
	// service CIDRs change) and for the services and shards chains
	// (rewritten when a shard comes or goes): what Check expects of them.
	fixed map[chainKey]int
	// opts are the options of the last successful Full, and shards the
	// shards present as of the last successful transaction: what the
	// services chain's rules are written from when a partial round adds
	// or deletes a shard.
	opts   Options
	shards shards
	// caps are the capacities of the sized sets as the last successful
	// transaction left them (capacity.go); nil until a full write.
	caps capacities
	// fault is given to the relay of each transaction: the tests' seam
	// for socket errors (relay.go); nil otherwise.
	fault faultFunc
	// dialed, if set, is given the port ID of each socket a transaction
	// is sent on, before anything is sent (the sink's monitor tells its
	// own transactions by it).
	dialed func(portID uint32)
	// mute, if set, stops the sink's monitor from receiving nftables'
	// notifications until the function it returns is called with the
	// number of transactions committed meanwhile (nfmonitor's
	// Monitor.Mute): a transaction of muteObjects objects or more is
	// sent muted, the kernel then building no notification of its
	// objects, which for a table written whole costs more than the
	// transaction itself.
	mute        func() (unmute func(commits int))
	muteObjects int
}

// defaultMuteObjects is applier.muteObjects when Config does not set it:
// a notification costs the kernel an allocation, some microseconds, and
// muting (the group left and joined again, four requests for the
// generation) some 90 µs; but another program's change made while muted
// is found only by the check of every chain (nfmonitor's Mute), so that
// only the large transactions are muted.
const defaultMuteObjects = 1000

// txnConn is a connection transactions are written on: the Conn that
// marshals them and the relay that sends them.
type txnConn struct {
	conn  *nftables.Conn
	relay *relay
}

// txn is one transaction being built: its connection, what it sent so
// far, and the named sets it added (for the IDs that its rules refer to).
type txn struct {
	tables [2]*nftables.Table
	conn   *nftables.Conn
	relay  *relay
	stats  Stats
	sets   map[string]*nftables.Set
	// rules counts the rules added to each chain.
	rules map[chainKey]int
	// clusterIPs are the cluster-ips sets when the transaction adds
	// them (a full one), for their IDs.
	clusterIPs [2]*nftables.Set
	// scratch is where the size of each message of set elements is
	// measured.
	scratch []byte
	// caps are the capacities of the sized sets after the transaction:
	// those of the shard sets and maps it adds.
	caps capacities
}

// newApplier returns an applier writing the tables named table (one per
// family), on
// connections from newConn (nil means nftables.New, in the current
// network namespace): the applier reads the namespace of a connection
// (its NetNS) and sends through a socket of its own there, or through the
// connection's TestDial if it has one. Close releases its lasting
// connection. newConn is also the seam of the unprivileged tests: a
// factory adding nftables.WithTestDial sees every message, as the kernel
// would, without a kernel (applier_test.go).
func newApplier(newConn func(...nftables.ConnOption) (*nftables.Conn, error), table string) *applier {
	if newConn == nil {
		newConn = nftables.New
	}
	return &applier{newConn: newConn, tables: familyTables(table), legacy: &nftables.Table{Name: table, Family: nftables.TableFamilyINet}}
}

// familyTables returns the tables named name of the two families, indexed
// by ipFamily.
func familyTables(name string) [2]*nftables.Table {
	var tables [2]*nftables.Table
	for _, f := range []ipFamily{ipv4, ipv6} {
		tables[f] = &nftables.Table{Name: name, Family: f.nl().table}
	}
	return tables
}

// Close closes the lasting connections, if open. The applier may still
// be used: it opens others when needed.
func (a *applier) Close() {
	if a.lasting != nil {
		_ = a.lasting.relay.Close()
		a.lasting = nil
	}
	if a.reader != nil {
		_ = a.reader.CloseLasting()
		a.reader = nil
	}
}

// dial returns a new connection whose socket has buffers for transactions
// of messages messages and elements elements.
func (a *applier) dial(messages, elements int) (*txnConn, error) {
	conn, err := a.newConn()
	if err != nil {
		return nil, fmt.Errorf("nftables connection: %w", err)
	}
	r, err := newRelay(conn, receiveBuffer(receiveBufferFor(messages)), sendBuffer(sendBufferFor(messages, elements)))
	if err != nil {
		return nil, fmt.Errorf("nftables connection: %w", err)
	}
	if a.dialed != nil && r.raw != nil {
		a.dialed(r.pid)
	}
	return &txnConn{conn: conn, relay: r}, nil
}

// begin starts a transaction of about messages messages and elements
// elements: on the lasting connection if it is small enough, else on a
// new connection (a connection buffers its messages until Flush, so a
// transaction abandoned halfway must not leave them behind for the next
// one: end drops the connection on error).
func (a *applier) begin(messages, elements int) (*txn, error) {
	t := &txn{tables: a.tables, sets: map[string]*nftables.Set{}, rules: map[chainKey]int{}}
	var tc *txnConn
	if messages <= lastingMessages && elements <= lastingElements {
		if a.lasting == nil {
			c, err := a.dial(lastingMessages, lastingElements)
			if err != nil {
				return nil, err
			}
			a.lasting = c
		}
		tc = a.lasting
	} else {
		// A connection of its own, its socket buffers sized when it is
		// made for the transaction's estimated size (an upper bound of
		// what it sends).
		c, err := a.dial(messages, elements)
		if err != nil {
			return nil, err
		}
		tc = c
	}
	t.conn, t.relay = tc.conn, tc.relay
	t.relay.begin()
	t.relay.fault = a.fault
	return t, nil
}

// readConn returns the lasting connection that reads the table (Check),
// opened if needed: a plain nftables.Conn, the relay carrying only
// transactions.
func (a *applier) readConn() (*nftables.Conn, error) {
	if a.reader == nil {
		conn, err := a.newConn(nftables.AsLasting())
		if err != nil {
			return nil, fmt.Errorf("nftables connection: %w", err)
		}
		a.reader = conn
	}
	return a.reader, nil
}

// flush sends the transaction t, with the monitor muted if it is large
// (applier.mute).
func (a *applier) flush(t *txn) error {
	if a.mute == nil || t.stats.Objects() < a.muteObjects {
		return t.conn.Flush()
	}
	unmute := a.mute()
	err := t.conn.Flush()
	// A Flush that returned nil committed once: a transaction this large
	// is not empty (the kernel counts a generation for each non-empty
	// commit only). One that failed after the kernel applied it (its
	// answers lost) counts 0: the monitor then runs the check of every
	// chain (Lost), needlessly.
	commits := 0
	if err == nil {
		commits = 1
	}
	unmute(commits)
	return err
}

// end ends the transaction t: a connection of its own is closed, and after
// an error, the lasting connection is closed if t used it, with whatever t
// left in it.
func (a *applier) end(t *txn, err error) {
	switch {
	case a.lasting == nil || t.relay != a.lasting.relay:
		_ = t.relay.Close()
	case err != nil:
		a.Close()
	}
}

// Full replaces the tables with rs in one transaction: each table is
// added (so that deleting it cannot fail), deleted and built again in the
// same batch, so that packets see either the old tables or the new ones,
// never none; the inet table of kpng's versions before the tables per
// family goes in the same batch, the first time. On error nothing
// changed.
func (a *applier) Full(rs *ruleset) (stats Stats, err error) {
	// Each set: its declaration and a message of its elements at least;
	// each shard a rule in the services or its shards chain.
	messages := 200 + 2*len(rs.Sets) + len(rs.ServiceCIDRs) + shardsOf(rs.Sets).count() +
		3*(len(nodePortMatches(rs.Options, ipv4))+len(nodePortMatches(rs.Options, ipv6)))
	for _, c := range rs.Chains {
		messages += 1 + len(c.Rules)
	}
	elements := len(rs.Elements) + len(rs.Hairpin) + len(rs.ClusterIPs)
	for _, bl := range rs.Blocks {
		elements += 2 * len(bl.Endpoints)
	}
	for _, st := range rs.Sets {
		elements += len(st.Targets)
	}
	t, err := a.begin(messages+elements/minElementsPerMessage, elements)
	if err != nil {
		return Stats{}, err
	}
	defer func() { a.end(t, err) }()
	caps := wholeCapacities(rs)
	if err := t.full(rs, caps, a.legacy); err != nil {
		return t.stats, err
	}
	if err := a.flush(t); err != nil {
		return t.stats, fmt.Errorf("replace tables ip and ip6 %s (%d chains, %d elements): %w", a.tables[ipv4].Name, len(rs.Chains), len(rs.Elements), err)
	}
	a.caps = caps
	a.legacy = nil
	a.fixed = t.rules
	for _, ch := range rs.Chains {
		delete(a.fixed, chainKey{ch.Family, ch.Name})
	}
	a.opts, a.shards = rs.Options, shardsOf(rs.Sets)
	return t.stats, nil
}

// lookupChainRules adds the rules of a lookup chain ch of family f's
// table of the given map kinds, with the shards sh (the services chain's
// rules of the shards present), looking up maps (the fixed verdict maps;
// by name when nil) and the shard sets (those added in the transaction,
// else by name).
func (t *txn) lookupChainRules(f ipFamily, ch *nftables.Chain, opts Options, sh shards, kinds []mapKind, maps map[string]*nftables.Set) {
	lookupRules(f, opts, sh, kinds, func(r lookupRule) {
		switch {
		case r.guard:
			set := t.clusterIPs[r.f]
			if set == nil {
				set = clusterIPsSetRef(t.tables[r.f], r.f)
			}
			t.addRule(ch, daddrInSetExprs(r.f, set, &expr.Verdict{Kind: expr.VerdictJump, Chain: shardsChainName(r.f)}))
			return
		case r.shard > 0:
			t.addRule(ch, t.shardRuleExprs(r.f, r.shard))
			return
		}
		m := maps[r.k.name(r.f)]
		if m == nil {
			m = mapRef(t.tables[r.f], r.f, r.k.name(r.f))
		}
		t.addRule(ch, lookupExprs(r.f, r.k, r.npm, m))
	})
}

func (t *txn) full(rs *ruleset, caps capacities, legacy *nftables.Table) error {
	c := t.conn
	t.caps = caps
	if legacy != nil {
		c.AddTable(legacy)
		c.DelTable(legacy)
		t.stats.Messages += 2
	}
	for _, tb := range t.tables {
		c.AddTable(tb)
		c.DelTable(tb)
		c.AddTable(tb)
	}
	t.stats.Messages += 6

	maps := map[string]*nftables.Set{}
	for _, f := range []ipFamily{ipv4, ipv6} {
		for _, k := range mapKinds {
			name := k.name(f)
			m := mapRef(t.tables[f], f, name)
			if name == mapServices(f) {
				m.Size = caps[sizedSet{services: true, family: f}].capacity
			}
			if err := c.AddSet(m, nil); err != nil {
				return fmt.Errorf("map %s: %w", name, err)
			}
			t.stats.Messages++
			maps[name] = m
		}
	}
	var hairpin [2]*nftables.Set
	for _, f := range []ipFamily{ipv4, ipv6} {
		hairpin[f] = hairpinSetRef(t.tables[f], f)
		hairpin[f].Size = caps[sizedSet{family: f}].capacity
		if err := c.AddSet(hairpin[f], nil); err != nil {
			return fmt.Errorf("set %s: %w", hairpin[f].Name, err)
		}
		t.stats.Messages++
	}
	if err := t.hairpinElements(rs.Hairpin, false); err != nil {
		return err
	}
	var clusterIPs [2]*nftables.Set
	for _, f := range []ipFamily{ipv4, ipv6} {
		clusterIPs[f] = clusterIPsSetRef(t.tables[f], f)
		clusterIPs[f].Size = caps[sizedSet{clusterIPs: true, family: f}].capacity
		if err := c.AddSet(clusterIPs[f], nil); err != nil {
			return fmt.Errorf("set %s: %w", clusterIPs[f].Name, err)
		}
		t.stats.Messages++
	}
	if err := t.clusterIPElements(rs.ClusterIPs, false); err != nil {
		return err
	}

	// The regular chains and named sets before the fixed chains' rules,
	// which go to the shards' chains and look up their sets; sets after
	// the chains their elements go to.
	for _, ch := range rs.Chains {
		t.addChain(ch.Family, ch.Name)
		t.stats.ChainsAdded++
	}
	for _, st := range rs.Sets {
		if err := t.addSet(st); err != nil {
			return err
		}
	}
	t.clusterIPs = clusterIPs
	sh := shardsOf(rs.Sets)
	for _, f := range []ipFamily{ipv4, ipv6} {
		t.fixedChains(f, rs, sh, maps, hairpin[f])
	}

	// Endpoint map and shard set elements after the rules: the kernel
	// checks a new element against each rule using its set (a short
	// list), a new rule against each element of the set (a walk of its
	// tree).
	for _, ch := range rs.Chains {
		if err := t.addRules(ch); err != nil {
			return err
		}
	}
	if err := t.blockElements(rs.Blocks); err != nil {
		return err
	}
	byMap := map[string][]mapElement{}
	for _, e := range rs.Elements {
		byMap[e.set()] = append(byMap[e.set()], e)
	}
	for name, els := range byMap {
		m := maps[name]
		if m == nil {
			m = t.sets[name] // a shard set
		}
		if m == nil {
			return fmt.Errorf("element %s: no map %s", els[0].Key, name)
		}
		if err := t.setElements(m, els, false); err != nil {
			return err
		}
	}
	return nil
}

// fixedChains adds the fixed chains of family f's table, with their
// rules: the shards chain, the lookup chains, the reject and node-port
// check chains, the masquerading chains (hairpin: the family's hairpin
// set), cluster-ips-check, then the base chains, which jump to them.
func (t *txn) fixedChains(f ipFamily, rs *ruleset, sh shards, maps map[string]*nftables.Set, hairpin *nftables.Set) {
	// Fixed regular chains before the base chains, which jump to them,
	// the shards chain before the services chain.
	if sh.guarded(f) {
		t.shardRules(t.addChain(f, shardsChainName(f)), f, sh)
	}
	for _, lc := range lookupChains {
		t.lookupChainRules(f, t.addChain(f, lc.name), rs.Options, sh, lc.kinds, maps)
	}
	reject := t.addChain(f, chainReject)
	for _, r := range rejectRules(f) {
		t.addRule(reject, r)
	}
	for _, c := range nodePortChecks(f) {
		verdict := &expr.Verdict{Kind: expr.VerdictGoto, Chain: chainReject}
		if c.drop {
			verdict = &expr.Verdict{Kind: expr.VerdictDrop}
		}
		ch := t.addChain(f, c.name)
		for _, npm := range nodePortMatches(rs.Options, f) {
			t.addRule(ch, append(nodePortMatchExprs(f, npm), verdict))
		}
	}
	masq := t.addChain(f, chainMasquerading)
	t.addRule(masq, masqueradeMarkedExprs(rs.Options.mark()))
	t.addRule(masq, hairpinExprs(f, hairpin))
	t.addRule(t.addChain(f, chainMarkForMasquerade), markExprs(rs.Options.mark(), false))
	check := t.addChain(f, chainClusterIPsCheck)
	for _, r := range clusterIPsCheckRules(f, t.clusterIPs[f], rs.ServiceCIDRs) {
		t.addRule(check, r)
	}
	for _, bc := range baseChains {
		ch := t.addBaseChain(f, bc)
		for _, j := range bc.jumps {
			if j.newOnly {
				t.addRule(ch, newConnJumpExprs(j.chain))
			} else {
				t.addRule(ch, []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: j.chain}})
			}
		}
	}
}

// Partial applies d in one transaction: new chains are created, then new
// sets (balance maps go to chains), then the endpoint maps' and hairpin
// sets' elements are deleted and added (and cluster-ips-check written
// again when the service CIDRs changed, the services chain and the
// family's shards chain when a shard came or went), changed chains
// flushed, then their rules added; verdict map and shard set elements are
// deleted and added; deleted chains are flushed, then deleted sets
// deleted, then deleted chains deleted (each after everything that
// referenced it is gone). On error nothing changed.
func (a *applier) Partial(d delta) (stats Stats, err error) {
	// The fixed maps and sets: a deletion and an addition each at most,
	// then each endpoint map touched and each set: two messages each.
	messages := 40 + 2*d.Sets.Len() + 2*d.Chains.Len()
	for _, items := range [][]diffstore.Item[string, *regularChain]{d.Chains.Created, d.Chains.Updated} {
		for _, it := range items {
			messages += len(it.Value.Rules)
		}
	}
	touched := map[string]bool{}
	for _, items := range [][]diffstore.Item[uint64, endpointElement]{d.Endpoints.Created, d.Endpoints.Updated, d.Endpoints.Deleted} {
		for _, it := range items {
			touched[it.Value.Map()] = true
			touched[it.Prev.Map()] = true
		}
	}
	messages += 2 * len(touched)
	if d.ServiceCIDRs.Len() > 0 {
		messages += 6 + len(d.ServiceCIDRs.Now)
	}
	elements := d.Elements.Len() + 4*d.Endpoints.Len() + d.Hairpin.Len() + d.ClusterIPs.Len()
	for _, it := range d.Sets.Created {
		elements += len(it.Value.Targets)
	}
	caps, _ := a.caps.after(d)
	sh := a.shards.after(d)
	var services *servicesRules
	if sh != a.shards {
		services = &servicesRules{opts: a.opts, old: a.shards, shards: sh}
		// The services chain and the shards chains flushed and written
		// again (two of them deleted).
		messages += 20 + a.fixed[chainKey{ipv4, chainServices}] + a.fixed[chainKey{ipv6, chainServices}] + sh.count()
	}
	t, err := a.begin(messages+elements/minElementsPerMessage, elements)
	if err != nil {
		return Stats{}, err
	}
	defer func() { a.end(t, err) }()
	t.caps = caps
	if err := t.partial(d, services); err != nil {
		return t.stats, err
	}
	if err := a.flush(t); err != nil {
		return t.stats, fmt.Errorf("update tables ip and ip6 %s (%d objects): %w", a.tables[ipv4].Name, t.stats.Objects(), err)
	}
	a.caps = caps
	a.shards = sh
	for _, f := range []ipFamily{ipv4, ipv6} {
		if !sh.guarded(f) {
			delete(a.fixed, chainKey{f, shardsChainName(f)})
		}
		for _, name := range []string{chainClusterIPsCheck, chainServices, shardsChainName(f)} {
			if n, ok := t.rules[chainKey{f, name}]; ok {
				// Rewritten (new service CIDRs, shards): Check expects
				// its new rules.
				a.fixed[chainKey{f, name}] = n
			}
		}
	}
	return t.stats, nil
}

// Fits reports whether the round d can be applied by Partial: its sized
// sets stay within their capacities (a table was written whole, and d
// does not take a hairpin, cluster-ips, services or shard set or a shard
// map over the capacity it was given when created). Otherwise the table
// must be written whole (Full), with capacities for its new counts.
func (a *applier) Fits(d delta) bool {
	_, ok := a.caps.after(d)
	return ok
}

// shardRuleExprs returns the expressions of the rule of shard n of family
// f (shardRuleText), its set the one added in the transaction, if it was.
func (t *txn) shardRuleExprs(f ipFamily, n uint32) []expr.Any {
	name := shardSetName(f, n)
	set := t.sets[name]
	if set == nil {
		set = shardSetRef(t.tables[f], f, name)
	}
	return shardRuleExprs(f, n, set)
}

// shardRules adds the rules of the shards sh of family f to ch, the
// family's shards chain.
func (t *txn) shardRules(ch *nftables.Chain, f ipFamily, sh shards) {
	sh.each(f, func(n uint32) { t.addRule(ch, t.shardRuleExprs(f, n)) })
}

// servicesRules are what the services chain's rules are written from
// when a round adds or deletes a shard: the options of the last full
// write, the shards present before the round (old) and after it.
type servicesRules struct {
	opts        Options
	old, shards shards
}

func (t *txn) partial(d delta, services *servicesRules) error {
	c := t.conn
	for _, it := range d.Chains.Created {
		t.addChain(it.Value.Family, it.Key)
		t.stats.ChainsAdded++
	}
	// Sets after the chains their elements go to, before the rules that
	// use them.
	for _, it := range d.Sets.Created {
		if err := t.addSet(it.Value); err != nil {
			return err
		}
	}
	// Endpoint map and hairpin elements: deleted and updated ones are
	// removed, created and updated ones added.
	if err := t.endpointElements(append(items(d.Endpoints.Deleted, true), items(d.Endpoints.Updated, true)...), nil, true); err != nil {
		return err
	}
	// The elements added are those of blocks created or updated in the
	// round: their comments are those blocks'.
	comments := commentsOf(items(d.Blocks.Created, false), items(d.Blocks.Updated, false))
	if err := t.endpointElements(append(items(d.Endpoints.Updated, false), items(d.Endpoints.Created, false)...), comments, false); err != nil {
		return err
	}
	if err := t.hairpinElements(d.Hairpin.Deleted, true); err != nil {
		return err
	}
	if err := t.hairpinElements(d.Hairpin.Created, false); err != nil {
		return err
	}
	if err := t.clusterIPElements(d.ClusterIPs.Deleted, true); err != nil {
		return err
	}
	if err := t.clusterIPElements(d.ClusterIPs.Created, false); err != nil {
		return err
	}
	if d.ServiceCIDRs.Len() > 0 {
		// The service CIDRs changed: cluster-ips-check written again, in
		// both tables.
		for _, f := range []ipFamily{ipv4, ipv6} {
			check := t.chainRef(f, chainClusterIPsCheck)
			c.FlushChain(check)
			t.stats.Messages++
			t.stats.ChainsFlushed++
			for _, r := range clusterIPsCheckRules(f, clusterIPsSetRef(t.tables[f], f), d.ServiceCIDRs.Now) {
				t.addRule(check, r)
			}
		}
	}
	if services != nil {
		// A shard came or went: the services chain written again with
		// the rules of the shards present, or the jump to the family's
		// shards chain (written again when its shards changed, added
		// before the jump, or deleted after the services chain no longer
		// jumps to it), after the new shards' sets and chains are added,
		// before the deleted ones go. A chain whose rules stay the same
		// is left as it is.
		for _, f := range []ipFamily{ipv4, ipv6} {
			if !services.shards.guarded(f) || (services.old.guarded(f) && services.old[f] == services.shards[f]) {
				continue
			}
			if services.old.guarded(f) {
				c.FlushChain(t.chainRef(f, shardsChainName(f)))
				t.stats.Messages++
				t.stats.ChainsFlushed++
			} else {
				t.addChain(f, shardsChainName(f))
				t.stats.ChainsAdded++
			}
			t.shardRules(t.chainRef(f, shardsChainName(f)), f, services.shards)
		}
		for _, f := range []ipFamily{ipv4, ipv6} {
			if services.old.sameServicesRules(f, services.shards) {
				continue
			}
			ch := t.chainRef(f, chainServices)
			c.FlushChain(ch)
			t.stats.Messages++
			t.stats.ChainsFlushed++
			for _, lc := range lookupChains {
				if lc.name == chainServices {
					t.lookupChainRules(f, ch, services.opts, services.shards, lc.kinds, nil)
				}
			}
		}
		for _, f := range []ipFamily{ipv4, ipv6} {
			if services.old.guarded(f) && !services.shards.guarded(f) {
				ref := t.chainRef(f, shardsChainName(f))
				c.FlushChain(ref)
				c.DelChain(ref)
				t.stats.Messages += 2
				t.stats.ChainsDeleted++
			}
		}
	}
	for _, it := range d.Chains.Updated {
		c.FlushChain(t.chainRef(it.Value.Family, it.Key))
		t.stats.Messages++
		t.stats.ChainsFlushed++
	}
	for _, items := range [][]diffstore.Item[string, *regularChain]{d.Chains.Created, d.Chains.Updated} {
		for _, it := range items {
			if err := t.addRules(it.Value); err != nil {
				return err
			}
		}
	}

	// Elements: deleted and updated ones are removed, created and updated
	// ones added.
	for _, del := range [][]diffstore.Item[string, mapElement]{d.Elements.Deleted, d.Elements.Updated} {
		if err := t.elementGroups(del, true, func(it diffstore.Item[string, mapElement]) mapElement { return it.Prev }); err != nil {
			return err
		}
	}
	for _, add := range [][]diffstore.Item[string, mapElement]{d.Elements.Updated, d.Elements.Created} {
		if err := t.elementGroups(add, false, func(it diffstore.Item[string, mapElement]) mapElement { return it.Value }); err != nil {
			return err
		}
	}

	for _, it := range d.Chains.Deleted {
		c.FlushChain(t.chainRef(it.Prev.Family, it.Key))
		t.stats.Messages++
	}
	// Sets once the rules that used them are gone (flushed), before the
	// chains their elements go to.
	for _, it := range d.Sets.Deleted {
		c.DelSet(&nftables.Set{Table: t.tables[it.Prev.Family], Name: it.Key})
		t.stats.Messages++
		t.stats.SetsDeleted++
	}
	for _, it := range d.Chains.Deleted {
		c.DelChain(t.chainRef(it.Prev.Family, it.Key))
		t.stats.Messages++
		t.stats.ChainsDeleted++
	}
	return nil
}

// items returns the values of its (prev: the previous values).
func items[K cmp.Ordered, V any](its []diffstore.Item[K, V], prev bool) []V {
	out := make([]V, len(its))
	for i, it := range its {
		out[i] = it.Value
		if prev {
			out[i] = it.Prev
		}
	}
	return out
}

// endpointElements adds (or deletes) the intervals els in their endpoint
// or shard maps, each as its start and end elements in an endpoint map,
// as one element in a shard map (intervalElements); an added interval
// has its block's comment, from comments. The kernel elements of a map
// are made a message at a time (sendElements), not all at once: a full
// sync of 10,000 services has 200,000 of them.
func (t *txn) endpointElements(els []endpointElement, comments blockComments, del bool) error {
	byMap := map[string][]int32{}
	var order []string
	for i, e := range els {
		name := e.Map()
		if _, ok := byMap[name]; !ok {
			order = append(order, name)
		}
		byMap[name] = append(byMap[name], int32(i))
	}
	for _, name := range order {
		idx := byMap[name]
		m := t.intervalMap(els[idx[0]].Family, name)
		per := elementsPerInterval(name)
		elem := intervalElems(per, del, func(k int) (endpointElement, string) {
			e := els[idx[k]]
			return e, comments.of(e)
		})
		size := func(i int) int {
			if i%per == 1 || del {
				return elementBytes(80, "", "")
			}
			return elementBytes(80, "", comments.of(els[idx[i/per]]))
		}
		if err := t.sendElements(m, per*len(idx), elem, size, del); err != nil {
			return err
		}
	}
	return nil
}

// intervalMap returns the set object of the endpoint or shard map name
// of family f: the one added in the transaction, if it was.
func (t *txn) intervalMap(f ipFamily, name string) *nftables.Set {
	if s := t.sets[name]; s != nil {
		return s
	}
	return intervalMapRef(t.tables[f], f, name)
}

// elementsPerInterval is the number of kernel elements of an interval of
// the map name: 2 in an endpoint map (its start, and its end flagged as
// such), 1 in a shard map (a hash: its key and draw; the "interval" of
// the maps' shared code is one draw there).
func elementsPerInterval(name string) int {
	if isShardEndpointMap(name) {
		return 1
	}
	return 2
}

// intervalElems returns the elem function of sendElements for the
// intervals of a map with per kernel elements each, interval(j) giving
// the j-th interval and its comment: elements per·j to per·j+per-1 are
// interval j's, asked for in order, so each interval's are made once a
// pass.
func intervalElems(per int, del bool, interval func(j int) (endpointElement, string)) func(i int) (nftables.SetElement, error) {
	pairOf, pair := -1, [2]nftables.SetElement{}
	return func(i int) (nftables.SetElement, error) {
		if j := i / per; j != pairOf {
			e, comment := interval(j)
			var err error
			if pair, err = intervalElements(e, comment, del); err != nil {
				return nftables.SetElement{}, err
			}
			pairOf = j
		}
		return pair[i%per], nil
	}
}

// intervalElements returns the kernel elements of the interval e
// (elementsPerInterval of them).
func intervalElements(e endpointElement, comment string, del bool) ([2]nftables.SetElement, error) {
	if e.Shard.Addr.IsValid() {
		el, err := shardMapElement(e, comment, del)
		return [2]nftables.SetElement{el}, err
	}
	return endpointMapElements(e, comment, del), nil
}

// blockElements adds the elements of the endpoint and shard maps holding
// blocks, sorted with compareBlocks (as in a ruleset): each block's
// intervals, made from the block when they are marshaled (sendElements),
// never listed at once (100,000 intervals at 10,000 services), each with
// its block's comment (the start of an endpoint map's).
func (t *txn) blockElements(blocks []*block) error {
	for start, end := 0, 0; start < len(blocks); start = end {
		name, f := blocks[start].Map(), blocks[start].Family
		for end = start + 1; end < len(blocks) && blocks[end].Family == f && blocks[end].Map() == name; end++ {
		}
		group := blocks[start:end]
		// first[k] is the number of the first interval of group[k].
		first := make([]int, len(group)+1)
		comments, owners := make([]string, len(group)), make([]uint64, len(group))
		for k, bl := range group {
			first[k+1] = first[k] + len(bl.Endpoints)
			comments[k], owners[k] = bl.Comment(), ownerOf(bl.ID)
		}
		blockOf := func(j int) int {
			k, found := slices.BinarySearch(first, j)
			if !found {
				k--
			}
			for first[k+1] == j { // blocks without endpoints
				k++
			}
			return k
		}
		m := t.intervalMap(f, name)
		per := elementsPerInterval(name)
		elem := intervalElems(per, false, func(j int) (endpointElement, string) {
			k := blockOf(j)
			return group[k].element(j-first[k], owners[k]), comments[k]
		})
		size := func(i int) int {
			if i%per == 1 {
				return elementBytes(80, "", "")
			}
			return elementBytes(80, "", comments[blockOf(i/per)])
		}
		if err := t.sendElements(m, per*first[len(group)], elem, size, false); err != nil {
			return err
		}
	}
	return nil
}

// hairpinElements adds (or deletes) addrs in the hairpin sets.
func (t *txn) hairpinElements(addrs []netip.Addr, del bool) error {
	for f, fam := range byFamily(addrs) {
		elem := func(i int) (nftables.SetElement, error) { return hairpinElement(fam[i]), nil }
		if err := t.sendElements(hairpinSetRef(t.tables[f], ipFamily(f)), len(fam), elem, func(int) int { return elementBytes(32, "", "") }, del); err != nil {
			return err
		}
	}
	return nil
}

// clusterIPElements adds (or deletes) addrs in the cluster-ips sets.
func (t *txn) clusterIPElements(addrs []netip.Addr, del bool) error {
	for f, fam := range byFamily(addrs) {
		elem := func(i int) (nftables.SetElement, error) { return addrElement(fam[i]), nil }
		if err := t.sendElements(clusterIPsSetRef(t.tables[f], ipFamily(f)), len(fam), elem, func(int) int { return elementBytes(16, "", "") }, del); err != nil {
			return err
		}
	}
	return nil
}

// byFamily returns addrs split by family (ipv4, ipv6), in their order.
func byFamily(addrs []netip.Addr) [2][]netip.Addr {
	n := familyCounts(addrs)
	out := [2][]netip.Addr{make([]netip.Addr, 0, n[ipv4]), make([]netip.Addr, 0, n[ipv6])}
	for _, a := range addrs {
		out[familyOf(a)] = append(out[familyOf(a)], a)
	}
	return out
}

// sendElements adds (or deletes) the n elements elem(0) to elem(n-1) in
// set m, in messages cut by chunkEnd (size(i): an upper bound of the i-th
// element's encoded size). The elements are marshaled when the batch is
// sent, straight into its buffer (elements.go): elem is called then
// again, in order, and must give the same elements.
func (t *txn) sendElements(m *nftables.Set, n int, elem func(i int) (nftables.SetElement, error), size func(i int) int, del bool) error {
	for start, end := 0, 0; start < n; start = end {
		end = chunkEnd(start, n, size)
		if del {
			t.stats.ElementsDeleted += end - start
		} else {
			t.stats.ElementsAdded += end - start
		}
		if err := t.elements(m, start, end, elem, del); err != nil {
			return err
		}
	}
	return nil
}

// elements adds (or deletes) elem(from) to elem(to-1) in set m, in one
// message: a placeholder through google/nftables, in its place in the
// batch, and its payload for the relay to write there (elements.go).
func (t *txn) elements(m *nftables.Set, from, to int, elem func(i int) (nftables.SetElement, error), del bool) error {
	l, err := newElementList(m, from, to, elem, &t.scratch)
	if err != nil {
		return fmt.Errorf("set %s: %w", m.Name, err)
	}
	if del {
		err = t.conn.SetDeleteElements(m, nil)
	} else {
		err = t.conn.SetAddElements(m, nil)
	}
	if err != nil {
		return fmt.Errorf("set %s: %w", m.Name, err)
	}
	t.relay.elements = append(t.relay.elements, l)
	t.stats.Messages++
	return nil
}

// addSet adds a named set (an endpoint map, a balance map with its
// elements, or an affinity set), remembering it for the rules of the same
// transaction that refer to it.
func (t *txn) addSet(st *namedSet) error {
	ns := setRef(t.tables[st.Family], st)
	if st.Shard > 0 || st.ShardSet > 0 {
		ns.Size = t.caps[shardSized(st.Name)].capacity
	}
	if ud := st.userData(); ud != nil {
		t.relay.userData[st.Name] = ud
	}
	if err := t.conn.AddSet(ns, nil); err != nil {
		return fmt.Errorf("service %s: set %s: %w", st.Service, st.Name, err)
	}
	t.stats.Messages++
	// A balance map's elements in messages of their own, cut so that one
	// message's elements stay within a 16-bit netlink attribute (AddSet
	// would put them all in one).
	els := balanceElements(st.Targets)
	size := func(i int) int { return elementBytes(4, st.Targets[i], "") }
	elem := func(i int) (nftables.SetElement, error) { return els[i], nil }
	for start, end := 0, 0; start < len(els); start = end {
		end = chunkEnd(start, len(els), size)
		if err := t.elements(ns, start, end, elem, false); err != nil {
			return fmt.Errorf("service %s: %w", st.Service, err)
		}
	}
	t.sets[st.Name] = ns
	t.stats.SetsAdded++
	return nil
}

// elementGroups adds or deletes the elements of items, one message per
// map or shard set (mapElement.set).
func (t *txn) elementGroups(items []diffstore.Item[string, mapElement], del bool, pick func(diffstore.Item[string, mapElement]) mapElement) error {
	byMap := map[string][]mapElement{}
	var order []string
	for _, it := range items {
		e := pick(it)
		name := e.set()
		if _, ok := byMap[name]; !ok {
			order = append(order, name)
		}
		byMap[name] = append(byMap[name], e)
	}
	for _, name := range order {
		els := byMap[name]
		f := els[0].Family
		m := mapRef(t.tables[f], f, name)
		if els[0].Verdict.Shard > 0 {
			if m = t.sets[name]; m == nil {
				m = shardSetRef(t.tables[f], f, name)
			}
		}
		if err := t.setElements(m, els, del); err != nil {
			return err
		}
	}
	return nil
}

// setElements adds (or deletes) els in m, in messages of at most
// elementsPerMessage elements and elementBytesPerMessage bytes.
func (t *txn) setElements(m *nftables.Set, els []mapElement, del bool) error {
	elem := func(i int) (nftables.SetElement, error) {
		e := els[i]
		k, err := keyBytes(e.Key)
		if err != nil {
			return nftables.SetElement{}, fmt.Errorf("service %s: element %s: %w", e.Service, e.Key, err)
		}
		el := nftables.SetElement{Key: k}
		if !del {
			if e.Verdict.Shard == 0 { // a shard set's element has no verdict
				el.VerdictData = verdictExpr(e.Verdict)
			}
			el.Comment = e.Comment()
		}
		return el, nil
	}
	size := func(i int) int {
		comment := ""
		if !del {
			comment = els[i].Comment()
		}
		return elementBytes(24, els[i].Verdict.Goto, comment)
	}
	return t.sendElements(m, len(els), elem, size, del)
}

// chainRef returns the chain name of family f's table.
func (t *txn) chainRef(f ipFamily, name string) *nftables.Chain {
	return &nftables.Chain{Name: name, Table: t.tables[f]}
}

// addChain adds the regular chain name to family f's table.
func (t *txn) addChain(f ipFamily, name string) *nftables.Chain {
	t.stats.Messages++
	return t.conn.AddChain(t.chainRef(f, name))
}

// addBaseChain adds the base chain bc to family f's table.
func (t *txn) addBaseChain(f ipFamily, bc baseChain) *nftables.Chain {
	typ, hook := nftables.ChainTypeNAT, nftables.ChainHookPrerouting
	if bc.typ == "filter" {
		typ = nftables.ChainTypeFilter
	}
	switch bc.hook {
	case "input":
		hook = nftables.ChainHookInput
	case "forward":
		hook = nftables.ChainHookForward
	case "output":
		hook = nftables.ChainHookOutput
	case "postrouting":
		hook = nftables.ChainHookPostrouting
	}
	policy := nftables.ChainPolicyAccept
	t.stats.Messages++
	return t.conn.AddChain(&nftables.Chain{
		Name:     bc.name,
		Table:    t.tables[f],
		Type:     typ,
		Hooknum:  hook,
		Priority: nftables.ChainPriorityRef(nftables.ChainPriority(bc.priority)),
		Policy:   &policy,
	})
}

// addRule adds a rule of exprs to the chain ch (of its table).
func (t *txn) addRule(ch *nftables.Chain, exprs []expr.Any) {
	t.conn.AddRule(&nftables.Rule{Table: ch.Table, Chain: ch, Exprs: exprs})
	t.rules[chainKey{tableFamily(ch.Table), ch.Name}]++
	t.stats.Messages++
	t.stats.Rules++
}

// addRules adds the rules of a service or endpoint chain.
func (t *txn) addRules(ch *regularChain) error {
	ref := t.chainRef(ch.Family, ch.Name)
	for _, r := range ch.Rules {
		nr, ok := r.(netlinkRule)
		if !ok {
			return fmt.Errorf("service %s: chain %s: rule %T has no netlink expressions", ch.Service, ch.Name, r)
		}
		exprs, err := nr.exprs(t.sets)
		if err != nil {
			return fmt.Errorf("service %s: chain %s: %w", ch.Service, ch.Name, err)
		}
		t.addRule(ref, exprs)
	}
	return nil
}

// Cleanup removes the tables of the proxier of cfg (TableName of
// cfg.ServiceProxyName: its ip and ip6 tables, and the inet table of
// earlier versions), those that exist, in one transaction, through a
// connection from cfg.Conn (nftables.New when nil), as --cleanup does. It
// logs through ctx's logger.
func Cleanup(ctx context.Context, cfg Config) error {
	newConn := cfg.Conn
	if newConn == nil {
		newConn = nftables.New
	}
	conn, err := newConn()
	if err != nil {
		return fmt.Errorf("nftables backend: cleanup: %w", err)
	}
	name := TableName(cfg.ServiceProxyName)
	tables := familyTables(name)
	for _, t := range append(tables[:], &nftables.Table{Name: name, Family: nftables.TableFamilyINet}) {
		conn.AddTable(t)
		conn.DelTable(t)
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("nftables backend: cleanup: delete tables ip, ip6 and inet %s: %w", name, err)
	}
	klog.FromContext(ctx).Info("Removed the nftables tables", "table", name)
	return nil
}

// tableFamily returns the family of tb, one of the applier's tables.
func tableFamily(tb *nftables.Table) ipFamily {
	if tb.Family == nftables.TableFamilyIPv6 {
		return ipv6
	}
	return ipv4
}

// ConnInNetNS returns a Config.Conn for the network namespace open as fd:
// nftables.New with nftables.WithNetNSFd(fd) and the options given. Each
// connection first checks that fd is still an open network namespace:
// once closed, its number is soon another file's, and the namespace
// library, which opens the current thread's namespace for itself, would
// then quietly work in the current namespace (found when a test's
// *os.File holding fd was garbage collected: its table went to the host).
// Keep the file open as long as the sink lives.
func ConnInNetNS(fd int) func(...nftables.ConnOption) (*nftables.Conn, error) {
	return func(opts ...nftables.ConnOption) (*nftables.Conn, error) {
		if typ, err := unix.IoctlRetInt(fd, nsGetNSType); err != nil || typ != unix.CLONE_NEWNET {
			return nil, fmt.Errorf("network namespace file descriptor %d: not an open network namespace (closed too early?): type %#x, %v", fd, typ, err)
		}
		return nftables.New(append([]nftables.ConnOption{nftables.WithNetNSFd(fd)}, opts...)...)
	}
}

// nsGetNSType is the ioctl NS_GET_NSTYPE (linux/nsfs.h): the type of the
// namespace a file descriptor refers to, as its CLONE_NEW* flag.
const nsGetNSType = 0xb703
