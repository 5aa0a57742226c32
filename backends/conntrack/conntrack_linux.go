//go:build linux

package conntrack

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Timeout bounds each receive on a handle made by NewHandle, so that a
// stuck dump cannot block a sync.
const Timeout = 10 * time.Second

// Flow selects conntrack entries: protocol Proto (an IP protocol number:
// 17 for UDP), original destination Dst (any address when Dst.Addr is not
// valid: node ports) and Dst's port, and reply source Endpoint — or, when
// Endpoint is not valid, a reply source equal to the original destination
// (the entry was not DNATed).
type Flow struct {
	// IPv6 is the family of the entries (Dst may have no address).
	IPv6 bool
	// Proto is the IP protocol number of the entries.
	Proto uint8
	// Dst is the service address and port the entries were sent to.
	Dst netip.AddrPort
	// Endpoint is the endpoint the entries were DNATed to; not valid:
	// entries that were not DNATed.
	Endpoint netip.AddrPort
}

// flowKey is what a conntrack entry is matched on.
type flowKey struct {
	proto    uint8
	dst      netip.AddrPort
	endpoint netip.AddrPort
}

// Filter is a netlink.CustomConntrackFilter matching the entries of a set
// of Flows of one family, in O(1) per entry whatever the number of flows.
type Filter map[flowKey]bool

// NewFilter returns the filter of the flows of one family (IPv6 or not);
// it is empty when there are none.
func NewFilter(flows []Flow, ipv6 bool) Filter {
	ff := Filter{}
	for _, fl := range flows {
		if fl.IPv6 != ipv6 {
			continue
		}
		ff[flowKey{proto: fl.Proto, dst: fl.Dst, endpoint: fl.Endpoint}] = true
	}
	return ff
}

// MatchConntrackFlow implements netlink.CustomConntrackFilter.
func (ff Filter) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	orig, ok1 := addrPort(flow.Forward.DstIP, flow.Forward.DstPort)
	reply, ok2 := addrPort(flow.Reverse.SrcIP, flow.Reverse.SrcPort)
	if !ok1 || !ok2 {
		return false
	}
	endpoint := reply
	if reply == orig {
		endpoint = netip.AddrPort{} // not DNATed
	}
	proto := flow.Forward.Protocol
	return ff[flowKey{proto, orig, endpoint}] ||
		ff[flowKey{proto, netip.AddrPortFrom(netip.Addr{}, orig.Port()), endpoint}]
}

// addrPort converts a conntrack tuple's address and port.
func addrPort(ip net.IP, port uint16) (netip.AddrPort, bool) {
	a, ok := netip.AddrFromSlice(ip)
	if !ok {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(a.Unmap(), port), true
}

// Delete deletes the conntrack entries matching flows through h (one
// dump of the conntrack table per family that has flows) and returns how
// many it deleted.
func Delete(h *netlink.Handle, flows []Flow) (uint, error) {
	var deleted uint
	var errs []error
	for _, f := range []struct {
		ipv6   bool
		family netlink.InetFamily
		name   string
	}{{false, unix.AF_INET, "IPv4"}, {true, unix.AF_INET6, "IPv6"}} {
		ff := NewFilter(flows, f.ipv6)
		if len(ff) == 0 {
			continue
		}
		n, err := h.ConntrackDeleteFilters(netlink.ConntrackTable, f.family, ff)
		deleted += n
		if err != nil {
			errs = append(errs, fmt.Errorf("delete %s conntrack entries: %w", f.name, err))
		}
	}
	return deleted, errors.Join(errs...)
}

// NewHandle returns a netlink handle for conntrack, from newHandle (nil:
// in the current network namespace), with Timeout set on its socket.
func NewHandle(newHandle func() (*netlink.Handle, error)) (*netlink.Handle, error) {
	var h *netlink.Handle
	var err error
	if newHandle != nil {
		h, err = newHandle()
	} else {
		h, err = netlink.NewHandle(unix.NETLINK_NETFILTER)
	}
	if err != nil {
		return nil, fmt.Errorf("conntrack netlink handle: %w", err)
	}
	if err := h.SetSocketTimeout(Timeout); err != nil {
		h.Close()
		return nil, fmt.Errorf("conntrack netlink handle: set timeout: %w", err)
	}
	return h, nil
}

// InNetNS returns a function making netlink handles for conntrack in the
// network namespace at path (/run/netns/NAME, /proc/PID/ns/net), for
// NewHandle and DeleteFlows: a backend programming another namespace than
// its own deletes that namespace's entries.
func InNetNS(path string) func() (*netlink.Handle, error) {
	return func() (*netlink.Handle, error) {
		ns, err := vnetns.GetFromPath(path)
		if err != nil {
			return nil, fmt.Errorf("network namespace %s: %w", path, err)
		}
		defer ns.Close()
		return netlink.NewHandleAt(ns, unix.NETLINK_NETFILTER)
	}
}

// DeleteFlows deletes the conntrack entries matching flows, through a
// handle from NewHandle(newHandle) (nil: this process's network
// namespace; InNetNS: another one) that it closes, and returns how many it
// deleted. It is what a backend calls after a round that removed
// endpoints of UDP services (or gave endpoints to a UDP service that had
// none), once its new rules are in place: one Flow per service address
// and port (Dst; no address for a node port) and removed endpoint
// (Endpoint; none for a service that had no endpoint, whose entries were
// not DNATed). Without it, a client that keeps sending from one source
// port keeps reaching the removed endpoint (or nothing) until its entry
// expires, which a client sending more often than the UDP timeout never
// lets happen; the conformance kit's udp-stale-flow scenario checks it.
// A failure is worth logging, not failing the round for: the rules are
// right, only the flows concerned lag until their entries expire.
func DeleteFlows(newHandle func() (*netlink.Handle, error), flows []Flow) (uint, error) {
	if len(flows) == 0 {
		return 0, nil
	}
	h, err := NewHandle(newHandle)
	if err != nil {
		return 0, err
	}
	defer h.Close()
	return Delete(h, flows)
}
