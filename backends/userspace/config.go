package userspace

import (
	"fmt"
	"hash/fnv"
	"net/netip"
	"time"
)

// Defaults of Options.
const (
	// DefaultDialTimeout bounds one connection attempt to an endpoint.
	DefaultDialTimeout = time.Second
	// DefaultDialAttempts is how many endpoints a new TCP connection
	// tries before it is closed.
	DefaultDialAttempts = 3
	// DefaultUDPIdleTimeout ends a UDP flow without traffic (the kernel's
	// nf_conntrack_udp_timeout).
	DefaultUDPIdleTimeout = 30 * time.Second
	// DefaultMaxConnectionsPerService caps the open TCP connections and
	// UDP flows of one service.
	DefaultMaxConnectionsPerService = 10000
)

// Config configures the userspace proxier.
type Config struct {
	// ServiceProxyName is the proxier's service-proxy-name; it names the
	// interface holding the service addresses (InterfaceName).
	ServiceProxyName string
	// Options shape the proxying.
	Options Options
	// NetNS, if set, is the path of the network namespace (/run/netns/x)
	// where the proxier listens, dials and holds its addresses, instead of
	// the current one (Linux only).
	NetNS string
}

// Options are what a proxier is told about its node and its limits.
type Options struct {
	// Interface is the interface that holds the service addresses
	// (cluster, external and load-balancer IPs). On Linux the proxier
	// creates it as a dummy interface when it is missing; on Windows it
	// must exist (a loopback adapter). Empty means
	// InterfaceName(ServiceProxyName).
	Interface string
	// NodePortAddresses restricts node ports to the node's addresses
	// inside these prefixes (kube-proxy's --nodeport-addresses); empty
	// means every address of the node but loopback and link-local ones.
	NodePortAddresses []netip.Prefix
	// NodeIPs, if set, are the addresses node ports listen on instead of
	// those found on the node's interfaces; they are also the node's own
	// addresses for the Local-policy short-circuits and source ranges.
	NodeIPs []netip.Addr
	// ClusterCIDRs are the pods' networks: with the Local external
	// traffic policy, clients inside them (and the node itself) still
	// reach every endpoint, as with kube-proxy.
	ClusterCIDRs []netip.Prefix
	// DialTimeout bounds one attempt to reach an endpoint (default
	// DefaultDialTimeout).
	DialTimeout time.Duration
	// DialAttempts is how many endpoints a TCP connection tries, each
	// after the previous failed (default DefaultDialAttempts).
	DialAttempts int
	// UDPIdleTimeout ends a UDP flow without traffic either way (default
	// DefaultUDPIdleTimeout).
	UDPIdleTimeout time.Duration
	// MaxConnectionsPerService caps the TCP connections and UDP flows of
	// one service; beyond it new TCP connections are reset and new UDP
	// flows dropped (default DefaultMaxConnectionsPerService).
	MaxConnectionsPerService int
}

// withDefaults returns o with its zero values replaced by the defaults.
func (o Options) withDefaults(serviceProxyName string) Options {
	if o.Interface == "" {
		o.Interface = InterfaceName(serviceProxyName)
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = DefaultDialTimeout
	}
	if o.DialAttempts <= 0 {
		o.DialAttempts = DefaultDialAttempts
	}
	if o.UDPIdleTimeout <= 0 {
		o.UDPIdleTimeout = DefaultUDPIdleTimeout
	}
	if o.MaxConnectionsPerService <= 0 {
		o.MaxConnectionsPerService = DefaultMaxConnectionsPerService
	}
	return o
}

// maxInterfaceName is the longest interface name Linux takes (IFNAMSIZ
// less the terminating NUL).
const maxInterfaceName = 15

// InterfaceName is the default interface of the proxier named
// serviceProxyName: "kpng-" and the name, or, when that is longer than an
// interface name may be, "kpng-" and 10 hex digits of the name's hash.
func InterfaceName(serviceProxyName string) string {
	if n := "kpng-" + serviceProxyName; len(n) <= maxInterfaceName && serviceProxyName != "" {
		return n
	}
	h := fnv.New64a()
	h.Write([]byte(serviceProxyName))
	return fmt.Sprintf("kpng-%010x", h.Sum64()&0xffffffffff)
}
