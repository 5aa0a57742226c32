//go:build linux

package allip

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"sigs.k8s.io/kpng/model"
)

// ClearConntrack deletes the UDP conntrack entries whose original
// destination is one of addrs, and returns how many it deleted.
//
// NAT is decided on a connection's first packet and kept in its conntrack
// entry: changing the rules does not move existing flows. TCP flows end, but
// a UDP client that keeps its source port (DNS, QUIC, games) would keep
// talking to the former target, or to nothing, until the entry times out.
// This is what kube-proxy clears too. h is a netlink handle for the
// namespace to clean (netlink.NewHandle() for the current one).
func ClearConntrack(h *netlink.Handle, addrs []netip.Addr) (uint, error) {
	byFamily := map[netlink.InetFamily][]netlink.CustomConntrackFilter{}
	for _, a := range addrs {
		f := &netlink.ConntrackFilter{}
		if err := f.AddProtocol(unix.IPPROTO_UDP); err != nil {
			return 0, fmt.Errorf("conntrack filter: %w", err)
		}
		if err := f.AddIP(netlink.ConntrackOrigDstIP, net.IP(a.AsSlice())); err != nil {
			return 0, fmt.Errorf("conntrack filter for %s: %w", a, err)
		}
		fam := netlink.InetFamily(unix.AF_INET)
		if a.Is6() {
			fam = unix.AF_INET6
		}
		byFamily[fam] = append(byFamily[fam], f)
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
// rules, applies them in one transaction, then clears the UDP conntrack
// entries of the external addresses whose target changed. The error is not
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
	n, err := ClearConntrack(p.Conntrack, res.Changed)
	res.ConntrackDeleted = n
	return res, errors.Join(oldErr, err)
}
