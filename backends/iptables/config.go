package iptables

import (
	"flag"
	"fmt"
	"time"

	"github.com/vishvananda/netlink"

	"sigs.k8s.io/kpng/backends/nodeflags"
)

// Config configures the iptables sink.
type Config struct {
	// ServiceProxyName is the proxier's service-proxy-name: its chains are
	// named ChainPrefix(ServiceProxyName) + ….
	ServiceProxyName string
	// Options shape the rules.
	Options Options
	// NetNS is the path of the network namespace to program
	// (/run/netns/x); empty: the current one.
	NetNS string
	// Variant is VariantAuto (or empty), VariantLegacy or VariantNFT.
	Variant string
	// Runner runs iptables-save and iptables-restore; nil:
	// ExecRunner{NetNS: NetNS}.
	Runner Runner
	// Conntrack returns a netlink handle for deleting stale UDP
	// conntrack entries; nil: one in NetNS.
	Conntrack func() (*netlink.Handle, error)
	// FullSyncPeriod is how often the sink rewrites every chain (and lists
	// them, and ensures the jumps) even if nothing failed: at a Sync, or
	// at the check of CheckPeriod when no Sync comes; 0 means
	// DefaultFullSyncPeriod.
	FullSyncPeriod time.Duration
	// CheckPeriod, if positive, is how often the sink checks its canary
	// chains (one rule in a chain of its own in the nat and filter tables
	// of each family, which nothing else touches) and the jumps from the
	// built-in chains: when one is gone, someone flushed or replaced the
	// tables or deleted the jump, and the sink rewrites everything at
	// once (or, in the middle of a round, at its Sync). The
	// same check runs the periodic full sync, and tries again a full sync
	// that failed. It runs until the context given to New ends; 0: there
	// is no check (DefaultCheckPeriod is the command's default).
	CheckPeriod time.Duration
	// AfterSync, if set, is called at the end of each sync (kpng's Syncs
	// and those the check makes) with its result, the sink's lock held:
	// it must not call the sink. cmd/kpng counts failed restores with it
	// (kube-proxy's sync_proxy_rules_iptables_restore_failures_total and
	// …_iptables_partial_restore_failures_total).
	AfterSync func(SyncResult)
	// NoMonitor turns off the monitor: by default, with iptables-nft
	// and the sink's own Runner (Runner nil), the sink listens in NetNS
	// for nftables' notifications of the changes others make to its
	// chains, to the jumps from the built-in chains, or to the nat and
	// filter tables whole (iptables -t nat -F, nft flush ruleset, …),
	// and rewrites every chain at once, not at the next check
	// (backends/nfmonitor: one repair per burst of changes, spaced out
	// with backoff while they keep coming, each counted by AfterSync
	// with a Repair). iptables-legacy sends no notifications: there, the
	// check of CheckPeriod (canary chains and jumps) is all.
	NoMonitor bool

	// monitorReceiveBuffer is the monitor socket's receive buffer
	// (nfmonitor.Config.ReceiveBuffer; 0: its default): tests make it
	// tiny so that notifications are lost.
	monitorReceiveBuffer int
}

// SyncResult describes one sync.
type SyncResult struct {
	// Full is true when every chain was written (the first sync, after a
	// Reset or a failure, and every FullSyncPeriod).
	Full bool
	// Restores is the number of iptables-restore runs that succeeded.
	Restores int
	// RestoreFailed is true when an iptables-restore run failed: its
	// table is unchanged, the sync stopped there (Err) and the next one
	// is a full one.
	RestoreFailed bool
	// Duration is the time spent planning and writing.
	Duration time.Duration
	// Err is the error of the sync, if it failed.
	Err error
	// Repair, when not empty, says why the periodic check (CheckPeriod)
	// or the monitor (a change made by another program, NoMonitor)
	// synced: it is not a Sync of kpng's.
	Repair string
}

// DefaultFullSyncPeriod is the period of full syncs when Config does not
// set one.
const DefaultFullSyncPeriod = time.Hour

// DefaultCheckPeriod is how often `to-local to-iptables` checks its
// canary chains (Config.CheckPeriod).
const DefaultCheckPeriod = 10 * time.Second

// BindFlags registers on fs the command-line flags of c, with c's current
// values as defaults (DefaultMasqueradeBit, VariantAuto and
// DefaultCheckPeriod where c leaves them zero): the node options
// (--cluster-cidr, --nodeport-addresses, --node-ip, --masquerade-all,
// --masquerade-bit, parsed by backends/nodeflags), --iptables (the
// variant), --check-period (--canary-period, its former name, is kept
// as a deprecated alias) and --monitor (Config.NoMonitor, inverted). They are what `kpng … to-local to-iptables`
// takes besides its wiring flags (--name, --netns, --cleanup,
// --healthcheck). Call Validate after parsing.
func (c *Config) BindFlags(fs *flag.FlagSet) {
	if c.Variant == "" {
		c.Variant = VariantAuto
	}
	if c.CheckPeriod == 0 {
		c.CheckPeriod = DefaultCheckPeriod
	}
	o := &c.Options
	nodeflags.Node{ClusterCIDRs: &o.ClusterCIDRs, NodePortAddresses: &o.NodePortAddresses, NodeIPs: &o.NodeIPs,
		MasqueradeAll: &o.MasqueradeAll, MasqueradeBit: &o.MasqueradeBit}.Bind(fs)
	fs.StringVar(&c.Variant, "iptables", c.Variant, "the iptables variant: legacy, nft, or auto (the one whose tables hold more rules, nft when none)")
	const checkUsage = "how often to check the canary chains and the jumps from the built-in chains (when one is gone, the tables were flushed or the jump deleted: every chain is rewritten); 0: never"
	fs.DurationVar(&c.CheckPeriod, "check-period", c.CheckPeriod, checkUsage)
	fs.DurationVar(&c.CheckPeriod, "canary-period", c.CheckPeriod, "deprecated: use --check-period")
	fs.Var(nodeflags.Not(&c.NoMonitor), "monitor", "with iptables-nft, listen for nftables' notifications of changes other programs make to the chains, their jumps or the tables, and rewrite every chain at once (false: only the periodic check repairs them)")
}

// Validate reports the first setting of c that cannot be used, naming its
// flag (the flags' parsers already refuse bad node options by name; set
// in code, they are named by their Options field).
func (c Config) Validate() error {
	switch c.Variant {
	case "", VariantAuto, VariantLegacy, VariantNFT:
	default:
		return fmt.Errorf("--iptables=%s: want auto, legacy or nft", c.Variant)
	}
	if c.CheckPeriod < 0 {
		return fmt.Errorf("--check-period=%v: must not be negative", c.CheckPeriod)
	}
	return c.Options.Validate()
}
