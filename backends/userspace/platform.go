package userspace

import (
	"net"
	"net/netip"
	"time"
)

// platform is what differs between operating systems: holding the
// service addresses on the proxier's interface, listing the node's
// addresses, and the network namespace the sockets are opened in. The
// rest of the package is the same everywhere.
type platform interface {
	// addAddress puts a on the proxier's interface (done already is
	// fine).
	addAddress(a netip.Addr) error
	// awaitLocal returns once the node delivers the packets to each of
	// addrs (added by addAddress) to its own sockets, or fails after a
	// bound.
	awaitLocal(addrs []netip.Addr) error
	// removeAddress takes a off the proxier's interface.
	removeAddress(a netip.Addr) error
	// nodeAddresses lists the node's unicast addresses on its other
	// interfaces, loopback and link-local ones excluded.
	nodeAddresses() ([]netip.Addr, error)
	// blackhole routes prefixes nowhere, replacing the prefixes given
	// before (and those a previous run left; nil: none): the addresses in
	// them that the proxier does not hold (its own are local, found
	// first) are dropped rather than routed out. The default proxier's
	// service CIDRs.
	blackhole(prefixes []netip.Prefix) error
	// in runs fn where the proxier's sockets live (its network
	// namespace on Linux, when Config.NetNS is set).
	in(fn func() error) error
	// close releases what the platform holds open; the interface and its
	// addresses stay (Cleanup removes them).
	close() error
}

// sockets opens the proxier's sockets through its platform.
type sockets struct{ plat platform }

// listenTCP listens on a.
func (s sockets) listenTCP(a netip.AddrPort) (*net.TCPListener, error) {
	var ln *net.TCPListener
	err := s.plat.in(func() (err error) {
		ln, err = net.ListenTCP(family("tcp", a.Addr()), net.TCPAddrFromAddrPort(a))
		return err
	})
	return ln, err
}

// listenUDP binds a.
func (s sockets) listenUDP(a netip.AddrPort) (*net.UDPConn, error) {
	var pc *net.UDPConn
	err := s.plat.in(func() (err error) {
		pc, err = net.ListenUDP(family("udp", a.Addr()), net.UDPAddrFromAddrPort(a))
		return err
	})
	return pc, err
}

// dialTCP connects to t within timeout.
func (s sockets) dialTCP(t netip.AddrPort, timeout time.Duration) (*net.TCPConn, error) {
	var c net.Conn
	err := s.plat.in(func() (err error) {
		d := net.Dialer{Timeout: timeout}
		c, err = d.Dial(family("tcp", t.Addr()), t.String())
		return err
	})
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

// dialUDP returns a UDP socket connected to t.
func (s sockets) dialUDP(t netip.AddrPort) (*net.UDPConn, error) {
	var c *net.UDPConn
	err := s.plat.in(func() (err error) {
		c, err = net.DialUDP(family("udp", t.Addr()), nil, net.UDPAddrFromAddrPort(t))
		return err
	})
	return c, err
}

// family returns network ("tcp", "udp") restricted to a's family.
func family(network string, a netip.Addr) string {
	if a.Is4() {
		return network + "4"
	}
	return network + "6"
}

// usableNodeAddress reports whether a is an address node ports may
// listen on: unicast, neither loopback nor link-local.
func usableNodeAddress(a netip.Addr) bool {
	return a.IsValid() && !a.IsLoopback() && !a.IsLinkLocalUnicast() && !a.IsMulticast() && !a.IsUnspecified()
}
