//go:build linux

package nft

import (
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"sigs.k8s.io/kpng/diffstore"
)

// elementsPerMessage bounds the number of elements sent in one netlink
// message, to keep messages well under the socket buffer sizes.
const elementsPerMessage = 1024

// elementBytesPerMessage bounds the encoded size of the elements of one
// message: they travel in one netlink attribute, whose length is 16 bits.
// Longer, the length wraps and the kernel silently sees only part of the
// elements (found by the 1,000-service benchmark: 219 elements of 1,000).
const elementBytesPerMessage = 60000

// elementBytes is an upper bound of the encoded size of a verdict map
// element with a key of keyLen bytes going to chain: its nested attributes
// (list element, key, data, verdict code and chain, at most 64 bytes of
// headers and padding), key and chain name.
func elementBytes(keyLen int, chain string) int { return 64 + keyLen + len(chain) }

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
	// ElementsAdded and ElementsDeleted count verdict map elements
	// (anonymous maps of rules not included).
	ElementsAdded, ElementsDeleted int
}

// Objects returns the number of chains, rules and elements touched.
func (s Stats) Objects() int {
	return s.ChainsAdded + s.ChainsFlushed + s.ChainsDeleted + s.SetsAdded + s.SetsDeleted + s.Rules + s.ElementsAdded + s.ElementsDeleted
}

// Applier writes rulesets and deltas into one nftables table, each call
// one netlink transaction. It is not safe for concurrent use.
type Applier struct {
	newConn func() (*nftables.Conn, error)
	conn    *nftables.Conn // of the transaction being built
	table   *nftables.Table
	stats   Stats
	// sets are the named sets added in the transaction being built.
	sets map[string]*nftables.Set
	// balanceElements counts the elements of the balance maps added in
	// the transaction being built (for the send buffer).
	balanceElements int
}

// NewApplier returns an Applier writing the inet table named table. Each
// transaction is built on a new connection from newConn (a connection
// buffers its messages until Flush, so a transaction abandoned halfway must
// not leave them behind for the next one); nil means nftables.New(), in
// the current network namespace.
func NewApplier(newConn func() (*nftables.Conn, error), table string) *Applier {
	if newConn == nil {
		newConn = func() (*nftables.Conn, error) { return nftables.New() }
	}
	return &Applier{newConn: newConn, table: &nftables.Table{Name: table, Family: nftables.TableFamilyINet}}
}

// begin starts a transaction on a new connection.
func (a *Applier) begin() error {
	a.stats = Stats{}
	a.sets = map[string]*nftables.Set{}
	a.balanceElements = 0
	conn, err := a.newConn()
	if err != nil {
		return fmt.Errorf("nftables connection: %w", err)
	}
	a.conn = conn
	return nil
}

// bufferOptions sizes the socket buffers of the transaction's connection.
func (a *Applier) bufferOptions() {
	nftables.WithSockOptions(
		receiveBuffer(receiveBufferFor(a.stats.Messages)),
		sendBuffer(sendBufferFor(a.stats.Messages, a.stats.ElementsAdded+a.stats.ElementsDeleted+a.balanceElements)),
	)(a.conn)
}

// Full replaces the table with rs in one transaction: the table is added
// (so that deleting it cannot fail), deleted and built again in the same
// batch, so that packets see either the old table or the new one, never
// none. On error nothing changed.
func (a *Applier) Full(rs *Ruleset) (Stats, error) {
	if err := a.begin(); err != nil {
		return Stats{}, err
	}
	defer func() { a.conn = nil }()
	if err := a.full(rs); err != nil {
		return a.stats, err
	}
	a.bufferOptions()
	if err := a.conn.Flush(); err != nil {
		return a.stats, fmt.Errorf("replace table inet %s (%d chains, %d elements): %w", a.table.Name, len(rs.Chains), len(rs.Elements), err)
	}
	return a.stats, nil
}

func (a *Applier) full(rs *Ruleset) error {
	c := a.conn
	c.AddTable(a.table)
	c.DelTable(a.table)
	c.AddTable(a.table)
	a.stats.Messages += 3

	maps := map[string]*nftables.Set{}
	for _, f := range []Family{IPv4, IPv6} {
		for _, k := range mapKinds {
			name := k.name(f)
			m := mapRef(a.table, f, name)
			if err := c.AddSet(m, nil); err != nil {
				return fmt.Errorf("map %s: %w", name, err)
			}
			a.stats.Messages++
			maps[name] = m
		}
	}

	// Fixed regular chains first: base chains jump to them.
	for _, lc := range lookupChains {
		ch := a.addChain(lc.name)
		lookupRules(rs.Options, lc.kinds, func(f Family, k mapKind, npm nodePortMatch) {
			a.addRule(ch, lookupExprs(f, k, npm, maps[k.name(f)]))
		})
	}
	reject := a.addChain(ChainReject)
	for _, r := range rejectRules() {
		a.addRule(reject, r)
	}
	masq := a.addChain(ChainMasquerading)
	for _, r := range masqueradingRules(rs.Options.mark()) {
		a.addRule(masq, r)
	}
	a.addRule(a.addChain(ChainMarkForMasquerade), markExprs(rs.Options.mark(), false))
	for _, bc := range baseChains {
		ch := a.addBaseChain(bc)
		a.addRule(ch, []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: bc.jump}})
	}

	for _, ch := range rs.Chains {
		a.addChain(ch.Name)
		a.stats.ChainsAdded++
	}
	// Sets after the chains their elements go to, before the rules that
	// use them.
	for _, st := range rs.Sets {
		if err := a.addSet(st); err != nil {
			return err
		}
	}
	for _, ch := range rs.Chains {
		if err := a.addRules(ch); err != nil {
			return err
		}
	}
	byMap := map[string][]Element{}
	for _, e := range rs.Elements {
		byMap[e.Map] = append(byMap[e.Map], e)
	}
	for name, els := range byMap {
		m := maps[name]
		if m == nil {
			return fmt.Errorf("element %s: no map %s", els[0].Key, name)
		}
		if err := a.setElements(m, els, false); err != nil {
			return err
		}
	}
	return nil
}

// Partial applies d in one transaction: new chains are created, then new
// sets (balance maps go to chains), changed chains flushed, then their
// rules added; map elements are deleted and added; deleted chains are
// flushed, then deleted sets deleted, then deleted chains deleted (each
// after everything that referenced it is gone). On error nothing changed.
func (a *Applier) Partial(d Delta) (Stats, error) {
	if err := a.begin(); err != nil {
		return Stats{}, err
	}
	defer func() { a.conn = nil }()
	if err := a.partial(d); err != nil {
		return a.stats, err
	}
	a.bufferOptions()
	if err := a.conn.Flush(); err != nil {
		return a.stats, fmt.Errorf("update table inet %s (%d objects): %w", a.table.Name, a.stats.Objects(), err)
	}
	return a.stats, nil
}

func (a *Applier) partial(d Delta) error {
	c := a.conn
	for _, it := range d.Chains.Created {
		a.addChain(it.Key)
		a.stats.ChainsAdded++
	}
	// Sets after the chains their elements go to, before the rules that
	// use them.
	for _, it := range d.Sets.Created {
		if err := a.addSet(it.Value); err != nil {
			return err
		}
	}
	for _, it := range d.Chains.Updated {
		c.FlushChain(a.chainRef(it.Key))
		a.stats.Messages++
		a.stats.ChainsFlushed++
	}
	for _, items := range [][]diffstore.Item[string, *Chain]{d.Chains.Created, d.Chains.Updated} {
		for _, it := range items {
			if err := a.addRules(it.Value); err != nil {
				return err
			}
		}
	}

	// Elements: deleted and updated ones are removed, created and updated
	// ones added.
	for _, del := range [][]diffstore.Item[string, Element]{d.Elements.Deleted, d.Elements.Updated} {
		if err := a.elementGroups(del, true, func(it diffstore.Item[string, Element]) Element { return it.Prev }); err != nil {
			return err
		}
	}
	for _, add := range [][]diffstore.Item[string, Element]{d.Elements.Updated, d.Elements.Created} {
		if err := a.elementGroups(add, false, func(it diffstore.Item[string, Element]) Element { return it.Value }); err != nil {
			return err
		}
	}

	for _, it := range d.Chains.Deleted {
		c.FlushChain(a.chainRef(it.Key))
		a.stats.Messages++
	}
	// Sets once the rules that used them are gone (flushed), before the
	// chains their elements go to.
	for _, it := range d.Sets.Deleted {
		c.DelSet(&nftables.Set{Table: a.table, Name: it.Key})
		a.stats.Messages++
		a.stats.SetsDeleted++
	}
	for _, it := range d.Chains.Deleted {
		c.DelChain(a.chainRef(it.Key))
		a.stats.Messages++
		a.stats.ChainsDeleted++
	}
	return nil
}

// addSet adds a named set (a balance map with its elements, or an
// affinity set), remembering it for the rules of the same transaction
// that refer to it.
func (a *Applier) addSet(st *Set) error {
	ns := setRef(a.table, st)
	if err := a.conn.AddSet(ns, nil); err != nil {
		return fmt.Errorf("service %s: set %s: %w", st.Service, st.Name, err)
	}
	a.stats.Messages++
	// A balance map's elements in messages of their own, cut so that one
	// message's elements stay within a 16-bit netlink attribute (AddSet
	// would put them all in one).
	els := balanceElements(st.Targets)
	a.balanceElements += len(els)
	size := func(i int) int { return elementBytes(4, st.Targets[i]) }
	for start, end := 0, 0; start < len(els); start = end {
		end = chunkEnd(start, len(els), size)
		if err := a.conn.SetAddElements(ns, els[start:end]); err != nil {
			return fmt.Errorf("service %s: set %s: %w", st.Service, st.Name, err)
		}
		a.stats.Messages++
	}
	a.sets[st.Name] = ns
	a.stats.SetsAdded++
	return nil
}

// elementGroups adds or deletes the elements of items, one message per map.
func (a *Applier) elementGroups(items []diffstore.Item[string, Element], del bool, pick func(diffstore.Item[string, Element]) Element) error {
	byMap := map[string][]Element{}
	var order []string
	for _, it := range items {
		e := pick(it)
		if _, ok := byMap[e.Map]; !ok {
			order = append(order, e.Map)
		}
		byMap[e.Map] = append(byMap[e.Map], e)
	}
	for _, name := range order {
		els := byMap[name]
		if err := a.setElements(mapRef(a.table, els[0].Family, name), els, del); err != nil {
			return err
		}
	}
	return nil
}

// setElements adds (or deletes) els in m, in messages of at most
// elementsPerMessage elements and elementBytesPerMessage bytes.
func (a *Applier) setElements(m *nftables.Set, els []Element, del bool) error {
	size := func(i int) int { return elementBytes(24, els[i].Verdict.Goto) }
	for start, end := 0, 0; start < len(els); start = end {
		end = chunkEnd(start, len(els), size)
		chunk := els[start:end]
		nels := make([]nftables.SetElement, 0, len(chunk))
		for _, e := range chunk {
			k, err := keyBytes(e.Key)
			if err != nil {
				return fmt.Errorf("service %s: element %s: %w", e.Service, e.Key, err)
			}
			ne := nftables.SetElement{Key: k}
			if !del {
				ne.VerdictData = verdictExpr(e.Verdict)
			}
			nels = append(nels, ne)
		}
		var err error
		if del {
			err = a.conn.SetDeleteElements(m, nels)
			a.stats.ElementsDeleted += len(nels)
		} else {
			err = a.conn.SetAddElements(m, nels)
			a.stats.ElementsAdded += len(nels)
		}
		if err != nil {
			return fmt.Errorf("map %s: %w", m.Name, err)
		}
		a.stats.Messages++
	}
	return nil
}

func (a *Applier) chainRef(name string) *nftables.Chain {
	return &nftables.Chain{Name: name, Table: a.table}
}

func (a *Applier) addChain(name string) *nftables.Chain {
	a.stats.Messages++
	return a.conn.AddChain(a.chainRef(name))
}

func (a *Applier) addBaseChain(bc baseChain) *nftables.Chain {
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
	a.stats.Messages++
	return a.conn.AddChain(&nftables.Chain{
		Name:     bc.name,
		Table:    a.table,
		Type:     typ,
		Hooknum:  hook,
		Priority: nftables.ChainPriorityRef(nftables.ChainPriority(bc.priority)),
		Policy:   &policy,
	})
}

func (a *Applier) addRule(ch *nftables.Chain, exprs []expr.Any) {
	a.conn.AddRule(&nftables.Rule{Table: a.table, Chain: ch, Exprs: exprs})
	a.stats.Messages++
	a.stats.Rules++
}

// addRules adds the rules of a service or endpoint chain.
func (a *Applier) addRules(ch *Chain) error {
	ref := a.chainRef(ch.Name)
	for _, r := range ch.Rules {
		exprs, err := ruleExprs(r, a.sets)
		if err != nil {
			return fmt.Errorf("service %s: chain %s: %w", ch.Service, ch.Name, err)
		}
		a.addRule(ref, exprs)
	}
	return nil
}

// Cleanup removes the table of the proxier named serviceProxyName, if it
// exists, in one transaction.
func Cleanup(conn *nftables.Conn, serviceProxyName string) error {
	t := &nftables.Table{Name: TableName(serviceProxyName), Family: nftables.TableFamilyINet}
	conn.AddTable(t)
	conn.DelTable(t)
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("delete table inet %s: %w", t.Name, err)
	}
	return nil
}
