//go:build linux

package iptables

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/backends/conntrack"
	"sigs.k8s.io/kpng/backends/periodic"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

// Sink is the iptables backend's localsink.Sink (also a
// localsink.ClusterSink and a localsink.ProblemReporter): it programs the
// services it receives into chains of its own (New). mu serializes kpng's
// calls and the canary's check; inRound is true between a round's first
// Update (or Reset) and its Sync, when the state may be half-updated.
type Sink struct {
	mu      sync.Mutex
	inRound bool
	cfg     Config
	// ctx bounds the commands the sink runs; logger is its logger.
	ctx      context.Context
	logger   klog.Logger
	variant  string
	prefix   string
	planner  planner
	jumper   jumper
	st       *state
	needFull bool
	// lastFull is the time of the last successful full sync.
	lastFull time.Time
	// onlyTables, during a repair's full sync, are the tables (family
	// and table, no chain) it writes: those another program changed
	// (nil: all).
	onlyTables map[builtinRef]bool
	// changed are the services updated since the last Sync: the state
	// re-plans them (and those contending with them) at the Sync.
	changed map[model.ServiceKey]bool
	// dirty are the services whose fragment was re-planned since the
	// last successful Sync: a partial sync compares their chains with
	// those of applied.
	dirty map[model.ServiceKey]bool
	// applied are the fragments as last written successfully, and
	// appliedShared the other chains (fixed, dispatch), per family.
	applied       map[model.ServiceKey]*fragment
	appliedShared [2]familyPlan
	// staleFlows wait for the next successful sync.
	staleFlows []conntrack.Flow
}

// New returns a sink that programs the services it receives into
// iptables (IPv4) and ip6tables (IPv6) chains of its own, through
// iptables-restore --noflush (one call per family and table per Sync),
// after resolving cfg.Variant. Each full sync (the first, after any
// failure, and periodically) lists the tables and, in the same restore,
// inserts the jumps from the built-in chains that the listing lacks: no
// iptables command per jump, each of which, with iptables-legacy, reads
// the whole table. ctx bounds the commands the sink runs, and its end
// stops the check of cfg.CheckPeriod; the sink logs through its logger
// (klog.FromContext).
func New(ctx context.Context, cfg Config) (*Sink, error) {
	if err := cfg.Options.Validate(); err != nil {
		return nil, fmt.Errorf("iptables backend: %w", err)
	}
	if cfg.CheckPeriod < 0 {
		return nil, fmt.Errorf("iptables backend: CheckPeriod %v: must not be negative", cfg.CheckPeriod)
	}
	var own *ownPIDs
	if cfg.Runner == nil {
		if _, err := exec.LookPath("nsenter"); err != nil && cfg.NetNS != "" {
			return nil, fmt.Errorf("iptables backend: NetNS %s needs nsenter (util-linux): %w", cfg.NetNS, err)
		}
		own = &ownPIDs{}
		cfg.Runner = ExecRunner{NetNS: cfg.NetNS, Started: own.add}
	}
	variant, err := resolveVariant(ctx, cfg.Runner, cfg.Variant)
	if err != nil {
		return nil, fmt.Errorf("iptables backend: %w", err)
	}
	j, err := newGoIPTables(cfg.ServiceProxyName, variant, cfg.NetNS)
	if err != nil {
		return nil, fmt.Errorf("iptables backend (%s): %w", variant, err)
	}
	s := newSink(ctx, cfg, variant, j)
	s.logger.Info("iptables backend", "variant", variant, "prefix", ChainPrefix(cfg.ServiceProxyName), "randomFully", j.RandomFully(ipv4))
	periodic.Start(ctx, cfg.CheckPeriod, s.check)
	if variant == VariantNFT && own != nil && !cfg.NoMonitor {
		if err := s.startMonitor(ctx, own); err != nil {
			return nil, fmt.Errorf("iptables backend: %w", err)
		}
	}
	return s, nil
}

// check checks the canary chains once and, if one is gone, rewrites
// everything now (between rounds) or at the round's Sync.
func (s *Sink) check() { s.checkBecause("") }

// lost is the check after nftables notifications were lost (the
// monitor's Lost): the full sync's Repair says so.
func (s *Sink) lost() { s.checkBecause("nftables notifications were lost, and the check found: ") }

// checkBecause is check, the reason of its full sync prefixed with cause.
func (s *Sink) checkBecause(cause string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lastFull.IsZero() || s.ctx.Err() != nil {
		return // nothing applied yet: kpng's own Sync (and its retries) comes first
	}
	period := s.cfg.FullSyncPeriod
	if period <= 0 {
		period = DefaultFullSyncPeriod
	}
	// A full sync is due when one failed (kpng retries only the Syncs
	// it made; this tries again those the check made) or the period ran
	// out without a Sync.
	why := ""
	switch {
	case s.needFull:
		why = "a full sync failed"
	case time.Since(s.lastFull) >= period:
		why = "the full sync period ran out"
	default:
		for _, f := range families {
			ok, err := s.jumper.CanaryIntact(f, s.prefix+chainCanary)
			if err != nil {
				s.logger.Error(err, "Cannot check the canary chains", "prefix", s.prefix)
				return
			}
			if !ok {
				s.logger.Info("The canary chain is gone: the tables were flushed or replaced; rewriting every chain", "prefix", s.prefix, "family", f.String(), "inRound", s.inRound)
				s.needFull = true
				why = "the canary chain was gone"
				break
			}
		}
		if why == "" {
			missing, err := s.missingJumps()
			if err != nil {
				s.logger.Error(err, "Cannot check the jumps from the built-in chains", "prefix", s.prefix)
				return
			}
			if missing != "" {
				s.logger.Info("A jump from a built-in chain is gone: rewriting every chain", "prefix", s.prefix, "jump", missing, "inRound", s.inRound)
				s.needFull = true
				why = "a jump was gone: " + missing
			}
		}
	}
	if why == "" || s.inRound {
		return // nothing to do, or the round's Sync does it
	}
	why = cause + why
	if err := s.sync(why); err != nil {
		s.logger.Error(err, "Full sync failed: tried again at the next check", "prefix", s.prefix, "because", why)
	}
}

// missingJumps lists the nat and filter tables of both families and
// returns the first jump from a built-in chain that one lacks ("" when
// none does): someone deleted it (iptables -D, a firewall's own rules
// restored without --noflush), which the canary chains do not show.
func (s *Sink) missingJumps() (string, error) {
	for _, f := range families {
		for _, table := range tables {
			out, err := s.cfg.Runner.Run(s.ctx, binary(s.variant, f, "-save"), []string{"-t", table}, nil)
			if err != nil {
				return "", fmt.Errorf("%s table %s: list the chains: %w", f, table, err)
			}
			if m := missingJumps(out, table, jumps(s.prefix)); len(m) > 0 {
				return fmt.Sprintf("%s %s %s to %s", f, table, m[0].From, m[0].To), nil
			}
		}
	}
	return "", nil
}

// newSink returns the sink with its jumper (a fake in unit tests).
func newSink(ctx context.Context, cfg Config, variant string, j jumper) *Sink {
	prefix := ChainPrefix(cfg.ServiceProxyName)
	pl := planner{prefix: prefix, opts: cfg.Options, randomFully: j.RandomFully(ipv4)}
	return &Sink{
		cfg: cfg, ctx: ctx, logger: klog.FromContext(ctx), variant: variant, prefix: prefix, jumper: j, planner: pl,
		st:       newState(pl),
		changed:  map[model.ServiceKey]bool{},
		dirty:    map[model.ServiceKey]bool{},
		applied:  map[model.ServiceKey]*fragment{},
		needFull: true,
	}
}

var (
	_ localsink.ClusterSink     = (*Sink)(nil)
	_ localsink.ProblemReporter = (*Sink)(nil)
)

// Problems implements localsink.ProblemReporter: the parts of the
// services held that are not programmed (a bad field, an address and
// port another service has, a protocol iptables is not given), in key
// order, as of the last Sync (kpng logs each once, counts and lists
// them).
func (s *Sink) Problems() []model.Problem {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st.reported()
}

// Reset implements localsink.Sink.
func (s *Sink) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inRound = true
	for k := range s.st.services {
		s.changed[k] = true
	}
	clear(s.st.services)
	s.needFull = true
}

// Update implements localsink.Sink.
func (s *Sink) Update(key model.ServiceKey, _, cur *model.ServiceEndpoints) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inRound = true
	s.changed[key] = true
	if cur == nil {
		delete(s.st.services, key)
		return
	}
	s.st.services[key] = cur
}

// Sync implements localsink.Sink: it re-plans the services changed since
// the last Sync and writes, one iptables-restore per family and table:
// every chain on a full sync (the first, the first after a failure or a
// Reset, and one every FullSyncPeriod), otherwise the chains whose rules
// changed since the last successful Sync: those of the services
// changed, and the dispatch when an address or port did.
func (s *Sink) Sync() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inRound = false
	return s.sync("")
}

// sync is Sync, mu held; repair says why the check syncs ("" for kpng's
// Syncs). The result goes to Config.AfterSync.
func (s *Sink) sync(repair string) error {
	res := SyncResult{Repair: repair}
	start := time.Now()
	err := s.syncOnce(start, &res)
	res.Duration, res.Err = time.Since(start), err
	if s.cfg.AfterSync != nil {
		s.cfg.AfterSync(res)
	}
	return err
}

// syncOnce is sync but for the result's report.
func (s *Sink) syncOnce(start time.Time, res *SyncResult) error {
	for k := range s.st.update(s.changed) {
		s.dirty[k] = true
	}
	s.changed = map[model.ServiceKey]bool{}
	period := s.cfg.FullSyncPeriod
	if period <= 0 {
		period = DefaultFullSyncPeriod
	}
	full := s.needFull || time.Since(s.lastFull) >= period
	res.Full = full
	// Whatever happens now, until a Sync succeeds the next one re-reads
	// the kernel's chains and ensures the jumps.
	s.needFull = true
	shared := [2]familyPlan{s.st.shared(ipv4), s.st.shared(ipv6)}
	stats, err := s.apply(shared, full)
	res.Restores, res.RestoreFailed = stats.restores, stats.restoreFailed
	if err != nil {
		return fmt.Errorf("iptables (%s) chains %s* of services %s: %w (the next sync re-reads the chains and rewrites them all)", s.variant, s.prefix, s.dirtyNames(), err)
	}
	s.needFull = false
	if full && s.onlyTables == nil {
		s.lastFull = start
	}
	for k := range s.dirty {
		var before, after *fragment
		before, after = s.applied[k], s.st.frags[k]
		for _, f := range families {
			var b, a map[dst][]netip.AddrPort
			if before != nil {
				b = before.Families[f].Reach
			}
			if after != nil {
				a = after.Families[f].Reach
			}
			s.staleFlows = append(s.staleFlows, staleFlows(f, b, a)...)
		}
		if after == nil {
			delete(s.applied, k)
		} else {
			s.applied[k] = after
		}
	}
	changed := len(s.dirty)
	s.dirty = map[model.ServiceKey]bool{}
	s.appliedShared = shared
	s.logger.V(2).Info("iptables chains synced", "prefix", s.prefix, "variant", s.variant, "full", full, "services", len(s.st.keys), "changed", changed,
		"chainsWritten", stats.chains, "chainsDeleted", stats.deleted, "bytes", stats.bytes, "restores", stats.restores, "duration", time.Since(start))
	s.flushStaleFlows()
	return nil
}

// dirtyNames returns the services of a failed sync, for its error: up to
// five keys, and how many more.
func (s *Sink) dirtyNames() string {
	keys := slices.SortedFunc(maps.Keys(s.dirty), model.ServiceKey.Compare)
	names := make([]string, 0, 5)
	for _, k := range keys[:min(5, len(keys))] {
		names = append(names, k.String())
	}
	out := strings.Join(names, ", ")
	if len(keys) > 5 {
		out += fmt.Sprintf(" and %d more", len(keys)-5)
	}
	if out == "" {
		out = "(none changed)"
	}
	return out
}

// syncStats is what one sync handed to iptables-restore.
type syncStats struct {
	restores, chains, deleted, bytes int
	// restoreFailed says that a restore failed (the sync stopped there).
	restoreFailed bool
}

// apply writes the plan, for each family and table with one
// iptables-restore --noflush: every chain (full: the chains of the
// proxier found in the kernel and no longer planned are deleted), or the
// chains whose rules changed since the last successful restore (partial:
// those of the dirty services and the shared ones that differ, deleting
// those gone; a table without any is not restored at all). A full sync's
// restores also insert the jumps from the built-in chains that its
// listing lacks.
func (s *Sink) apply(shared [2]familyPlan, full bool) (syncStats, error) {
	ctx := s.ctx
	var stats syncStats
	var whole *plan
	if full {
		whole = s.st.plan()
	}
	dirty := slices.SortedFunc(maps.Keys(s.dirty), model.ServiceKey.Compare)
	for _, f := range families {
		// Each table is listed just before its restore, nat first: after a
		// foreign flush (a repair), a family's DNAT works again as soon as
		// its nat table is back, without waiting for the filter table's
		// listing (one iptables-save of every rule, about 90 ms at 1,000
		// services).
		for _, table := range tables {
			if full && s.onlyTables != nil && !s.onlyTables[builtinRef{family: f, table: table}] {
				continue // a repair, of other tables
			}
			var write []*chain
			var stale, inserts []string
			if full {
				out, err := s.cfg.Runner.Run(ctx, binary(s.variant, f, "-save"), []string{"-t", table}, nil)
				if err != nil {
					return stats, fmt.Errorf("%s table %s: list the chains: %w", f, table, err)
				}
				for _, j := range missingJumps(out, table, jumps(s.prefix)) {
					inserts = append(inserts, j.insertLine(s.cfg.ServiceProxyName))
				}
				t := whole.Families[f].table(table)
				write = t.Chains
				for _, name := range chainsWithPrefix(out, s.prefix) {
					if _, ok := t.byName[name]; !ok {
						stale = append(stale, name)
					}
				}
			} else {
				write, stale = changedChains(s.appliedShared[f].table(table), shared[f].table(table), write, stale)
				for _, k := range dirty {
					var before, after *tablePlan
					if fr := s.applied[k]; fr != nil {
						before = fr.Families[f].table(table)
					}
					if fr := s.st.frags[k]; fr != nil {
						after = fr.Families[f].table(table)
					}
					write, stale = changedChains(before, after, write, stale)
				}
				if len(write) == 0 && len(stale) == 0 {
					continue
				}
			}
			slices.Sort(stale)
			in := restoreInput(table, &tablePlan{Chains: write}, stale, inserts...)
			if _, err := s.cfg.Runner.Run(ctx, binary(s.variant, f, "-restore"), []string{"--noflush", "--wait"}, in); err != nil {
				stats.restoreFailed = true
				return stats, fmt.Errorf("%s table %s: restore (%d chains, %d bytes; this table unchanged): %w", f, table, len(write), len(in), err)
			}
			stats.restores++
			stats.chains += len(write)
			stats.deleted += len(stale)
			stats.bytes += len(in)
		}
	}
	return stats, nil
}

// changedChains appends to write the chains of after whose rules differ
// from those of the same name in before (or that before lacks), and to
// stale the names of the chains of before that after lacks. Either may
// be nil (no chains).
func changedChains(before, after *tablePlan, write []*chain, stale []string) ([]*chain, []string) {
	if after != nil {
		for _, c := range after.Chains {
			var old *chain
			if before != nil {
				old = before.byName[c.Name]
			}
			if old == nil || !slices.Equal(old.Rules, c.Rules) {
				write = append(write, c)
			}
		}
	}
	if before != nil {
		for _, c := range before.Chains {
			if after == nil || after.byName[c.Name] == nil {
				stale = append(stale, c.Name)
			}
		}
	}
	return write, stale
}

// staleFlows returns the UDP flows that the change from the reach
// before to after made stale: those DNATed to an endpoint a destination
// no longer reaches, and the un-DNATed ones of a destination that reached
// no endpoint and now does.
func staleFlows(f family, before, after map[dst][]netip.AddrPort) []conntrack.Flow {
	var out []conntrack.Flow
	flow := func(d dst, ep netip.AddrPort) conntrack.Flow {
		return conntrack.Flow{IPv6: f == ipv6, Proto: unix.IPPROTO_UDP, Dst: d.Addr, Endpoint: ep}
	}
	for d, eps := range before {
		for _, ep := range eps {
			if !slices.Contains(after[d], ep) {
				out = append(out, flow(d, ep))
			}
		}
	}
	for d, eps := range after {
		if len(eps) > 0 && len(before[d]) == 0 {
			out = append(out, flow(d, netip.AddrPort{}))
		}
	}
	slices.SortFunc(out, func(a, b conntrack.Flow) int {
		if c := a.Dst.Compare(b.Dst); c != 0 {
			return c
		}
		return a.Endpoint.Compare(b.Endpoint)
	})
	return slices.Compact(out)
}

// flushStaleFlows deletes the conntrack entries of the stale flows.
// Errors are logged, never returned: the rules are in place; stale
// entries only delay them for their flows until they expire.
func (s *Sink) flushStaleFlows() {
	flows := s.staleFlows
	s.staleFlows = nil
	if len(flows) == 0 {
		return
	}
	newHandle := s.cfg.Conntrack
	if newHandle == nil && s.cfg.NetNS != "" {
		newHandle = conntrack.InNetNS(s.cfg.NetNS)
	}
	deleted, err := conntrack.DeleteFlows(newHandle, flows)
	if err != nil {
		s.logger.Error(err, "Cannot delete stale UDP conntrack entries", "prefix", s.prefix, "flows", len(flows), "deleted", deleted)
		return
	}
	s.logger.V(2).Info("Deleted stale UDP conntrack entries", "prefix", s.prefix, "flows", len(flows), "deleted", deleted)
}

// Cleanup removes the proxier's jumps and chains (cfg.ServiceProxyName,
// cfg.NetNS, cfg.Variant: auto cleans both variants), as --cleanup does;
// ctx bounds the commands it runs, and it logs through ctx's logger.
func Cleanup(ctx context.Context, cfg Config) error {
	if cfg.Runner == nil {
		cfg.Runner = ExecRunner{NetNS: cfg.NetNS}
	}
	variants := []string{cfg.Variant}
	if cfg.Variant == "" || cfg.Variant == VariantAuto {
		variants = []string{VariantLegacy, VariantNFT}
	}
	prefix := ChainPrefix(cfg.ServiceProxyName)
	var errs []error
	for _, v := range variants {
		if _, err := resolveVariant(ctx, cfg.Runner, v); err != nil {
			return fmt.Errorf("iptables cleanup: %w", err)
		}
		j, err := newGoIPTables(cfg.ServiceProxyName, v, cfg.NetNS)
		if err != nil {
			errs = append(errs, fmt.Errorf("iptables cleanup (%s): %w", v, err))
			continue
		}
		for _, f := range families {
			if err := j.Remove(f, append(jumps(prefix), formerJumps(prefix)...)); err != nil {
				errs = append(errs, fmt.Errorf("iptables cleanup (%s): %w", v, err))
				continue
			}
			for _, table := range tables {
				out, err := cfg.Runner.Run(ctx, binary(v, f, "-save"), []string{"-t", table}, nil)
				if err != nil {
					errs = append(errs, fmt.Errorf("iptables cleanup (%s): %s table %s: %w", v, f, table, err))
					continue
				}
				chains := chainsWithPrefix(out, prefix)
				if len(chains) == 0 {
					continue
				}
				if _, err := cfg.Runner.Run(ctx, binary(v, f, "-restore"), []string{"--noflush", "--wait"}, restoreInput(table, &tablePlan{}, chains)); err != nil {
					errs = append(errs, fmt.Errorf("iptables cleanup (%s): %s table %s: %w", v, f, table, err))
				}
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	klog.FromContext(ctx).Info("Removed the iptables chains", "prefix", prefix)
	return nil
}

// SetCluster implements localsink.ClusterSink: the service CIDRs (given
// to the cluster's default proxier only) whose addresses no service
// holds are dropped; the next Sync writes the filter SERVICES chains
// again.
func (s *Sink) SetCluster(c *model.Cluster) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inRound = true
	s.st.setCluster(c)
}
