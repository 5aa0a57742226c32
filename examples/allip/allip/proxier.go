//go:build linux

package allip

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"sigs.k8s.io/kpng/model"
)

// ClearConntrack deletes the stale UDP conntrack entries of the external
// addresses addrs, given the rules now installed, and returns how many it
// deleted. For an address with a rule, the stale entries are those whose
// reply does not come from the rule's target: flows to a former target, or
// not DNATed at all. For an address without a rule, all its entries are.
//
// NAT is decided on a connection's first packet and kept in its conntrack
// entry: changing the rules does not move existing flows. TCP flows end, but
// a UDP client that keeps its source port (DNS, QUIC, games) would keep
// talking to the former target, or to nothing, until the entry times out.
// This is what kube-proxy clears too, and, as kube-proxy, ClearConntrack
// keeps the entries already DNATed to the new target: deleting one would
// only lose its replies in flight (a reply without its entry is not
// un-DNATed, and the client drops it). h is a netlink handle for the
// namespace to clean (netlink.NewHandle() for the current one).
func ClearConntrack(h *netlink.Handle, addrs []netip.Addr, rules []Rule) (uint, error) {
	targets := map[netip.Addr]netip.Addr{}
	for _, r := range rules {
		targets[r.External] = r.Target
	}
	byFamily := map[netlink.InetFamily][]netlink.CustomConntrackFilter{}
	for _, a := range addrs {
		fam := netlink.InetFamily(unix.AF_INET)
		if a.Is6() {
			fam = unix.AF_INET6
		}
		byFamily[fam] = append(byFamily[fam], staleUDP{external: a, target: targets[a]})
	}
	var total uint
	for fam, filters := range byFamily {
		n, err := h.ConntrackDeleteFilters(netlink.ConntrackTable, fam, filters...)
		total += n
		if err != nil {
			return total, fmt.Errorf("conntrack: delete UDP entries of %d addresses: %w", len(filters), err)
		}
	}
	return total, nil
}

// staleUDP matches the UDP conntrack entries whose original destination is
// external and whose reply source is not target (any reply source if target
// is not valid).
type staleUDP struct {
	external, target netip.Addr
}

// MatchConntrackFlow implements netlink.CustomConntrackFilter.
func (f staleUDP) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	if flow.Forward.Protocol != unix.IPPROTO_UDP {
		return false
	}
	dst, ok := netip.AddrFromSlice(flow.Forward.DstIP)
	if !ok || dst.Unmap() != f.external {
		return false
	}
	if !f.target.IsValid() {
		return true
	}
	reply, ok := netip.AddrFromSlice(flow.Reverse.SrcIP)
	return !ok || reply.Unmap() != f.target
}

// Proxier applies states to one network namespace.
type Proxier struct {
	// NFT is the nftables connection to the namespace.
	NFT *nftables.Conn
	// Conntrack is a netlink handle to the namespace, used to clear stale
	// UDP conntrack entries; nil leaves conntrack alone.
	Conntrack *netlink.Handle
}

// Result says what one Sync did.
type Result struct {
	// Rules are the rules now installed.
	Rules []Rule
	// Problems are the parts of the state that were skipped (see Rules).
	Problems []error
	// Changed are the external addresses whose target changed.
	Changed []netip.Addr
	// ConntrackDeleted is the number of conntrack entries cleared.
	ConntrackDeleted uint
}

// Sync makes the namespace's rules those of the state: it computes the
// rules, applies them in one transaction, then clears the stale UDP
// conntrack entries of the external addresses whose target changed (see
// ClearConntrack). The error is not
// nil only if the rules could not be applied (the previous rules then stay)
// or conntrack could not be cleared; problems in the state are reported in
// the Result.
func (p *Proxier) Sync(items []*model.ServiceEndpoints) (Result, error) {
	var res Result
	res.Rules, res.Problems = Rules(items)
	old, oldErr := Current(p.NFT)
	if oldErr != nil {
		oldErr = fmt.Errorf("rules applied, but the previous ones could not be read, so conntrack was cleared for every current address: %w", oldErr)
	}
	if err := Apply(p.NFT, res.Rules); err != nil {
		return res, err
	}
	if p.Conntrack == nil {
		return res, nil
	}
	if oldErr != nil {
		// Unknown previous rules: every address may have changed.
		old = nil
		for _, r := range res.Rules {
			old = append(old, Rule{External: r.External})
		}
	}
	res.Changed = Changed(old, res.Rules)
	if len(res.Changed) == 0 {
		return res, oldErr
	}
	n, err := ClearConntrack(p.Conntrack, res.Changed, res.Rules)
	res.ConntrackDeleted = n
	return res, errors.Join(oldErr, err)
}
