//go:build linux

package nft

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/backends/periodic"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

// Sink is the nftables backend's localsink.Sink (also a
// localsink.ClusterSink and a localsink.ProblemReporter): it programs the
// services it receives into its table (New). kpng calls its methods one
// at a time; mu serializes them with the context's closing the applier
// and with the periodic check. inRound is true between a round's first
// Reset or Update and its Sync, when the tracker is half-updated.
type Sink struct {
	mu      sync.Mutex
	inRound bool
	cfg     Config
	// ctx is the context given to New, logger its logger.
	ctx      context.Context
	logger   klog.Logger
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
	// own are the port IDs of the sockets of the sink's transactions,
	// which its monitor does not repair (monitor_linux.go).
	own ownPorts
	// checkAfterRound says that notifications were lost during a round:
	// the whole table is checked after its Sync (monitor_linux.go).
	checkAfterRound bool
	// monitored, if set (by tests), is called with mu held when a
	// repair or a check of the monitor's is taken in.
	monitored func()
}

// buildMu serializes the transactions of all the sinks of the process
// (Sink.sync).
var buildMu sync.Mutex

// New returns a sink that programs the services it receives into the
// nftables table TableName(cfg.ServiceProxyName): the first Sync (and the
// first one after a Reset or a failure) replaces the whole table in one
// transaction, later ones send only what changed. A failed transaction
// changes nothing in the kernel; Sync returns its error, and the Sync
// that kpng calls again (localsink.Feeder) writes the whole table. New
// checks that nftables can be used (listing the tables) before returning.
// When ctx ends, the sink's lasting netlink connection is closed (a later
// Sync opens another) and the checks of cfg.CheckPeriod stop; the sink
// logs through ctx's logger (klog.FromContext).
func New(ctx context.Context, cfg Config) (*Sink, error) {
	if err := cfg.Options.Validate(); err != nil {
		return nil, fmt.Errorf("nftables backend: %w", err)
	}
	if cfg.CheckPeriod < 0 {
		return nil, fmt.Errorf("nftables backend: CheckPeriod %v: must not be negative", cfg.CheckPeriod)
	}
	s := &Sink{
		cfg:      cfg,
		ctx:      ctx,
		logger:   klog.FromContext(ctx),
		table:    TableName(cfg.ServiceProxyName),
		tracker:  newTracker(cfg.Options),
		needFull: true,
	}
	s.applier = newApplier(cfg.Conn, s.table)
	s.applier.dialed = s.own.add
	conn, err := s.applier.newConn()
	if err != nil {
		return nil, fmt.Errorf("nftables backend: %w", err)
	}
	if _, err := conn.ListTablesOfFamily(nftables.TableFamilyINet); err != nil {
		return nil, fmt.Errorf("nftables backend: list tables (root or CAP_NET_ADMIN needed): %w", err)
	}
	context.AfterFunc(ctx, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.applier.Close()
	})
	periodic.Start(ctx, cfg.CheckPeriod, s.check)
	if !cfg.NoMonitor && conn.TestDial == nil {
		if err := s.startMonitor(ctx, conn.NetNS); err != nil {
			return nil, fmt.Errorf("nftables backend: %w", err)
		}
	}
	return s, nil
}

// Reset implements localsink.Sink: the round rebuilds the table from
// nothing, services in key order (on a conflict, the first service in
// key order has the address, as in every round).
func (s *Sink) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inRound = true
	s.tracker = newTracker(s.cfg.Options)
	s.needFull = true
}

var _ localsink.ClusterSink = (*Sink)(nil)

// SetCluster implements localsink.ClusterSink: the service CIDRs (given
// only to the cluster's default proxier): the traffic to their addresses
// that no service took is dropped (cluster-ips-check).
func (s *Sink) SetCluster(c *model.Cluster) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inRound = true
	s.changed++
	for _, p := range s.tracker.SetCluster(c) {
		s.logger.Info("Part of the cluster facts cannot be programmed", "table", s.table, "problem", p.Error())
	}
}

// Update implements localsink.Sink: the tracker takes the service's new
// state; what cannot be programmed is reported by Problems.
func (s *Sink) Update(key model.ServiceKey, _, cur *model.ServiceEndpoints) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inRound = true
	s.changed++
	s.tracker.Update(key, cur)
}

var _ localsink.ProblemReporter = (*Sink)(nil)

// Problems implements localsink.ProblemReporter: the parts of the services
// held that are not in the table (a bad field, an address and port another
// service has, a protocol nftables is not given).
func (s *Sink) Problems() []model.Problem { return s.tracker.Problems() }

// Sync implements localsink.Sink: it applies the round in one transaction.
func (s *Sink) Sync() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inRound = false
	err := s.sync("")
	if s.checkAfterRound {
		s.checkAfterRound = false
		s.checkAllLocked()
	}
	return err
}

// sync applies what the tracker holds: the round's changes, or the whole
// table when needFull; repair says why the check rewrites the table (""
// for kpng's Syncs). mu is held.
func (s *Sink) sync(repair string) error {
	start := time.Now()
	changed := s.changed
	s.changed = 0
	delta := s.tracker.done(!s.needFull)
	if !s.needFull && !s.applier.Fits(delta) {
		s.logger.V(2).Info("A hairpin, cluster-ips, service-ips or shard set or a shard map outgrows its capacity: writing the table whole", "table", s.table)
		s.needFull = true
	}
	s.staleFlows = append(s.staleFlows, s.tracker.StaleFlows(delta)...)

	res := SyncResult{Full: s.needFull, Repair: repair}
	// google/nftables numbers the sets of every Conn from one counter,
	// unguarded: the sinks of a process (and a sink's repairs) build
	// their transactions one at a time.
	buildMu.Lock()
	defer buildMu.Unlock()
	if s.needFull {
		res.Services = s.tracker.ServiceKeys()
		res.Stats, res.Err = s.applier.Full(s.tracker.Ruleset(s.table))
	} else {
		if delta.Len() == 0 {
			s.logger.V(4).Info("Nothing to change", "table", s.table, "services", changed)
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
		s.logger.V(2).Info("nftables table synced", "table", s.table, "full", res.Full,
			"services", len(res.Services), "messages", res.Stats.Messages, "objects", res.Stats.Objects(), "duration", res.Duration)
		s.flushStaleFlows()
	}
	if s.cfg.AfterSync != nil {
		s.cfg.AfterSync(res)
	}
	return res.Err
}
