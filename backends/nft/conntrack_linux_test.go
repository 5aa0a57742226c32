//go:build linux

package nft

import (
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"

	"sigs.k8s.io/kpng/backends/conntrack"
	"sigs.k8s.io/kpng/model"
)

// ctFlow is a conntrack entry: original direction src -> dst, replied to
// by reply (the endpoint, or dst when not DNATed).
func ctFlow(proto uint8, src, dst, reply string) *netlink.ConntrackFlow {
	s, d, r := netip.MustParseAddrPort(src), netip.MustParseAddrPort(dst), netip.MustParseAddrPort(reply)
	ip := func(a netip.Addr) net.IP { return net.IP(a.AsSlice()) }
	return &netlink.ConntrackFlow{
		Forward: netlink.IPTuple{Protocol: proto, SrcIP: ip(s.Addr()), SrcPort: s.Port(), DstIP: ip(d.Addr()), DstPort: d.Port()},
		Reverse: netlink.IPTuple{Protocol: proto, SrcIP: ip(r.Addr()), SrcPort: r.Port(), DstIP: ip(s.Addr()), DstPort: s.Port()},
	}
}

// TestFlowFilter checks the flows as the shared conntrack package
// receives them (conntrackFlows) and matches them.
func TestFlowFilter(t *testing.T) {
	flows := []staleFlow{
		staleTo("10.96.0.10:53", "10.1.0.2:5353"),
		staleUnNATed("10.96.0.20:80"),
		staleTo("[fd00::10]:53", "[fd01::2]:5353"),
		{Family: ipv4, Proto: model.UDP, Dst: netip.AddrPortFrom(netip.Addr{}, 30053), Endpoint: netip.MustParseAddrPort("10.1.0.3:53")},
	}
	v4, v6 := conntrack.NewFilter(conntrackFlows(flows), false), conntrack.NewFilter(conntrackFlows(flows), true)
	for _, tc := range []struct {
		name   string
		filter conntrack.Filter
		flow   *netlink.ConntrackFlow
		want   bool
	}{
		{"DNATed to the removed endpoint", v4, ctFlow(17, "10.0.0.1:4000", "10.96.0.10:53", "10.1.0.2:5353"), true},
		{"DNATed to another endpoint", v4, ctFlow(17, "10.0.0.1:4000", "10.96.0.10:53", "10.1.0.3:5353"), false},
		{"another port of the endpoint", v4, ctFlow(17, "10.0.0.1:4000", "10.96.0.10:53", "10.1.0.2:5354"), false},
		{"TCP", v4, ctFlow(6, "10.0.0.1:4000", "10.96.0.10:53", "10.1.0.2:5353"), false},
		{"not DNATed, address that had no endpoints", v4, ctFlow(17, "10.0.0.1:4000", "10.96.0.20:80", "10.96.0.20:80"), true},
		{"DNATed, address that had no endpoints", v4, ctFlow(17, "10.0.0.1:4000", "10.96.0.20:80", "10.1.0.2:8080"), false},
		{"IPv6", v6, ctFlow(17, "[fd00::1]:4000", "[fd00::10]:53", "[fd01::2]:5353"), true},
		{"IPv6 flow, IPv4 filter", v4, ctFlow(17, "[fd00::1]:4000", "[fd00::10]:53", "[fd01::2]:5353"), false},
		{"any address of a port", v4, ctFlow(17, "10.0.0.1:4000", "192.168.1.5:30053", "10.1.0.3:53"), true},
		{"any address, other endpoint", v4, ctFlow(17, "10.0.0.1:4000", "192.168.1.5:30053", "10.1.0.2:53"), false},
	} {
		if got := tc.filter.MatchConntrackFlow(tc.flow); got != tc.want {
			t.Errorf("%s: match = %v, want %v", tc.name, got, tc.want)
		}
	}
}
