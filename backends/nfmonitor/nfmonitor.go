//go:build linux

// Package nfmonitor repairs a backend's rules as soon as someone else
// changes them: it listens, in the network namespace the backend programs,
// for the notifications nftables sends of every committed change (the
// NFNLGRP_NFTABLES group of a NETLINK_NETFILTER socket, what `nft
// monitor` prints; iptables-nft's tables are nftables tables too), keeps
// the changes the backend watches (Config.Watch), and once a transaction
// ends (its NFT_MSG_NEWGEN message) that the backend did not make
// (Config.Own), calls Config.Repair: once for a burst of such
// transactions, and never more often than a backoff allows, so that a
// firewall flushing the ruleset in a loop cannot make the backend spin.
// A notification lost (the socket's buffer overflowed: the kernel
// reports ENOBUFS once, then drops silently until the socket is read
// empty, which the generation a transaction ends with shows skipped)
// calls Config.Lost, for a full check; the changes read across a lost
// end of a transaction are a Cut batch.
package nfmonitor

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// Defaults of Config's timing.
const (
	// DefaultSettle is how long the monitor waits after a foreign
	// transaction for the rest of its burst (a firewall reload commits
	// several) before repairing.
	DefaultSettle = 10 * time.Millisecond
	// DefaultMinGap is the smallest time between two repairs of one
	// burst; the gap doubles with each repair of the burst.
	DefaultMinGap = 100 * time.Millisecond
	// DefaultMaxGap is the largest time between two repairs of a burst.
	DefaultMaxGap = 5 * time.Second
)

// DefaultReceiveBuffer is the monitor socket's receive buffer when
// Config.ReceiveBuffer is zero: the backend's own full transactions
// notify a message per object, which the socket holds until the monitor
// reads them.
const DefaultReceiveBuffer = 16 << 20

// lossWindow is how long after an overrun (ENOBUFS) the batches that end
// are Cut: the kernel keeps dropping notifications until the socket is
// read empty, which takes the reader at most the time to parse a full
// buffer.
const lossWindow = 2 * time.Second

// maxTables is how many distinct tables a Batch names (Batch.Tables).
const maxTables = 64

// keptChanges is how many of a transaction's watched changes a Batch
// keeps (for the logs); Count counts them all.
const keptChanges = 4

// Change is one object changed by a committed transaction, as its
// notification names it.
type Change struct {
	// Type is the message type: unix.NFT_MSG_NEWRULE, …_DELTABLE, ….
	Type uint8
	// Family is the table's family (unix.NFPROTO_INET, …_IPV4, …).
	Family uint8
	// Table is the table's name; Chain the chain's, for a chain or a
	// rule ("" otherwise).
	Table, Chain string
}

// String describes the change: "delete chain inet kpng-x prerouting".
func (c Change) String() string {
	s := typeName(c.Type) + " " + familyName(c.Family) + " " + c.Table
	if c.Chain != "" {
		s += " " + c.Chain
	}
	return s
}

// Batch is one committed transaction's watched changes.
type Batch struct {
	// PortID is the netlink port ID of the socket that committed it;
	// ProcPID and ProcName are its process's (as the kernel names it).
	PortID, ProcPID uint32
	ProcName        string
	// Changes are the first watched changes of distinct kinds (and a
	// table's deletion), Count the number of all.
	Changes []Change
	Count   int
	// Truncated says that Changes lacks some of the batch's distinct
	// kinds of changes (more than it keeps); false: Changes names every
	// kind, and a backend may repair only what they name (unless Cut).
	Truncated bool
	// Tables are the distinct tables (Change with the Family and Table
	// only) the watched changes touched, every one of them unless
	// ManyTables: more than maxTables, and a backend must assume any.
	Tables     []Change
	ManyTables bool
	// Cut says that notifications were lost around the batch (the
	// socket's buffer overran): the end of an earlier transaction was
	// lost, so that Changes may be of that one too, whose committer is
	// unknown; or the batch ended within lossWindow of an overrun, and
	// may lack changes the kernel dropped.
	Cut bool
}

// keep counts c, and keeps it if it is of a kind (type, table, chain) not
// kept yet; a table's deletion is always kept (in place of the last
// change kept when there are keptChanges already). Its table goes in
// Tables.
func (b *Batch) keep(c Change) {
	b.Count++
	if t := (Change{Family: c.Family, Table: c.Table}); !b.ManyTables && !slices.Contains(b.Tables, t) {
		if len(b.Tables) < maxTables {
			b.Tables = append(b.Tables, t)
		} else {
			b.Tables, b.ManyTables = nil, true
		}
	}
	if slices.Contains(b.Changes, c) {
		return
	}
	switch {
	case len(b.Changes) < keptChanges:
		b.Changes = append(b.Changes, c)
	case c.Type == unix.NFT_MSG_DELTABLE:
		b.Changes[keptChanges-1] = c
		b.Truncated = true
	default:
		b.Truncated = true
	}
}

// String describes the batch for a log or a SyncResult's Repair.
func (b Batch) String() string {
	parts := make([]string, 0, len(b.Changes))
	for _, c := range b.Changes {
		parts = append(parts, c.String())
	}
	s := strings.Join(parts, ", ")
	if b.Count > len(b.Changes) {
		s += fmt.Sprintf(" (%d changes)", b.Count)
	}
	s = fmt.Sprintf("%s (by %s, pid %d)", s, b.ProcName, b.ProcPID)
	if b.Cut {
		s += " (and maybe by a transaction whose end was lost, or with changes lost)"
	}
	return s
}

// Config configures a monitor.
type Config struct {
	// NetNS is a file descriptor of the network namespace to watch; 0:
	// the current one.
	NetNS int
	// Watch reports whether a change concerns the backend; data is the
	// message's payload after its nfgenmsg header (its attributes, for
	// a closer look: a rule's verdict). Called from the monitor's
	// goroutine, for every notification.
	Watch func(c Change, data []byte) bool
	// Own reports whether the backend committed the batch itself (its
	// port ID or process): such batches are never repaired. It is
	// called from the monitor's goroutine, at least Settle after the
	// batch ended.
	Own func(b Batch) bool
	// Repair repairs the backend's rules; why describes the foreign
	// changes (and says when notifications were lost too: no Lost call
	// then); foreign are their transactions, for a backend that can
	// repair only what they name (see Batch.Truncated and Batch.Cut),
	// nil when notifications were lost too (then nothing names all that
	// changed). It is called from the monitor's goroutine, one call at a
	// time.
	Repair func(why string, foreign []Batch)
	// Lost, when notifications were lost, checks the backend's rules
	// fully (as Repair, but only when they changed). nil: Repair.
	Lost func()
	// Settle, MinGap and MaxGap time the repairs (DefaultSettle, … when
	// zero): a repair comes Settle after the first foreign transaction
	// of a burst; while foreign transactions keep coming, each repair
	// waits after the previous one a gap that doubles from MinGap up to
	// MaxGap. A burst ends when none came for twice the gap.
	Settle, MinGap, MaxGap time.Duration
	// ReceiveBuffer is the socket's receive buffer in bytes
	// (SO_RCVBUFFORCE when allowed, as root; else as much of it as
	// net.core.rmem_max allows; the kernel doubles it for its
	// bookkeeping and keeps at least its minimum, some 4 KiB); 0:
	// DefaultReceiveBuffer. Notifications that come while it is full
	// are dropped, which the kernel reports (ENOBUFS): Lost is called.
	// A small buffer is for tests of that path.
	ReceiveBuffer int
}

// Start opens the monitor's sockets in cfg.NetNS and watches the
// notifications until ctx ends (Monitor.Done is closed when its
// goroutines have returned). It logs through ctx's logger.
func Start(ctx context.Context, cfg Config) (*Monitor, error) {
	if cfg.Settle <= 0 {
		cfg.Settle = DefaultSettle
	}
	if cfg.MinGap <= 0 {
		cfg.MinGap = DefaultMinGap
	}
	if cfg.MaxGap < cfg.MinGap {
		cfg.MaxGap = max(DefaultMaxGap, cfg.MinGap)
	}
	if cfg.ReceiveBuffer < 0 {
		return nil, fmt.Errorf("nftables monitor: receive buffer %d bytes: must not be negative", cfg.ReceiveBuffer)
	}
	if cfg.ReceiveBuffer == 0 {
		cfg.ReceiveBuffer = DefaultReceiveBuffer
	}
	if cfg.Lost == nil {
		cfg.Lost = func() { cfg.Repair("nftables notifications were lost", nil) }
	}
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: cfg.NetNS})
	if err != nil {
		return nil, fmt.Errorf("nftables monitor: netlink socket: %w", err)
	}
	// The generation is read on a socket of its own (Mute), the
	// notifications' being read by the monitor's goroutine.
	genConn, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: cfg.NetNS})
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("nftables monitor: netlink socket: %w", err)
	}
	closeBoth := func() {
		conn.Close()
		genConn.Close()
	}
	if err := conn.JoinGroup(unix.NFNLGRP_NFTABLES); err != nil {
		closeBoth()
		return nil, fmt.Errorf("nftables monitor: join group NFNLGRP_NFTABLES: %w", err)
	}
	setReceiveBuffer(conn, cfg.ReceiveBuffer)
	m := &Monitor{cfg: cfg, ctx: ctx, logger: klog.FromContext(ctx), conn: conn, genConn: genConn,
		wake: make(chan struct{}, 1), done: make(chan struct{})}
	if err := m.resync(); err != nil {
		closeBoth()
		return nil, fmt.Errorf("nftables monitor: request the generation: %w", err)
	}
	stop := context.AfterFunc(ctx, closeBoth)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		defer func() {
			// A reader stopped by an error closes the sockets itself
			// (a Mute then does nothing).
			if stop() {
				closeBoth()
			}
		}()
		m.read(ctx)
	}()
	go func() {
		defer wg.Done()
		m.loop(ctx)
	}()
	go func() { wg.Wait(); close(m.done) }()
	return m, nil
}

// Done returns a channel closed when the monitor's goroutines have
// returned, after Start's context ended.
func (m *Monitor) Done() <-chan struct{} { return m.done }

// Mute stops the kernel's notifications to the monitor until the
// function it returns is called, with the number of transactions the
// caller committed meanwhile. It is for a backend's own large
// transactions: nftables builds a notification of every object a
// transaction adds or deletes, but only while some socket listens, and
// for a table written whole that costs more than the transaction itself
// (a message allocated for each of a million objects). A transaction of
// another program committed meanwhile is not missed, though what it
// changed is not known: the generation is read when muting (after
// leaving the group, on the monitor's socket too, so that a transaction
// already counted whose notifications had not come yet is seen) and when
// listening again, and if it moved by more than the caller's commits (or
// cannot be read), Config.Lost is called, as when notifications were
// lost. (Another program's transaction that waited for the caller's, a
// long one, commits right after it, before the monitor listens again:
// a full repair for each would make a backend that commits large
// transactions often rewrite its rules after each while another program
// commits often.) Mute calls are serialized: a second waits for the
// first's unmute. A monitor that cannot stop listening stays as it is
// (its unmute does nothing).
func (m *Monitor) Mute() (unmute func(commits int)) {
	m.muteMu.Lock()
	// Soon after an overrun the kernel may still drop what comes (the
	// socket not read empty yet), the mute's reply and another
	// program's notifications among them: the full check runs after it.
	m.mu.Lock()
	uncertain := !m.lossAt.IsZero() && time.Since(m.lossAt) < lossWindow
	m.mu.Unlock()
	before, err := m.generation()
	if err == nil {
		err = m.conn.LeaveGroup(unix.NFNLGRP_NFTABLES)
	}
	if err != nil {
		m.muteMu.Unlock()
		m.logger.V(2).Info("nftables monitor: cannot stop listening during a transaction of the backend's: it listens on", "err", err)
		return func(int) {}
	}
	// The notifications delivered before the group was left are queued
	// ahead of this request's reply: the reader compares its generation
	// with the one the last of them ended with (genReply).
	m.mu.Lock()
	if req, err := requestGen(m.conn); err == nil {
		m.muteReq = &req.Header
	} else {
		uncertain = true
	}
	m.mu.Unlock()
	return func(commits int) {
		defer m.muteMu.Unlock()
		if uncertain {
			m.post(nil, true)
		}
		if err := m.listen(); err != nil {
			if m.ctx.Err() == nil {
				m.logger.Error(err, "nftables monitor: cannot listen again after a transaction of the backend's: checking the rules fully")
				m.post(nil, true)
			}
			return
		}
		after, err := m.generation()
		want := before
		for range commits {
			want = nextGen(want)
		}
		if err != nil || after != want {
			// Someone else committed meanwhile (or the generation is
			// unknown): what changed is not known.
			m.logger.V(2).Info("nftables monitor: transactions committed while not listening: checking the rules fully",
				"before", before, "after", after, "own", commits, "err", err)
			m.post(nil, true)
		}
	}
}

// listen joins the notifications' group again after Mute, and asks for
// the generation: until the reply (read among the notifications), a
// generation read cannot tell a lost transaction's end (the muted ones
// were never sent).
func (m *Monitor) listen() error {
	m.mu.Lock()
	m.resyncing = true
	m.mu.Unlock()
	if err := m.conn.JoinGroup(unix.NFNLGRP_NFTABLES); err != nil {
		m.mu.Lock()
		m.resyncing = false
		m.mu.Unlock()
		return fmt.Errorf("join group NFNLGRP_NFTABLES: %w", err)
	}
	if err := m.resync(); err != nil {
		return fmt.Errorf("request the generation: %w", err)
	}
	return nil
}

// resync asks for the generation on the monitor's socket: the reader
// takes the reply as the generation now (and ignores the generations
// read before it, if resyncing). On error, resyncing ends.
func (m *Monitor) resync() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	req, err := requestGen(m.conn)
	if err != nil {
		m.resyncing, m.genReq = false, nil
		return err
	}
	m.resyncing, m.genReq, m.pid = true, &req.Header, req.Header.PID
	return nil
}

// generation returns the kernel's current nftables generation, read on
// the monitor's second socket.
func (m *Monitor) generation() (uint32, error) {
	msgs, err := m.genConn.Execute(genRequest())
	if err != nil {
		return 0, fmt.Errorf("read the nftables generation: %w", err)
	}
	for _, msg := range msgs {
		if msg.Header.Type == netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWGEN) && len(msg.Data) >= 4 {
			id, _, _ := parseGen(msg.Data[4:])
			return id, nil
		}
	}
	return 0, errors.New("read the nftables generation: no generation in the reply")
}

// setReceiveBuffer sets the socket's receive buffer to bytes, forced if
// allowed (root), else as much as the system allows.
func setReceiveBuffer(conn *netlink.Conn, bytes int) {
	rc, err := conn.SyscallConn()
	if err == nil {
		var serr error
		err = rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, bytes)
		})
		if err == nil && serr == nil {
			return
		}
	}
	_ = conn.SetReadBuffer(bytes)
}

// Monitor is a running monitor: the state shared by the reading
// goroutine, the repairing one, and the backend (Mute).
type Monitor struct {
	cfg    Config
	ctx    context.Context
	logger klog.Logger
	// conn receives the notifications; genConn reads the generation
	// (Mute).
	conn, genConn *netlink.Conn
	// muteMu serializes Mute calls, from Mute to its unmute.
	muteMu sync.Mutex
	mu     sync.Mutex
	// pending are the batches with watched changes not yet classified;
	// lost says notifications were lost.
	pending []Batch
	lost    bool
	// resyncing says that the generation was requested on conn (genReq:
	// the request's header) and its reply not read yet: generations read
	// until then do not show lost ones (Start, Mute).
	resyncing bool
	genReq    *netlink.Header
	// muteReq is the header of the request for the generation sent when
	// muting (Mute), until its reply is read.
	muteReq *netlink.Header
	// pid is the port ID of the monitor's socket: a NEWGEN message from
	// it is the reply to a request of the monitor's (the socket commits
	// nothing), never a transaction's end.
	pid uint32
	// lossAt is when the reader last read an overrun (ENOBUFS).
	lossAt time.Time
	// receive, if set, is what read receives from instead of conn (the
	// unit tests' seam).
	receive func() ([]netlink.Message, error)
	wake    chan struct{}
	done    chan struct{}
}

// read receives the notifications until the socket is closed. A
// transaction's notifications end with its NFT_MSG_NEWGEN message, whose
// generation is one more than the last transaction's (transactions commit
// one at a time): a generation skipped means that a transaction's end
// was lost with the socket's buffer overrun, and that the changes read
// since the last end may be of several transactions, of several
// programs: the batch it ends is Cut, and notifications were lost (the
// full check runs unless the batch is repaired: another program's).
// The kernel reports an overrun (ENOBUFS) once, before the messages
// still queued, and drops the next ones silently until they are read:
// the generation is what shows those. The generation is known from the
// reply to a request for it (Start, Mute's unmute: resyncing; until it,
// a skipped generation may be a muted one). Changes read before such a
// reply whose transaction's end was not read by then are another
// program's, whose commit ran beside the request (the request does not
// wait for commits): their batch is Cut, and notifications lost. The
// reply to Mute's request is compared with the last end read: a
// transaction counted before muting whose notifications came after the
// group was left shows as a generation not ended, and its changes lost.
func (m *Monitor) read(ctx context.Context) {
	receive := m.conn.Receive
	if m.receive != nil {
		receive = m.receive
	}
	var cur Batch
	var gen uint32
	known := false
	// lossAt is when the last overrun was read: the kernel drops
	// notifications until the socket is read empty, so a transaction
	// ending soon after may have lost some in its middle.
	var lossAt time.Time
	for {
		msgs, err := receive()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, unix.ENOBUFS) {
				lossAt = time.Now()
				m.mu.Lock()
				m.lossAt = lossAt
				m.mu.Unlock()
				m.post(nil, true)
				// The reply to a request for the generation may be
				// among what was dropped: it is asked for again once
				// the socket was read empty.
				time.AfterFunc(lossWindow, m.requestAgain)
				continue
			}
			m.logger.Error(err, "nftables monitor: cannot read the notifications: the periodic check stays")
			return
		}
		for _, msg := range msgs {
			if msg.Header.Type>>8 != unix.NFNL_SUBSYS_NFTABLES || len(msg.Data) < 4 {
				continue
			}
			typ := uint8(msg.Header.Type & 0xff)
			if typ == unix.NFT_MSG_NEWGEN {
				id, pid, name := parseGen(msg.Data[4:])
				reply, resyncing := m.genReply(msg.Header)
				switch reply {
				case staleReply:
					continue
				case resyncReply, muteReply:
					// The generation now (a resync's: after listening
					// again) or when muting. Changes whose end was not
					// read are another program's (the backend's
					// transactions end before it asks), committing
					// beside the request or before the mute: their end
					// is lost. At a mute's reply, a generation not ended
					// by a NEWGEN read is a transaction counted whose
					// notifications came after the group was left: lost
					// too.
					switch {
					case cur.Count > 0:
						m.logger.V(2).Info("nftables monitor: changes not ended at a reply to a request for the generation", "generation", id, "muting", reply == muteReply)
						b := cur
						b.Cut = true
						m.post(&b, true)
						cur = Batch{}
					case reply == muteReply && known && id != gen:
						m.logger.V(2).Info("nftables monitor: a transaction ended while muting", "generation", id, "last", gen)
						m.post(nil, true)
					}
					gen, known = id, true
					continue
				}
				if resyncing {
					known = false
				}
				skipped := known && id != gen && id != nextGen(gen)
				gen, known = id, true
				if skipped {
					m.logger.V(2).Info("nftables monitor: a transaction's end was lost", "generation", id)
				}
				if cur.Count > 0 {
					cur.PortID = msg.Header.PID
					cur.ProcPID, cur.ProcName = pid, name
					cur.Cut = skipped || !lossAt.IsZero() && time.Since(lossAt) < lossWindow
					b := cur
					m.post(&b, skipped)
				} else if skipped {
					m.post(nil, true)
				}
				cur = Batch{}
				continue
			}
			c, ok := parseChange(typ, msg.Data)
			if !ok || !m.cfg.Watch(c, msg.Data[4:]) {
				continue
			}
			cur.keep(c)
		}
	}
}

// nextGen returns the generation after g (the kernel skips 0 when it
// wraps).
func nextGen(g uint32) uint32 {
	if g+1 == 0 {
		return 1
	}
	return g + 1
}

// requestGen asks the kernel for the current generation on conn; the
// reply (an NFT_MSG_NEWGEN message) comes among the notifications. It
// returns the request as sent (its sequence number and the socket's port
// ID: the reply's).
func requestGen(conn *netlink.Conn) (netlink.Message, error) {
	return conn.Send(genRequest())
}

// genRequest is the request for the current nftables generation.
func genRequest() netlink.Message {
	return netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN), Flags: netlink.Request},
		Data:   []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
	}
}

// genReplyKind says which request for the generation a message answers.
type genReplyKind int

const (
	// notReply: a notification.
	notReply genReplyKind = iota
	// resyncReply: the request of Start or of an unmute (resync).
	resyncReply
	// muteReply: the request sent when muting (Mute).
	muteReply
	// staleReply: a request no longer waited for (asked again).
	staleReply
)

// genReply reports which request for the generation h is the header of
// the reply to (a resync's reply ends resyncing; any reply from the
// monitor's socket does while it resyncs), and whether the monitor is
// resyncing (before that reply).
func (m *Monitor) genReply(h netlink.Header) (genReplyKind, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case m.genReq != nil && h.PID == m.genReq.PID && h.Sequence == m.genReq.Sequence:
		m.resyncing, m.genReq = false, nil
		return resyncReply, false
	case m.muteReq != nil && h.PID == m.muteReq.PID && h.Sequence == m.muteReq.Sequence:
		m.muteReq = nil
		return muteReply, m.resyncing
	case m.pid != 0 && h.PID == m.pid && m.resyncing:
		// An earlier request of a resync asked again: its reply is
		// the generation after listening again too.
		m.resyncing, m.genReq = false, nil
		return resyncReply, false
	case m.pid != 0 && h.PID == m.pid:
		return staleReply, false
	}
	return notReply, m.resyncing
}

// requestAgain sends again the pending request for the generation of a
// resync, whose reply an overrun may have dropped (any reply ends the
// resync); a mute's is forgotten (the overrun makes the full check run).
func (m *Monitor) requestAgain() {
	m.mu.Lock()
	pending := m.genReq != nil
	m.muteReq = nil
	m.mu.Unlock()
	if !pending || m.ctx.Err() != nil {
		return
	}
	if err := m.resync(); err != nil {
		m.logger.V(2).Info("nftables monitor: cannot request the generation again after an overrun", "err", err)
	}
}

// post hands a batch (or the loss of notifications) to the loop.
func (m *Monitor) post(b *Batch, lost bool) {
	m.mu.Lock()
	if b != nil {
		m.pending = append(m.pending, *b)
	}
	m.lost = m.lost || lost
	m.mu.Unlock()
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// loop repairs, Settle after a foreign batch, with the backoff of a burst.
func (m *Monitor) loop(ctx context.Context) {
	var last time.Time
	var gap time.Duration
	var repairs int
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.wake:
		}
		if !sleep(ctx, m.cfg.Settle) {
			return
		}
		m.mu.Lock()
		pending, lost := m.pending, m.lost
		m.pending, m.lost = nil, false
		m.mu.Unlock()
		var foreign []Batch
		for _, b := range pending {
			if !m.cfg.Own(b) {
				foreign = append(foreign, b)
			}
		}
		if len(foreign) == 0 && !lost {
			continue
		}
		// The burst goes on if the previous repair was recent.
		if !last.IsZero() && time.Since(last) <= 2*max(gap, m.cfg.MinGap) {
			gap = min(max(2*gap, m.cfg.MinGap), m.cfg.MaxGap)
			if !sleep(ctx, time.Until(last.Add(gap))) {
				return
			}
			// What came meanwhile is repaired too (notifications lost
			// meanwhile: by the repair, or the check made for those
			// lost before).
			m.mu.Lock()
			for _, b := range m.pending {
				if !m.cfg.Own(b) {
					foreign = append(foreign, b)
				}
			}
			lost = lost || m.lost
			m.pending, m.lost = nil, false
			m.mu.Unlock()
			repairs++
			if repairs == 2 {
				m.logger.Info("Foreign changes keep coming: repairs are spaced out (backoff), logged at verbosity 2 until they stop", "maxGap", m.cfg.MaxGap)
			}
		} else {
			gap, repairs = 0, 1
		}
		last = time.Now()
		if len(foreign) == 0 {
			m.logger.V(2).Info("nftables notifications were lost: checking the rules fully")
			m.cfg.Lost()
			continue
		}
		why := foreign[0].String()
		if len(foreign) > 1 {
			why += fmt.Sprintf(" and %d more transactions", len(foreign)-1)
		}
		if lost {
			// The repair covers them too, and cannot be only of what
			// the batches name.
			why += "; nftables notifications were lost too"
			foreign = nil
		}
		if repairs == 1 {
			m.logger.Info("Rules changed by another program: repairing them", "change", why)
		} else {
			m.logger.V(2).Info("Rules changed by another program again: repairing them", "change", why, "repairs", repairs, "gap", gap)
		}
		m.cfg.Repair(why, foreign)
	}
}

// sleep waits d, or until ctx ends (false).
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// parseChange reads the family, table and chain of a notification of
// type typ (data: nfgenmsg and attributes); false for a type that names
// no table.
func parseChange(typ uint8, data []byte) (Change, bool) {
	c := Change{Type: typ, Family: data[0]}
	chainAttr := uint16(0)
	switch typ {
	case unix.NFT_MSG_NEWTABLE, unix.NFT_MSG_DELTABLE:
	case unix.NFT_MSG_NEWCHAIN, unix.NFT_MSG_DELCHAIN:
		chainAttr = unix.NFTA_CHAIN_NAME
	case unix.NFT_MSG_NEWRULE, unix.NFT_MSG_DELRULE:
		chainAttr = unix.NFTA_RULE_CHAIN
	case unix.NFT_MSG_NEWSET, unix.NFT_MSG_DELSET, unix.NFT_MSG_NEWSETELEM, unix.NFT_MSG_DELSETELEM,
		unix.NFT_MSG_NEWOBJ, unix.NFT_MSG_DELOBJ, unix.NFT_MSG_NEWFLOWTABLE, unix.NFT_MSG_DELFLOWTABLE:
	default:
		return c, false
	}
	ad, err := netlink.NewAttributeDecoder(data[4:])
	if err != nil {
		return c, false
	}
	for ad.Next() {
		switch ad.Type() {
		// The table is attribute 1 of every type of message above.
		case 1:
			c.Table = ad.String()
		case chainAttr:
			if chainAttr != 0 {
				c.Chain = ad.String()
			}
		}
	}
	return c, ad.Err() == nil && c.Table != ""
}

// parseGen reads the generation and the committing process of a
// NFT_MSG_NEWGEN message's attributes.
func parseGen(attrs []byte) (id, pid uint32, name string) {
	ad, err := netlink.NewAttributeDecoder(attrs)
	if err != nil {
		return 0, 0, ""
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_GEN_ID:
			id = ad.Uint32()
		case unix.NFTA_GEN_PROC_PID:
			pid = ad.Uint32()
		case unix.NFTA_GEN_PROC_NAME:
			name = ad.String()
		}
	}
	return id, pid, name
}

// typeName names a message type as nft monitor does.
func typeName(t uint8) string {
	names := map[uint8]string{
		unix.NFT_MSG_NEWTABLE: "add table", unix.NFT_MSG_DELTABLE: "delete table",
		unix.NFT_MSG_NEWCHAIN: "add chain", unix.NFT_MSG_DELCHAIN: "delete chain",
		unix.NFT_MSG_NEWRULE: "add rule", unix.NFT_MSG_DELRULE: "delete rule",
		unix.NFT_MSG_NEWSET: "add set", unix.NFT_MSG_DELSET: "delete set",
		unix.NFT_MSG_NEWSETELEM: "add element", unix.NFT_MSG_DELSETELEM: "delete element",
		unix.NFT_MSG_NEWOBJ: "add object", unix.NFT_MSG_DELOBJ: "delete object",
		unix.NFT_MSG_NEWFLOWTABLE: "add flowtable", unix.NFT_MSG_DELFLOWTABLE: "delete flowtable",
	}
	if n, ok := names[t]; ok {
		return n
	}
	return fmt.Sprintf("message %d", t)
}

// familyName names a table family as nft does.
func familyName(f uint8) string {
	switch f {
	case unix.NFPROTO_INET:
		return "inet"
	case unix.NFPROTO_IPV4:
		return "ip"
	case unix.NFPROTO_IPV6:
		return "ip6"
	case unix.NFPROTO_ARP:
		return "arp"
	case unix.NFPROTO_BRIDGE:
		return "bridge"
	case unix.NFPROTO_NETDEV:
		return "netdev"
	}
	return fmt.Sprintf("family %d", f)
}
