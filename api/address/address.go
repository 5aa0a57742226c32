// Package address parses the addresses of the kpng API: a unix socket
// ("unix:///run/kpng/kpng.sock" or "unix:relative.sock") or a TCP address
// ("tcp://host:port" or "host:port").
package address

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// DefaultSocket is where `kpng ... to-api` listens and backends connect by
// default.
const DefaultSocket = "unix:///var/run/kpng/kpng.sock"

// Address is a parsed API address.
type Address struct {
	// Network is "unix" or "tcp".
	Network string
	// Addr is the socket path or the host:port.
	Addr string
}

// String returns the address in the form Parse accepts.
func (a Address) String() string {
	if a.Network == "unix" {
		return "unix://" + a.Addr
	}
	return a.Addr
}

// Parse parses an API address.
func Parse(s string) (Address, error) {
	switch {
	case s == "":
		return Address{}, fmt.Errorf("empty API address")
	case strings.HasPrefix(s, "unix://"):
		return unix(strings.TrimPrefix(s, "unix://"), s)
	case strings.HasPrefix(s, "unix:"):
		return unix(strings.TrimPrefix(s, "unix:"), s)
	case strings.HasPrefix(s, "tcp://"):
		s = strings.TrimPrefix(s, "tcp://")
	case strings.Contains(s, "://"):
		return Address{}, fmt.Errorf("API address %q: unknown scheme (want unix:// or tcp://)", s)
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return Address{}, fmt.Errorf("API address %q: %w", s, err)
	}
	if port == "" {
		return Address{}, fmt.Errorf("API address %q: missing port", s)
	}
	return Address{Network: "tcp", Addr: net.JoinHostPort(host, port)}, nil
}

func unix(path, orig string) (Address, error) {
	if path == "" {
		return Address{}, fmt.Errorf("API address %q: empty socket path", orig)
	}
	return Address{Network: "unix", Addr: path}, nil
}

// IsLoopback reports whether a is a unix socket or a TCP address on a
// loopback IP or "localhost". An empty host (all interfaces) is not.
func (a Address) IsLoopback() bool {
	if a.Network == "unix" {
		return true
	}
	host, _, err := net.SplitHostPort(a.Addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}
