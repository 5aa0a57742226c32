package iptables

import (
	"fmt"
	"net/netip"
	"slices"
)

// The shape of the dispatch tree.
const (
	// flatDispatch is the number of dispatch rules up to which SERVICES
	// holds them directly, as kube-proxy's KUBE-SERVICES.
	flatDispatch = 32
	// leafDispatch is the number of rules up to which a group of
	// addresses is a leaf chain of the tree (more when one address has
	// more ports).
	leafDispatch = 16
	// stride is the number of address bits a tree level splits on: up to
	// 16 children per chain.
	stride = 4
	// kindDispatch is the kind of the tree's chains.
	kindDispatch = "DSP"
)

// dispatchTree lays out the table's dispatch entries in its SERVICES
// chain. Up to flatDispatch entries, one rule each, in order, as
// kube-proxy does. Beyond, as a tree of chains keyed by destination
// prefix: each chain matches the longest prefix its addresses share, then
// splits them on the next stride bits (up to 16 rules "-d <prefix> -j
// <chain>"), down to leaves of at most leafDispatch rules (or one
// address). A packet goes through about 16 rules per level and
// log16(n/16) levels, instead of n rules: the first packet of a
// connection costs far less at 10,000 services. Entries are unique per
// destination (claims), so their order does not matter; a packet that
// matches no entry falls through every chain back to SERVICES, and on to
// the node ports.
func (pl planner) dispatchTree(f family, table string, t *tablePlan) {
	entries := t.entries
	t.entries = nil
	services := pl.fixed(chainServices)
	if len(entries) <= flatDispatch {
		for _, e := range entries {
			t.add(services, e.Rule)
		}
		return
	}
	slices.SortStableFunc(entries, func(a, b entry) int { return a.Addr.Compare(b.Addr) })
	pl.dispatchNode(f, table, t, services, entries)
}

// dispatchNode fills the chain name with the rules sending the entries
// (sorted by address) on: split on the
// next stride bits after their longest common prefix, each group to a
// chain of its own, or the entries themselves in a leaf.
func (pl planner) dispatchNode(f family, table string, t *tablePlan, name string, entries []entry) {
	common := commonBits(entries[0].Addr, entries[len(entries)-1].Addr)
	if len(entries) <= leafDispatch || common == entries[0].Addr.BitLen() {
		for _, e := range entries {
			t.add(name, e.Rule)
		}
		return
	}
	// The entries differ at bit common: splitting on the stride that
	// holds it makes at least two groups, each sharing more bits.
	next := min(common-common%stride+stride, entries[0].Addr.BitLen())
	for len(entries) > 0 {
		p, _ := entries[0].Addr.Prefix(next)
		n := 1
		for n < len(entries) && p.Contains(entries[n].Addr) {
			n++
		}
		group := entries[:n]
		entries = entries[n:]
		if len(group) <= 1 {
			t.add(name, group[0].Rule)
			continue
		}
		// The child's prefix is what its addresses share.
		cp, _ := group[0].Addr.Prefix(commonBits(group[0].Addr, group[len(group)-1].Addr))
		child := serviceChain(pl.prefix, kindDispatch, fmt.Sprintf("%s/%s/%s", f, table, cp))
		t.chain(child)
		t.add(name, "-d", cp.String(), "-j", child)
		pl.dispatchNode(f, table, t, child, group)
	}
}

// commonBits returns the number of leading bits a and b (same family)
// share.
func commonBits(a, b netip.Addr) int {
	x, y := a.As16(), b.As16()
	skip := 0
	if a.Is4() {
		skip = 96
	}
	n := 0
	for i := range 16 {
		d := x[i] ^ y[i]
		if d == 0 {
			n += 8
			continue
		}
		for d&0x80 == 0 {
			n++
			d <<= 1
		}
		break
	}
	return n - skip
}
