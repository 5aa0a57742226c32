//go:build linux

package nft

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

// Config configures the nftables sink.
type Config struct {
	// ServiceProxyName is the proxier's service-proxy-name; the table is
	// TableName(ServiceProxyName).
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
	// AfterSync, if set, is called at the end of each Sync that sent a
	// transaction (or tried to), with its result.
	AfterSync func(SyncResult)
	// Context, if set, closes the sink's lasting netlink connection when
	// it ends (a later Sync opens another), and stops the checks of
	// CheckPeriod.
	Context context.Context
	// CheckPeriod, if positive, is how often the sink checks, between
	// rounds, that its table is as it left it: the table there, its fixed
	// chains (base, lookup, reject, masquerading) with their rules, and
	// checkChains of its service and endpoint chains in turn with theirs.
	// When someone deleted or flushed the table or a chain (nft delete
	// table, nft flush table, nft flush ruleset, ...), the sink rewrites
	// the whole table at once; a full rewrite that failed (kpng's or the
	// check's) is tried again too. The checks run until Context ends, so
	// they need one: without a Context, or with 0, there are none
	// (DefaultCheckPeriod is the command's default).
	CheckPeriod time.Duration
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
	// CheckPeriod) rewrote the table: it is not a Sync of kpng's.
	Repair string
}

// sink is the localsink.Sink of this package. kpng calls its methods one
// at a time; mu serializes them with the Context's closing the applier
// and with the periodic check. inRound is true between a round's first
// Reset or Update and its Sync, when the tracker is half-updated.
type sink struct {
	mu       sync.Mutex
	inRound  bool
	cfg      Config
	table    string
	tracker  *tracker
	applier  *applier
	needFull bool
	// applied is true once a transaction succeeded: the check has a
	// table to look at.
	applied bool
	// checkOrder are the regular chains the check counts the rules of,
	// checkChains at a time from checkPos on.
	checkOrder []string
	checkPos   int
	// changed counts the Updates of the round (for logs).
	changed int
	// staleFlows are the conntrack entries to delete after the next
	// successful transaction.
	staleFlows []staleFlow
}

// NewSink returns a localsink.Sink that programs the services it receives
// into the nftables table TableName(cfg.ServiceProxyName): the first Sync
// (and the first one after a Reset or a failure) replaces the whole table
// in one transaction, later ones send only what changed. A failed
// transaction changes nothing in the kernel; Sync returns its error, and
// the Sync that kpng calls again (localsink.Feeder) writes the whole table.
// NewSink checks that nftables can be used (listing the tables) before
// returning.
func NewSink(cfg Config) (localsink.Sink, error) {
	s := &sink{
		cfg:      cfg,
		table:    TableName(cfg.ServiceProxyName),
		tracker:  newTracker(cfg.Options),
		needFull: true,
	}
	ctxGiven := s.cfg.Context != nil
	if !ctxGiven {
		s.cfg.Context = context.Background()
	}
	if err := cfg.Options.Validate(); err != nil {
		return nil, fmt.Errorf("nftables backend: %w", err)
	}
	s.applier = newApplier(cfg.Conn, s.table)
	conn, err := s.applier.newConn()
	if err != nil {
		return nil, fmt.Errorf("nftables backend: %w", err)
	}
	if _, err := conn.ListTablesOfFamily(nftables.TableFamilyINet); err != nil {
		return nil, fmt.Errorf("nftables backend: list tables (root or CAP_NET_ADMIN needed): %w", err)
	}
	context.AfterFunc(s.cfg.Context, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.applier.Close()
	})
	if cfg.CheckPeriod > 0 && ctxGiven {
		go s.watch(cfg.CheckPeriod)
	}
	return s, nil
}

// Reset implements localsink.Sink: the round rebuilds the table from
// nothing, services in key order (on a conflict, the first service in
// key order has the address, as in every round).
func (s *sink) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inRound = true
	s.tracker = newTracker(s.cfg.Options)
	s.needFull = true
}

var _ localsink.ClusterSink = (*sink)(nil)

// SetCluster implements localsink.ClusterSink: the service CIDRs (given
// only to the cluster's default proxier) fill the service-cidrs sets, and
// the traffic to their addresses that no service took is dropped.
func (s *sink) SetCluster(c *model.Cluster) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inRound = true
	s.changed++
	for _, p := range s.tracker.SetCluster(c) {
		klog.InfoS("Part of the cluster facts cannot be programmed", "table", s.table, "problem", p.Error())
	}
}

// Update implements localsink.Sink: the tracker takes the service's new
// state; what cannot be programmed is reported by Problems.
func (s *sink) Update(key model.ServiceKey, _, cur *model.ServiceEndpoints) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inRound = true
	s.changed++
	s.tracker.Update(key, cur)
}

var _ localsink.ProblemReporter = (*sink)(nil)

// Problems implements localsink.ProblemReporter: the parts of the services
// held that are not in the table (a bad field, an address and port another
// service has, a protocol nftables is not given).
func (s *sink) Problems() []model.Problem { return s.tracker.Problems() }

// Sync implements localsink.Sink: it applies the round in one transaction.
func (s *sink) Sync() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inRound = false
	return s.sync("")
}

// sync applies what the tracker holds: the round's changes, or the whole
// table when needFull; repair says why the check rewrites the table (""
// for kpng's Syncs). mu is held.
func (s *sink) sync(repair string) error {
	start := time.Now()
	changed := s.changed
	s.changed = 0
	delta := s.tracker.done(!s.needFull)
	if !s.needFull && !s.applier.Fits(delta) {
		klog.V(2).InfoS("A hairpin or cluster-ips set outgrows its capacity: writing the table whole", "table", s.table)
		s.needFull = true
	}
	s.staleFlows = append(s.staleFlows, s.tracker.StaleFlows(delta)...)

	res := SyncResult{Full: s.needFull, Repair: repair}
	if s.needFull {
		res.Services = s.tracker.ServiceKeys()
		res.Stats, res.Err = s.applier.Full(s.tracker.Ruleset(s.table))
	} else {
		if delta.Len() == 0 {
			klog.V(4).InfoS("Nothing to change", "table", s.table, "services", changed)
			return nil
		}
		res.Services = delta.Services()
		res.Stats, res.Err = s.applier.Partial(delta)
	}
	res.Duration = time.Since(start)
	switch {
	case res.Err != nil && errors.Is(res.Err, unix.ENOBUFS):
		// The socket's receive buffer overran: the kernel's answers
		// are lost, the batch was applied whole or not at all (the
		// kernel applies it before answering). The next Sync rewrites
		// the table whole, which is right either way.
		s.needFull = true
		res.Err = fmt.Errorf("nftables table %s: the kernel's answers were lost, the transaction was applied whole or not at all (the whole table will be written on the next sync): %w", s.table, res.Err)
	case res.Err != nil:
		// Nothing of the transaction was applied: the table is as
		// before the round, the tracker ahead of it. The next Sync
		// rewrites it whole.
		s.needFull = true
		res.Err = fmt.Errorf("nftables table %s: transaction rejected, nothing of it applied (the whole table will be written on the next sync): %w", s.table, res.Err)
	default:
		s.needFull, s.applied = false, true
		klog.V(2).InfoS("nftables table synced", "table", s.table, "full", res.Full,
			"services", len(res.Services), "messages", res.Stats.Messages, "objects", res.Stats.Objects(), "duration", res.Duration)
		s.flushStaleFlows()
	}
	if s.cfg.AfterSync != nil {
		s.cfg.AfterSync(res)
	}
	return res.Err
}
