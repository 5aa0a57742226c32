package nft

import (
	"context"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"

	"sigs.k8s.io/kpng/backends/nfmonitor"
)

// ownPorts are the netlink port IDs of the sockets the sink committed
// transactions on (the applier's relays): the notifications of those
// transactions carry them, and are not repaired. A port ID of a closed
// socket is kept (its notifications may still be unread); the set grows
// by one only when a socket is opened, which a sink does seldom (a failed
// transaction, a large one, the end of its context).
type ownPorts struct {
	mu  sync.Mutex
	ids map[uint32]bool
}

// add records a port ID of the sink's.
func (o *ownPorts) add(id uint32) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.ids == nil {
		o.ids = map[uint32]bool{}
	}
	o.ids[id] = true
}

// has reports whether id is one of the sink's port IDs.
func (o *ownPorts) has(id uint32) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.ids[id]
}

// startMonitor starts the sink's nftables monitor (backends/nfmonitor) in
// the namespace of its connections (netNS, a file descriptor; 0: the
// current one): a transaction of someone else's that changes one of the
// sink's tables (or deletes it) is repaired at once by rewriting the
// tables whole.
// The applier's large transactions are sent with the monitor muted
// (applier.mute): a change another program makes meanwhile is found by
// the check of every chain (checkAll) only.
func (s *Sink) startMonitor(ctx context.Context, netNS int) error {
	m, err := nfmonitor.Start(ctx, nfmonitor.Config{
		NetNS: netNS,
		Watch: func(c nfmonitor.Change, _ []byte) bool {
			return (c.Family == unix.NFPROTO_IPV4 || c.Family == unix.NFPROTO_IPV6) && c.Table == s.table
		},
		Own:           func(b nfmonitor.Batch) bool { return s.own.has(b.PortID) },
		Repair:        func(why string, _ []nfmonitor.Batch) { s.repair(why) },
		Lost:          s.checkAll,
		ReceiveBuffer: s.cfg.monitorReceiveBuffer,
	})
	if err != nil {
		return fmt.Errorf("nftables table %s: %w", s.table, err)
	}
	s.applier.mute = m.Mute
	s.applier.muteObjects = s.cfg.muteObjects
	if s.applier.muteObjects <= 0 {
		s.applier.muteObjects = defaultMuteObjects
	}
	return nil
}

// repair rewrites the tables whole because another program changed one
// (why), now or, in the middle of a round, at its Sync.
func (s *Sink) repair(why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.monitored != nil {
		s.monitored()
	}
	if !s.applied || s.ctx.Err() != nil {
		return // nothing applied yet: kpng's first Sync writes the table whole
	}
	s.needFull = true
	if s.inRound {
		return
	}
	why = "changed by another program: " + why
	if err := s.sync(why); err != nil {
		s.logger.Error(err, "Cannot rewrite the nftables table: tried again at the next check", "table", s.table, "because", why)
	}
}

// checkAll checks the whole table (every regular chain, not checkChains
// of them) and rewrites it when it changed: notifications were lost, one
// of them may have told of a change. In the middle of a round (the
// tracker half-updated), the check is made after the round's Sync.
func (s *Sink) checkAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.monitored != nil {
		s.monitored()
	}
	if s.inRound {
		s.checkAfterRound = true
		return
	}
	s.checkAllLocked()
}

// checkAllLocked is checkAll between rounds; mu is held.
func (s *Sink) checkAllLocked() {
	if !s.applied || s.needFull || s.ctx.Err() != nil {
		return // nothing to check, or a full sync is coming anyway
	}
	want := map[chainKey]int{}
	for _, name := range s.tracker.ChainNames() {
		if k, n, ok := s.tracker.RuleCount(name); ok {
			want[k] = n
		}
	}
	drift, err := s.applier.Check(want)
	if err != nil {
		s.logger.Error(err, "Cannot check the nftables table after lost notifications", "table", s.table)
		return
	}
	if drift == "" {
		return
	}
	s.logger.Info("The nftables table was changed behind kpng's back (notifications lost): rewriting it", "table", s.table, "change", drift)
	s.needFull = true
	why := "nftables notifications were lost, and the check found: " + drift
	if err := s.sync(why); err != nil {
		s.logger.Error(err, "Cannot rewrite the nftables table: tried again at the next check", "table", s.table, "because", why)
	}
}
