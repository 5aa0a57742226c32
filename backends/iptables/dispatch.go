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
// chain, and its node-port entries in its NODEPORTS chain. Up to flatDispatch entries, one rule each, in order, as
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
	} else {
		slices.SortStableFunc(entries, func(a, b entry) int { return a.Addr.Compare(b.Addr) })
		pl.dispatchNode(fmt.Sprintf("%s/%s", f, table), t, services, entries, func(p netip.Prefix) []string {
			return []string{"-d", p.String()}
		})
	}

	// Node ports: the same tree, per protocol, on the port's bits
	// ("--dport 30000:30255").
	nodePorts := pl.fixed(chainNodePorts)
	ports := t.portEntries
	t.portEntries = nil
	if len(ports) <= flatDispatch {
		for _, e := range ports {
			t.add(nodePorts, e.Rule)
		}
		return
	}
	slices.SortStableFunc(ports, func(a, b portEntry) int {
		if a.Proto != b.Proto {
			return int(a.Proto) - int(b.Proto)
		}
		return a.Addr.Compare(b.Addr)
	})
	for len(ports) > 0 {
		proto := ports[0].Proto
		n := 1
		for n < len(ports) && ports[n].Proto == proto {
			n++
		}
		group := make([]entry, n)
		for i, e := range ports[:n] {
			group[i] = e.entry
		}
		ports = ports[n:]
		name := protoName(proto)
		pl.dispatchNode(fmt.Sprintf("%s/%s/nodeports/%s", f, table, name), t, nodePorts, group, func(p netip.Prefix) []string {
			lo := portOf(p.Addr())
			hi := lo + 1<<(32-p.Bits()) - 1
			return []string{"-p", name, "-m", name, "--dport", fmt.Sprintf("%d:%d", lo, hi)}
		})
	}
}

// portKey is a node port as an address for the tree: 0.0.hi.lo, its
// last 16 bits the port.
func portKey(port int32) netip.Addr {
	return netip.AddrFrom4([4]byte{0, 0, byte(port >> 8), byte(port)})
}

// portOf is the port of a portKey (or of a prefix's first one).
func portOf(a netip.Addr) int {
	b := a.As4()
	return int(b[2])<<8 | int(b[3])
}

// dispatchNode fills the chain name with the rules sending the entries
// (sorted by key) on: split on the next stride bits after their longest
// common prefix, each group to a chain of its own (whose name hashes id
// and the group's prefix) matched by match(prefix), or the entries
// themselves in a leaf.
func (pl planner) dispatchNode(id string, t *tablePlan, name string, entries []entry, match func(netip.Prefix) []string) {
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
		// The child's prefix is what its keys share.
		cp, _ := group[0].Addr.Prefix(commonBits(group[0].Addr, group[len(group)-1].Addr))
		child := serviceChain(pl.prefix, kindDispatch, id+"/"+cp.String())
		t.chain(child)
		t.add(name, append(match(cp), "-j", child)...)
		pl.dispatchNode(id, t, child, group, match)
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
