//go:build linux

package netns

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

// Answer is what an identity server replied to one request.
type Answer struct {
	// Server is the identity the server was started with (e.g. "pod").
	Server string
	// Network is "tcp" or "udp".
	Network string
	// Local is the address and port the server was reached on: the
	// destination after any DNAT.
	Local netip.AddrPort
	// Remote is the client's address and port as the server saw it: the
	// source after any SNAT.
	Remote netip.AddrPort
}

// String returns the answer in the form the servers send it.
func (a Answer) String() string {
	return fmt.Sprintf("id=%s net=%s local=%s remote=%s", a.Server, a.Network, a.Local, a.Remote)
}

// ParseAnswer parses a server's reply (the form of Answer.String, with or
// without a trailing newline).
func ParseAnswer(s string) (Answer, error) {
	var a Answer
	fields := strings.Fields(s)
	if len(fields) != 4 {
		return a, fmt.Errorf("malformed answer %q", s)
	}
	for _, f := range fields {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return a, fmt.Errorf("malformed answer %q", s)
		}
		var err error
		switch k {
		case "id":
			a.Server = v
		case "net":
			a.Network = v
		case "local":
			a.Local, err = netip.ParseAddrPort(v)
		case "remote":
			a.Remote, err = netip.ParseAddrPort(v)
		default:
			err = fmt.Errorf("unknown field %q", k)
		}
		if err != nil {
			return a, fmt.Errorf("malformed answer %q: %w", s, err)
		}
	}
	return a, nil
}

// Serve starts identity servers in the namespace: for each address and
// port, a TCP listener that reads one request line on every connection,
// answers with one Answer line and closes it, and a UDP socket that replies one Answer datagram to every
// datagram it receives. The addresses must be configured in the namespace.
// The servers stop when the test ends.
func (n *NS) Serve(id string, addrs []netip.Addr, ports []uint16) {
	n.t.Helper()
	var closers []func() error
	var wg sync.WaitGroup
	stop := func() {
		for _, c := range closers {
			_ = c()
		}
		wg.Wait()
	}
	err := n.Do(func() error {
		for _, a := range addrs {
			for _, p := range ports {
				ap := netip.AddrPortFrom(a, p)
				ln, err := net.Listen("tcp", ap.String())
				if err != nil {
					return fmt.Errorf("listen tcp %s: %w", ap, err)
				}
				closers = append(closers, ln.Close)
				wg.Add(1)
				go func() { defer wg.Done(); serveTCP(id, ln) }()

				pc, err := net.ListenPacket("udp", ap.String())
				if err != nil {
					return fmt.Errorf("listen udp %s: %w", ap, err)
				}
				closers = append(closers, pc.Close)
				wg.Add(1)
				go func() { defer wg.Done(); serveUDP(id, pc, ap) }()
			}
		}
		return nil
	})
	if err != nil {
		stop()
		n.t.Fatalf("serve in %s: %v", n.Name, err)
	}
	n.t.Cleanup(stop)
}

func serveTCP(id string, ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		go func() {
			defer c.Close()
			a := Answer{
				Server:  id,
				Network: "tcp",
				Local:   c.LocalAddr().(*net.TCPAddr).AddrPort(),
				Remote:  c.RemoteAddr().(*net.TCPAddr).AddrPort(),
			}
			// Read the request first: closing with unread data would
			// send a reset, which may destroy the answer in flight.
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
				return
			}
			_, _ = fmt.Fprintln(c, unmapped(a))
		}()
	}
}

func serveUDP(id string, pc net.PacketConn, local netip.AddrPort) {
	buf := make([]byte, 2048)
	for {
		_, from, err := pc.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		a := Answer{Server: id, Network: "udp", Local: local, Remote: from.(*net.UDPAddr).AddrPort()}
		_, _ = pc.WriteTo([]byte(unmapped(a).String()+"\n"), from)
	}
}

// unmapped turns IPv4-mapped IPv6 addresses into IPv4 ones.
func unmapped(a Answer) Answer {
	a.Local = netip.AddrPortFrom(a.Local.Addr().Unmap(), a.Local.Port())
	a.Remote = netip.AddrPortFrom(a.Remote.Addr().Unmap(), a.Remote.Port())
	return a
}

// DefaultTimeout is how long Ask waits for an answer when no timeout is
// given.
const DefaultTimeout = 2 * time.Second

// AskOptions tune Ask.
type AskOptions struct {
	// Timeout bounds the whole exchange; 0 means DefaultTimeout.
	Timeout time.Duration
	// LocalPort, if not 0, is the client's source port (to reuse one
	// conntrack entry across calls, for instance).
	LocalPort uint16
	// LocalAddr, if valid, is the client's source address (one of the
	// namespace's own).
	LocalAddr netip.Addr
}

// Ask connects from the namespace to dst over network ("tcp" or "udp"),
// sends a request and returns the parsed answer of the identity server that
// replied, or an error (a timeout, a refused connection, an unreachable
// network) when none did.
func (n *NS) Ask(network string, dst netip.AddrPort, opts AskOptions) (Answer, error) {
	timeout := opts.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	var reply string
	err := n.Do(func() error {
		d := net.Dialer{Timeout: timeout}
		if opts.LocalPort != 0 || opts.LocalAddr.IsValid() {
			var ip net.IP
			if opts.LocalAddr.IsValid() {
				ip = opts.LocalAddr.AsSlice()
			}
			switch network {
			case "tcp":
				d.LocalAddr = &net.TCPAddr{IP: ip, Port: int(opts.LocalPort)}
			case "udp":
				d.LocalAddr = &net.UDPAddr{IP: ip, Port: int(opts.LocalPort)}
			}
		}
		c, err := d.Dial(network, dst.String())
		if err != nil {
			return err
		}
		defer c.Close()
		if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
			return err
		}
		if _, err := c.Write([]byte("who are you?\n")); err != nil {
			return err
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return err
		}
		reply = line
		return nil
	})
	if err != nil {
		return Answer{}, fmt.Errorf("%s from %s to %s: %w", network, n.Name, dst, err)
	}
	a, err := ParseAnswer(reply)
	if err != nil {
		return Answer{}, fmt.Errorf("%s from %s to %s: %w", network, n.Name, dst, err)
	}
	return a, nil
}

// ServeEcho serves, in the namespace on TCP port, an echo that answers each
// line with "echo " and the line, for as long as the connection lasts (to
// check that an open connection keeps working), until t ends.
func (n *NS) ServeEcho(t testing.TB, port uint16) {
	t.Helper()
	var ln net.Listener
	if err := n.Do(func() (err error) { ln, err = net.Listen("tcp", fmt.Sprintf(":%d", port)); return err }); err != nil {
		t.Fatalf("echo server in %s: %v", n, err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte("echo " + line)); err != nil {
						return
					}
				}
			}()
		}
	}()
}
