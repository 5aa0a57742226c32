package userspace

import (
	"flag"
	"fmt"

	"sigs.k8s.io/kpng/backends/nodeflags"
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
	nodeflags.Node{
		ClusterCIDRs: &o.ClusterCIDRs, NodePortAddresses: &o.NodePortAddresses, NodeIPs: &o.NodeIPs,
		Usage: map[string]string{
			nodeflags.ClusterCIDR:       "comma-separated pod networks: with externalTrafficPolicy Local, clients inside them still reach every endpoint",
			nodeflags.NodePortAddresses: "comma-separated CIDRs: serve node ports only on the node's addresses inside them (default: every address but loopback and link-local ones)",
			nodeflags.NodeIP:            "comma-separated addresses node ports listen on, instead of those found on the node's interfaces",
		},
	}.Bind(fs)
	fs.DurationVar(&o.DialTimeout, "dial-timeout", o.DialTimeout, "how long one attempt to reach an endpoint may take")
	fs.DurationVar(&o.UDPIdleTimeout, "udp-idle-timeout", o.UDPIdleTimeout, "how long a UDP flow lives without traffic")
	fs.IntVar(&o.MaxConnectionsPerService, "max-connections-per-service", o.MaxConnectionsPerService, "the open TCP connections and UDP flows one service may have")
}

// BindFlags registers on fs the command-line flags of the proxier's
// options (Options.BindFlags): the flags `kpng … to-local to-userspace`
// takes besides its wiring ones (--name, --netns, --cleanup,
// --healthcheck). Call Validate after parsing.
func (c *Config) BindFlags(fs *flag.FlagSet) { c.Options.BindFlags(fs) }

// Validate reports the first setting of c that makes no sense, naming its
// flag.
func (c Config) Validate() error { return c.Options.Validate() }

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
