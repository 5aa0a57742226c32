//go:build linux

package nft

import (
	"flag"
	"fmt"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"sigs.k8s.io/kpng/backends/nodeflags"
	"sigs.k8s.io/kpng/model"
)

// The Config is Linux's only: its Conn is a google/nftables connection,
// a package that builds on Linux only.

// Config configures the nftables sink.
type Config struct {
	// ServiceProxyName is the proxier's service-proxy-name; the tables
	// (ip and ip6) are named TableName(ServiceProxyName).
	ServiceProxyName string
	// Options shape the rules: masquerading, node port addresses.
	Options Options
	// Conn returns a new nftables connection with the options given
	// added to its own; nil means nftables.New, in the current network
	// namespace (to work in another one, pass a function calling
	// nftables.New with nftables.WithNetNSFd(fd) and the options:
	// ConnInNetNS). The sink writes its transactions through a socket of
	// its own in the connection's namespace (its NetNS), or through the
	// connection's TestDial if it has one, adding to them what
	// google/nftables cannot write (the typeof declarations of its maps):
	// the connection must not be lasting (nftables.AsLasting), whose
	// socket would bypass that.
	Conn func(...nftables.ConnOption) (*nftables.Conn, error)
	// Conntrack returns a new netlink handle for deleting, after a
	// transaction, the UDP conntrack entries it made stale (flows DNATed
	// to an endpoint a service no longer uses, or not DNATed while it
	// had none, which would otherwise keep their old path); the sink
	// closes it after use. nil means
	// netlink.NewHandle(unix.NETLINK_NETFILTER), in the current network
	// namespace: set it with Conn when working in another one
	// (netlink.NewHandleAt).
	Conntrack func() (*netlink.Handle, error)
	// AfterSync, if set, is called at the end of each sync that sent a
	// transaction (or tried to: kpng's Syncs and the check's repairs),
	// with its result, the sink's lock held: it must not call the sink.
	// cmd/kpng counts failures with it
	// (sync_proxy_rules_nftables_sync_failures_total).
	AfterSync func(SyncResult)
	// CheckPeriod, if positive, is how often the sink checks, between
	// rounds, that its tables are as it left them: each there, its fixed
	// chains (base, lookup, reject, masquerading) with their rules, and
	// checkChains of its service and endpoint chains in turn with theirs.
	// When someone deleted or flushed a table or a chain (nft delete
	// table, nft flush table, nft flush ruleset, ...), the sink rewrites
	// the whole tables at once; a full rewrite that failed (kpng's or the
	// check's) is tried again too. The checks run until the context given
	// to New ends; 0: there are none (DefaultCheckPeriod is the command's
	// default).
	CheckPeriod time.Duration
	// NoMonitor turns off the monitor: by default the sink listens, in
	// its connections' namespace, for nftables' notifications of the
	// changes others make to its tables (nft flush ruleset, nft delete
	// table, a chain or rule deleted or added, …) and rewrites the tables
	// at once, not at the next check (backends/nfmonitor: one repair
	// per burst of changes, spaced out with backoff while they keep
	// coming, each counted by AfterSync with a Repair). The check of
	// CheckPeriod stays for what notifications miss; a connection with a
	// TestDial has no monitor.
	NoMonitor bool

	// monitorReceiveBuffer is the monitor socket's receive buffer
	// (nfmonitor.Config.ReceiveBuffer; 0: its default): tests make it
	// tiny so that notifications are lost.
	monitorReceiveBuffer int
	// muteObjects is the size, in objects, from which a transaction is
	// sent with the monitor muted (applier.muteObjects; 0:
	// defaultMuteObjects): tests make every transaction muted.
	muteObjects int
}

// SyncResult describes one transaction of a Sync.
type SyncResult struct {
	// Full is true when the whole table was rewritten (first sync, after
	// a Reset or after a failed transaction).
	Full bool
	// Services are the services whose objects changed (for a full sync:
	// every service held).
	Services []model.ServiceKey
	// Stats is the size of the transaction.
	Stats Stats
	// Duration is the time spent computing and sending it.
	Duration time.Duration
	// Err is the error of the transaction, if it failed: then nothing of it
	// was applied and the next Sync is a full one.
	Err error
	// Repair, when not empty, says why the periodic check (Config.
	// CheckPeriod) or the monitor (a change made by another program,
	// Config.NoMonitor) rewrote the tables: it is not a Sync of kpng's.
	Repair string
}

// BindFlags registers on fs the command-line flags of c, with c's current
// values as defaults (DefaultMasqueradeBit and DefaultCheckPeriod where c
// leaves them zero): the node options (--cluster-cidr,
// --nodeport-addresses, --node-ip, --masquerade-all, --masquerade-bit,
// parsed by backends/nodeflags), --ignore-headless, --shard-maps
// (Options.NoShardMaps, inverted), --check-period and --monitor
// (Config.NoMonitor, inverted).
// They are what `kpng … to-local to-nft` takes besides its wiring flags
// (--name, --netns, --cleanup, --healthcheck). Call Validate after
// parsing.
func (c *Config) BindFlags(fs *flag.FlagSet) {
	if c.CheckPeriod == 0 {
		c.CheckPeriod = DefaultCheckPeriod
	}
	o := &c.Options
	nodeflags.Node{ClusterCIDRs: &o.ClusterCIDRs, NodePortAddresses: &o.NodePortAddresses, NodeIPs: &o.NodeIPs,
		MasqueradeAll: &o.MasqueradeAll, MasqueradeBit: &o.MasqueradeBit}.Bind(fs)
	fs.BoolVar(&o.IgnoreHeadless, "ignore-headless", o.IgnoreHeadless, "do not serve the external and load-balancer IPs of headless services (kube-proxy ignores headless services; by default they are served: the blog's all-IP case)")
	fs.Var(nodeflags.Not(&o.NoShardMaps), "shard-maps", "serve plain service ports (a cluster IP only, no affinity, up to 64 endpoints) from shared shard maps, one per number of endpoints, so that adding, changing or deleting a service is set elements only (false: a chain per service port and interval elements per endpoint, a dearer cold start and service added)")
	fs.DurationVar(&c.CheckPeriod, "check-period", c.CheckPeriod, "how often to check that the tables (ip and ip6) are as kpng left them (when one was deleted or flushed, or a chain was, they are rewritten whole); 0: never")
	fs.Var(nodeflags.Not(&c.NoMonitor), "monitor", "listen for nftables' notifications of changes other programs make to the tables (ip and ip6), and rewrite them at once (false: only the periodic check repairs them)")
}

// Validate reports the first setting of c that cannot be used, naming its
// flag (the flags' parsers already refuse bad node options by name; set
// in code, they are named by their Options field).
func (c Config) Validate() error {
	if c.CheckPeriod < 0 {
		return fmt.Errorf("--check-period=%v: must not be negative", c.CheckPeriod)
	}
	return c.Options.Validate()
}
