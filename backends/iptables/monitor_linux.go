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
// once by a full sync. own are the processes the sink runs.
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

// repair rewrites every chain because another program changed them
// (why), now or, in the middle of a round, at its Sync.
func (s *Sink) repair(why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lastFull.IsZero() || s.ctx.Err() != nil {
		return // nothing applied yet: kpng's own Sync (and its retries) comes first
	}
	s.needFull = true
	if s.inRound {
		return
	}
	why = "changed by another program: " + why
	if err := s.sync(why); err != nil {
		s.logger.Error(err, "Full sync failed: tried again at the next check", "prefix", s.prefix, "because", why)
	}
}
