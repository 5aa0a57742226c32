//go:build linux

package conntrack_test

import (
	"net/netip"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/backends/conntrack"
)

// A backend has just applied a round in which the UDP service
// 10.96.0.10:53 (node port 30053) lost its endpoint 10.1.0.2:5353, and the
// UDP service [fd00::20]:80, which had no endpoint, got one. It deletes
// the entries that would keep the clients' flows where their first
// datagrams went.
func Example() {
	removed := netip.MustParseAddrPort("10.1.0.2:5353")
	flows := []conntrack.Flow{
		// Flows to the service address, DNATed to the removed endpoint.
		{Proto: unix.IPPROTO_UDP, Dst: netip.MustParseAddrPort("10.96.0.10:53"), Endpoint: removed},
		// Flows to the node port, on any of the node's addresses.
		{Proto: unix.IPPROTO_UDP, Dst: netip.AddrPortFrom(netip.Addr{}, 30053), Endpoint: removed},
		// Flows that were not DNATed (rejected, no endpoint then).
		{IPv6: true, Proto: unix.IPPROTO_UDP, Dst: netip.MustParseAddrPort("[fd00::20]:80")},
	}
	// nil: the entries of this process's network namespace; for another
	// one, conntrack.InNetNS("/run/netns/node").
	deleted, err := conntrack.DeleteFlows(nil, flows)
	if err != nil {
		// The rules are right; only these flows lag until their entries
		// expire: log, do not fail the round.
		klog.ErrorS(err, "Cannot delete stale UDP conntrack entries", "flows", len(flows), "deleted", deleted)
	}
}
