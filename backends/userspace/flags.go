package userspace

import (
	"flag"
	"fmt"
	"net/netip"
	"strings"
)

// BindFlags registers on fs the command-line flags of o (--interface,
// --cluster-cidr, --nodeport-addresses, --node-ip, --dial-timeout,
// --udp-idle-timeout, --max-connections-per-service), with o's current
// values as defaults, for programs that run a proxier: `kpng … to-local
// to-userspace` and examples/userspace. Call Validate after parsing.
func (o *Options) BindFlags(fs *flag.FlagSet) {
	if o.DialTimeout == 0 {
		o.DialTimeout = DefaultDialTimeout
	}
	if o.UDPIdleTimeout == 0 {
		o.UDPIdleTimeout = DefaultUDPIdleTimeout
	}
	if o.MaxConnectionsPerService == 0 {
		o.MaxConnectionsPerService = DefaultMaxConnectionsPerService
	}
	fs.StringVar(&o.Interface, "interface", o.Interface, "the interface holding the service addresses (default kpng-<service-proxy-name>; created as a dummy interface on Linux, must exist on Windows)")
	fs.Func("cluster-cidr", "comma-separated pod networks: with externalTrafficPolicy Local, clients inside them still reach every endpoint", prefixList(&o.ClusterCIDRs))
	fs.Func("nodeport-addresses", "comma-separated CIDRs: serve node ports only on the node's addresses inside them (default: every address but loopback and link-local ones)", prefixList(&o.NodePortAddresses))
	fs.Func("node-ip", "comma-separated addresses node ports listen on, instead of those found on the node's interfaces", addrList(&o.NodeIPs))
	fs.DurationVar(&o.DialTimeout, "dial-timeout", o.DialTimeout, "how long one attempt to reach an endpoint may take")
	fs.DurationVar(&o.UDPIdleTimeout, "udp-idle-timeout", o.UDPIdleTimeout, "how long a UDP flow lives without traffic")
	fs.IntVar(&o.MaxConnectionsPerService, "max-connections-per-service", o.MaxConnectionsPerService, "the open TCP connections and UDP flows one service may have")
}

// Validate reports the first option that makes no sense, naming its flag.
func (o Options) Validate() error {
	switch {
	case o.DialTimeout < 0:
		return fmt.Errorf("--dial-timeout=%s: must not be negative", o.DialTimeout)
	case o.UDPIdleTimeout < 0:
		return fmt.Errorf("--udp-idle-timeout=%s: must not be negative", o.UDPIdleTimeout)
	case o.MaxConnectionsPerService < 0:
		return fmt.Errorf("--max-connections-per-service=%d: must not be negative", o.MaxConnectionsPerService)
	case o.DialAttempts < 0:
		return fmt.Errorf("DialAttempts=%d: must not be negative", o.DialAttempts)
	}
	return nil
}

// prefixList parses a comma-separated list of CIDRs into dst; a CIDR
// with host bits set is refused, as it is most likely a mistake.
func prefixList(dst *[]netip.Prefix) func(string) error {
	return func(list string) error {
		*dst = nil
		for _, s := range splitList(list) {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				return fmt.Errorf("%q is not a CIDR", s)
			}
			if p != p.Masked() {
				return fmt.Errorf("%q has host bits set (did you mean %s?)", s, p.Masked())
			}
			*dst = append(*dst, p)
		}
		return nil
	}
}

// addrList parses a comma-separated list of addresses into dst.
func addrList(dst *[]netip.Addr) func(string) error {
	return func(list string) error {
		*dst = nil
		for _, s := range splitList(list) {
			a, err := netip.ParseAddr(s)
			if err != nil || a.Zone() != "" {
				return fmt.Errorf("%q is not an IP address", s)
			}
			*dst = append(*dst, a.Unmap())
		}
		return nil
	}
}

// splitList returns the non-empty items of a comma-separated list.
func splitList(list string) []string {
	var out []string
	for _, s := range strings.Split(list, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
