package iptables

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"sigs.k8s.io/kpng/backends/nfmonitor"
)

// ownPIDKept is how long the process ID of a binary the sink started
// stays its own for the monitor: long enough for any restore and for
// the monitor to read its notifications (even after a backoff's gap),
// short enough that the ID is not another process's by then.
const ownPIDKept = 10 * time.Minute

// ownPIDs are the process IDs of the binaries the sink ran (its
// ExecRunner's Started), with when they started: the notifications of
// their iptables-nft transactions name them, and are not repaired.
type ownPIDs struct {
	mu   sync.Mutex
	pids map[int]time.Time
}

// add records pid, started now, and forgets those kept long enough.
func (o *ownPIDs) add(pid int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := time.Now()
	if o.pids == nil {
		o.pids = map[int]time.Time{}
	}
	for p, at := range o.pids {
		if now.Sub(at) > ownPIDKept {
			delete(o.pids, p)
		}
	}
	o.pids[pid] = now
}

// has reports whether pid is a process the sink ran.
func (o *ownPIDs) has(pid uint32) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	_, ok := o.pids[int(pid)]
	return ok
}

// startMonitor starts the sink's nftables monitor (backends/nfmonitor)
// in cfg.NetNS: iptables-nft's tables are nftables tables (nat and
// filter, of families ip and ip6), and a transaction of another
// program's that deletes one, changes one of the sink's chains, or
// deletes a jump from a built-in chain to one of them is repaired at
// once: the deleted jumps alone inserted again when that is all it did,
// else by a full sync. own are the processes the sink runs.
func (s *Sink) startMonitor(ctx context.Context, own *ownPIDs) error {
	fd := 0
	if s.cfg.NetNS != "" {
		f, err := os.Open(s.cfg.NetNS)
		if err != nil {
			return fmt.Errorf("monitor: network namespace %s: %w", s.cfg.NetNS, err)
		}
		// The socket keeps the namespace; the file is not needed after
		// the dial.
		defer f.Close()
		fd = int(f.Fd())
	}
	_, err := nfmonitor.Start(ctx, nfmonitor.Config{
		NetNS:         fd,
		Watch:         s.watches,
		Own:           func(b nfmonitor.Batch) bool { return own.has(b.ProcPID) },
		Repair:        s.repair,
		Lost:          s.lost,
		ReceiveBuffer: s.cfg.monitorReceiveBuffer,
	})
	if err != nil {
		return fmt.Errorf("iptables (%s) chains %s*: %w", s.variant, s.prefix, err)
	}
	return nil
}

// builtinChains are the built-in chains of the nat and filter tables the
// sink jumps from.
var builtinChains = []string{"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"}

// watches reports whether the change c (data: the message's attributes)
// of an iptables-nft table concerns the sink: the nat or filter table
// deleted (iptables-nft's flush of a table deletes its rules, which the
// chains' rules below cover), a change in one of the sink's chains, a
// built-in chain deleted, or a rule deleted from one whose attributes
// name one of the sink's chains (a jump: its verdict names the chain).
func (s *Sink) watches(c nfmonitor.Change, data []byte) bool {
	if c.Family != unix.NFPROTO_IPV4 && c.Family != unix.NFPROTO_IPV6 || !slices.Contains(tables, c.Table) {
		return false
	}
	switch {
	case c.Type == unix.NFT_MSG_DELTABLE:
		return true
	case strings.HasPrefix(c.Chain, s.prefix):
		return true
	case slices.Contains(builtinChains, c.Chain):
		return c.Type == unix.NFT_MSG_DELCHAIN || c.Type == unix.NFT_MSG_DELRULE && bytes.Contains(data, []byte(s.prefix))
	}
	return false
}

// repair mends what another program changed (why; foreign: its
// transactions): when all it did was delete jumps from built-in chains
// and kpng's last sync succeeded, it inserts those jumps again; else it
// rewrites every chain, now or, in the middle of a round, at its Sync:
// only those of the tables the transactions touched, when they name them
// all and kpng's last sync succeeded (the others hold what it wrote).
func (s *Sink) repair(why string, foreign []nfmonitor.Batch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lastFull.IsZero() || s.ctx.Err() != nil {
		return // nothing applied yet: kpng's own Sync (and its retries) comes first
	}
	why = "changed by another program: " + why
	if from := deletedJumps(foreign); from != nil && !s.needFull && !s.inRound {
		err := s.restoreJumps(why, from)
		if err == nil {
			return
		}
		s.logger.Error(err, "Cannot insert the jumps again: rewriting every chain", "prefix", s.prefix, "because", why)
		why += " (inserting the jumps alone failed: " + err.Error() + ")"
	}
	lastOK := !s.needFull
	s.needFull = true
	if s.inRound {
		return
	}
	if only := touchedTables(foreign); only != nil && lastOK {
		s.onlyTables = only
		defer func() { s.onlyTables = nil }()
	}
	if err := s.sync(why); err != nil {
		s.logger.Error(err, "Full sync failed: tried again at the next check", "prefix", s.prefix, "because", why)
	}
}

// touchedTables returns the nat and filter tables (family and table; no
// chain) the transactions' watched changes touched, when they name them
// all; nil when they may not (notifications lost, more tables than a
// Batch names) or foreign is empty.
func touchedTables(foreign []nfmonitor.Batch) map[builtinRef]bool {
	if len(foreign) == 0 {
		return nil
	}
	out := map[builtinRef]bool{}
	for _, b := range foreign {
		if b.Cut || b.ManyTables {
			return nil
		}
		for _, t := range b.Tables {
			f := ipv4
			if t.Family == unix.NFPROTO_IPV6 {
				f = ipv6
			}
			out[builtinRef{family: f, table: t.Table}] = true
		}
	}
	if len(out) == 0 {
		return nil // named none: every table
	}
	return out
}

// builtinRef is a built-in chain of a family's table.
type builtinRef struct {
	family family
	table  string
	chain  string
}

// deletedJumps returns the built-in chains whose rules naming the sink's
// chains (its jumps: watches keeps no others) the transactions deleted,
// when that is all they did; nil when they did anything else, named more
// kinds of change than a Batch keeps, may hold another's changes (Cut),
// or when foreign is empty (notifications were lost).
func deletedJumps(foreign []nfmonitor.Batch) []builtinRef {
	var out []builtinRef
	for _, b := range foreign {
		if b.Truncated || b.Cut {
			return nil
		}
		for _, c := range b.Changes {
			if c.Type != unix.NFT_MSG_DELRULE || !slices.Contains(builtinChains, c.Chain) {
				return nil
			}
			f := ipv4
			if c.Family == unix.NFPROTO_IPV6 {
				f = ipv6
			}
			if r := (builtinRef{f, c.Table, c.Chain}); !slices.Contains(out, r) {
				out = append(out, r)
			}
		}
	}
	return out
}

// restoreJumps lists each built-in chain of from (iptables -S: that chain
// only, not the whole table) and inserts the sink's jumps it lacks, one
// iptables-restore per table, reporting the repair to Config.AfterSync
// (nothing is reported when no jump was missing: the check put them back
// first, or the rule deleted only named a chain of the sink's). A failed
// restore is reported as a failure, not a repair: the caller rewrites
// everything, saying why.
func (s *Sink) restoreJumps(why string, from []builtinRef) error {
	start := time.Now()
	inserts := map[builtinRef][]string{} // by family and table (chain "")
	var order []builtinRef
	for _, r := range from {
		out, err := s.cfg.Runner.Run(s.ctx, binary(s.variant, r.family, ""), []string{"-w", "-t", r.table, "-S", r.chain}, nil)
		if err != nil {
			return fmt.Errorf("%s table %s: list chain %s: %w", r.family, r.table, r.chain, err)
		}
		var js []jump
		for _, j := range jumps(s.prefix) {
			if j.Table == r.table && j.From == r.chain {
				js = append(js, j)
			}
		}
		key := builtinRef{family: r.family, table: r.table}
		for _, j := range missingJumps(out, r.table, js) {
			if _, ok := inserts[key]; !ok {
				order = append(order, key)
			}
			inserts[key] = append(inserts[key], j.insertLine(s.cfg.ServiceProxyName))
		}
	}
	if len(order) == 0 {
		s.logger.V(2).Info("No jump from a built-in chain missing after another program's change", "prefix", s.prefix, "because", why)
		return nil
	}
	res := SyncResult{Repair: why}
	for _, key := range order {
		in := restoreInput(key.table, &tablePlan{}, nil, inserts[key]...)
		if _, err := s.cfg.Runner.Run(s.ctx, binary(s.variant, key.family, "-restore"), []string{"--noflush", "--wait"}, in); err != nil {
			err = fmt.Errorf("%s table %s: insert the jumps: %w", key.family, key.table, err)
			// A failed restore, counted as such; the full sync the
			// caller makes next is the repair.
			if s.cfg.AfterSync != nil {
				s.cfg.AfterSync(SyncResult{Restores: res.Restores, RestoreFailed: true, Duration: time.Since(start), Err: err})
			}
			return err
		}
		res.Restores++
	}
	res.Duration = time.Since(start)
	s.logger.Info("Jumps from built-in chains deleted by another program: inserted again", "prefix", s.prefix, "because", why, "restores", res.Restores)
	if s.cfg.AfterSync != nil {
		s.cfg.AfterSync(res)
	}
	return nil
}
