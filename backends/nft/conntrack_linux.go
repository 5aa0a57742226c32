//go:build linux

package nft

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// conntrackTimeout bounds each receive on the conntrack netlink socket, so
// that a stuck dump cannot block the sync.
const conntrackTimeout = 10 * time.Second

// flowKey is what a conntrack entry is matched on: protocol, original
// destination (address not valid: any) and reply source (not valid: the
// entry must not be DNATed).
type flowKey struct {
	proto    uint8
	dst      netip.AddrPort
	endpoint netip.AddrPort
}

// flowFilter is a netlink.CustomConntrackFilter matching the entries of a
// set of staleFlows of one family, in O(1) per entry whatever the number
// of flows.
type flowFilter map[flowKey]bool

// newFlowFilter returns the filter of the flows of family f; it is empty
// when there are none.
func newFlowFilter(flows []staleFlow, f ipFamily) flowFilter {
	ff := flowFilter{}
	for _, fl := range flows {
		proto, ok := l4proto(fl.Proto)
		if fl.Family != f || !ok {
			continue
		}
		ff[flowKey{proto: proto, dst: fl.Dst, endpoint: fl.Endpoint}] = true
	}
	return ff
}

// MatchConntrackFlow implements netlink.CustomConntrackFilter.
func (ff flowFilter) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
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

// deleteStaleFlows deletes the conntrack entries matching flows through
// h (one dump of the conntrack table per family that has flows) and
// returns how many it deleted.
func deleteStaleFlows(h *netlink.Handle, flows []staleFlow) (uint, error) {
	var deleted uint
	var errs []error
	for _, f := range []ipFamily{ipv4, ipv6} {
		ff := newFlowFilter(flows, f)
		if len(ff) == 0 {
			continue
		}
		n, err := h.ConntrackDeleteFilters(netlink.ConntrackTable, f.info().conntrack, ff)
		deleted += n
		if err != nil {
			errs = append(errs, fmt.Errorf("delete %s conntrack entries: %w", f, err))
		}
	}
	return deleted, errors.Join(errs...)
}

// newConntrackHandle returns a netlink handle for conntrack: from
// cfg.Conntrack, or in the current network namespace.
func newConntrackHandle(cfg Config) (*netlink.Handle, error) {
	var h *netlink.Handle
	var err error
	if cfg.Conntrack != nil {
		h, err = cfg.Conntrack()
	} else {
		h, err = netlink.NewHandle(unix.NETLINK_NETFILTER)
	}
	if err != nil {
		return nil, fmt.Errorf("conntrack netlink handle: %w", err)
	}
	if err := h.SetSocketTimeout(conntrackTimeout); err != nil {
		h.Close()
		return nil, fmt.Errorf("conntrack netlink handle: set timeout: %w", err)
	}
	return h, nil
}

// flushStaleFlows deletes the conntrack entries of the stale flows
// gathered since the last successful transaction. Errors are logged, never
// returned: the rules are in place, stale entries only delay them for the
// flows concerned until the entries expire.
func (s *sink) flushStaleFlows() {
	flows := s.staleFlows
	s.staleFlows = nil
	if len(flows) == 0 {
		return
	}
	start := time.Now()
	h, err := newConntrackHandle(s.cfg)
	if err != nil {
		klog.ErrorS(err, "Cannot delete stale UDP conntrack entries", "table", s.table, "flows", len(flows))
		return
	}
	defer h.Close()
	deleted, err := deleteStaleFlows(h, flows)
	if err != nil {
		klog.ErrorS(err, "Cannot delete stale UDP conntrack entries", "table", s.table, "flows", len(flows), "deleted", deleted)
	}
	klog.V(2).InfoS("Deleted stale UDP conntrack entries", "table", s.table, "flows", len(flows), "deleted", deleted, "duration", time.Since(start))
	if v := klog.V(4); v.Enabled() {
		for _, f := range flows {
			v.InfoS("Stale UDP conntrack flow", "table", s.table, "flow", f.String())
		}
	}
}
