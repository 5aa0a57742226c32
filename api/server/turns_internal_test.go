package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"sigs.k8s.io/kpng/api/kpngv1"
	"sigs.k8s.io/kpng/model"
)

// sharedServer returns a Server with one turn of the first states and a
// published state of many services (a first state of several batches).
func sharedServer(t *testing.T, hold time.Duration) *Server {
	t.Helper()
	h := NewHub(true)
	for i := range 2000 {
		name := fmt.Sprintf("s%04d", i)
		h.Update(model.ServiceKey{Namespace: "ns", Name: name}, nil, internalSvc(name, fmt.Sprintf("%0200d", i)))
	}
	if err := h.Sync(); err != nil {
		t.Fatal(err)
	}
	s := New(h, Options{MaxConcurrentFirstStates: 1})
	s.turnHold = hold
	t.Cleanup(s.Stop)
	return s
}

// startShared starts sendShared for a new node-independent subscription
// of node on a stream whose sends wait until it is opened; the result
// arrives on the channel.
func startShared(ctx context.Context, s *Server, node string) (*recordingStream, <-chan error) {
	r := newRecordingStream(false)
	sub := s.hub.subscribe(node, true, false, nil)
	done := make(chan error, 1)
	go func() { done <- s.sendShared(ctx, sub, &rawSender{stream: r, sent: func(int) {}}) }()
	return r, done
}

// ended waits up to 10 s for a stream's result, failing the test with
// why when none comes.
func ended(t *testing.T, done <-chan error, why string) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal(why)
	}
}

// TestSharedFirstStatesTakeTurns: with one turn, a node-independent
// stream's first state waits while another's is being sent, and is sent
// once that one is done. Without turns the second is sent at once.
func TestSharedFirstStatesTakeTurns(t *testing.T) {
	s := sharedServer(t, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first, firstDone := startShared(ctx, s, "node-a")
	waitUntil(t, "the first stream to hold the turn", func() bool { return len(s.firstStates) == 1 })
	second, secondDone := startShared(ctx, s, "node-b")
	second.setOpen() // it would send at once, given a turn
	time.Sleep(200 * time.Millisecond)
	if _, n := second.last(); n != 0 {
		t.Fatalf("the second stream sent %d batches while the first held the only turn", n)
	}
	first.setOpen()
	ended(t, firstDone, "the first stream's first state did not end once it read")
	ended(t, secondDone, "the second stream's first state did not end once the first's had")
	_, a := first.last()
	_, b := second.last()
	if a < 3 || a != b {
		t.Errorf("first states of %d and %d batches, want the same, several", a, b)
	}
	if n := len(s.firstStates); n != 0 {
		t.Errorf("%d turns still held after both first states", n)
	}
}

// TestSlowSharedFirstStateGivesItsTurnBack: a stream whose backend does
// not read its first state gives its turn back after turnHold, so that
// the next stream's first state is sent while the first is still stuck.
// Kept until the send ends, the turn would hold the second back.
func TestSlowSharedFirstStateGivesItsTurnBack(t *testing.T) {
	s := sharedServer(t, 50*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stuck, stuckDone := startShared(ctx, s, "node-a")
	waitUntil(t, "the stuck stream to hold the turn", func() bool { return len(s.firstStates) == 1 })
	second, secondDone := startShared(ctx, s, "node-b")
	second.setOpen()
	ended(t, secondDone, "the second first state waited for a stream stuck in its first send")
	if _, n := stuck.last(); n != 0 {
		t.Fatalf("the stuck stream sent %d batches", n)
	}
	stuck.setOpen()
	ended(t, stuckDone, "the stuck stream's first state did not end once it read (its turn given back twice?)")
	if n := len(s.firstStates); n != 0 {
		t.Errorf("%d turns still held after both first states (the stuck one's given back twice or not at all)", n)
	}
}

// TestStuckPerNodeStreamGivesItsChangeTurnBack: with one turn of the
// changes, a per-node stream whose backend stops reading in the middle of
// a change gives its turn back after turnHold, so that another stream is
// sent the next change while the first is still stuck; once its backend
// reads again, the stuck stream gets the changes too and the turn is
// free. Kept until the send ended, the turn would hold every other
// per-node stream's changes back, up to the send timeout.
func TestStuckPerNodeStreamGivesItsChangeTurnBack(t *testing.T) {
	h := NewHub(true)
	change := func(label string) {
		t.Helper()
		h.Update(model.ServiceKey{Namespace: "ns", Name: "a"}, nil, internalSvc("a", label))
		if err := h.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	change("first")
	s := New(h, Options{})
	s.turnHold = 50 * time.Millisecond
	s.changeTurns = make(chan struct{}, 1)
	t.Cleanup(s.Stop)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 2)
	start := func(node string) *recordingStream {
		r := newRecordingStream(true)
		sub := s.hub.subscribe(node, false, false, nil)
		t.Cleanup(func() { s.hub.unsubscribe(sub) })
		go func() { done <- s.serve(ctx, sub, &batchSender{stream: r, max: DefaultBatchOps}) }()
		return r
	}

	stuck := start("stuck")
	waitUntil(t, "the stuck stream's first state", func() bool { return stuck.holds("first") })
	stuck.mu.Lock()
	stuck.open = false
	stuck.mu.Unlock()
	change("second")
	waitUntil(t, "the stuck stream in its send of a change", func() bool {
		stuck.mu.Lock()
		defer stuck.mu.Unlock()
		return stuck.waiting > 0
	})
	other := start("node-a")
	waitUntil(t, "the other stream's first state", func() bool { return other.holds("second") })
	change("third")
	waitUntil(t, "the other stream's change while the first is stuck", func() bool { return other.holds("third") })
	if stuck.holds("second") {
		t.Fatal("the stuck stream was sent a change through a shut gate")
	}
	stuck.setOpen()
	waitUntil(t, "the stuck stream's changes once it reads", func() bool { return stuck.holds("third") })
	waitUntil(t, "the turn of the changes free", func() bool { return len(s.changeTurns) == 0 })
	cancel()
	for range 2 {
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("a stream ended with %v, want its context's end", err)
		}
	}
}

// waitUntil polls cond for up to 10 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// recordingStream is a stream whose sends wait while its gate is shut
// and record what they send: a node-independent stream's encoded
// batches, a per-node stream's Batch messages.
type recordingStream struct {
	grpc.ServerStream
	mu      sync.Mutex
	open    bool
	cond    *sync.Cond
	sent    []rawBatch
	batches []*kpngv1.Batch
	// waiting counts the sends waiting for the gate.
	waiting int
}

// Send sends a per-node stream's Batch.
func (r *recordingStream) Send(b *kpngv1.Batch) error { return r.SendMsg(b) }

func newRecordingStream(open bool) *recordingStream {
	r := &recordingStream{open: open}
	r.cond = sync.NewCond(&r.mu)
	return r
}

func (r *recordingStream) SendMsg(m any) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for !r.open {
		r.waiting++
		r.cond.Wait()
		r.waiting--
	}
	switch m := m.(type) {
	case rawBatch:
		r.sent = append(r.sent, m)
	case *kpngv1.Batch:
		r.batches = append(r.batches, proto.Clone(m).(*kpngv1.Batch))
	}
	return nil
}

// holds tells whether a per-node stream was sent a Batch mentioning s.
func (r *recordingStream) holds(s string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, b := range r.batches {
		if strings.Contains(b.String(), s) {
			return true
		}
	}
	return false
}

func (r *recordingStream) setOpen() {
	r.mu.Lock()
	r.open = true
	r.mu.Unlock()
	r.cond.Broadcast()
}

// last returns the last message sent and how many were.
func (r *recordingStream) last() (rawBatch, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.sent) == 0 {
		return nil, 0
	}
	return r.sent[len(r.sent)-1], len(r.sent)
}

// TestCaughtUpStreamsAreSentByThePool: once its first state is sent, a
// node-independent stream is the senders'; a stream whose backend stops
// reading blocks one sender, which another replaces, so that the other
// streams get every round at once; when the stuck stream's backend reads
// again, its own goroutine sends it the rounds it missed, in order, up to
// the last. Without the replacement, the other streams would wait (one
// sender); without the hand back, the stuck stream would get no more.
func TestCaughtUpStreamsAreSentByThePool(t *testing.T) {
	s := sharedServer(t, time.Hour)
	s.senders.n = 1
	s.senders.stall = 20 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	streams := map[string]*recordingStream{"node-a": newRecordingStream(true), "node-b": newRecordingStream(true), "stuck": newRecordingStream(true)}
	subs := map[string]*subscription{}
	done := make(chan error, len(streams))
	for node, r := range streams {
		sub := s.hub.subscribe(node, true, false, nil)
		subs[node] = sub
		go func() { done <- s.serveShared(ctx, sub, &rawSender{stream: r, sent: func(int) {}}) }()
	}
	for node, sub := range subs {
		waitUntil(t, node+"'s stream caught up and pooled", func() bool {
			sub.mu.Lock()
			defer sub.mu.Unlock()
			return sub.pooled
		})
	}
	streams["stuck"].mu.Lock()
	streams["stuck"].open = false
	streams["stuck"].mu.Unlock()

	round := func(i int) {
		name := fmt.Sprintf("s%04d", i)
		s.hub.Update(model.ServiceKey{Namespace: "ns", Name: name}, nil, internalSvc(name, "changed"))
		if err := s.hub.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	latest := func() rawBatch {
		s.hub.mu.RLock()
		defer s.hub.mu.RUnlock()
		r := s.hub.log[len(s.hub.log)-1]
		return rawBatch(r.batches[len(r.batches)-1])
	}
	same := func(a, b rawBatch) bool {
		return len(a) > 0 && len(b) > 0 && &a[0].ReadOnlyData()[0] == &b[0].ReadOnlyData()[0]
	}
	for i := range 5 {
		round(i)
		want := latest()
		for _, node := range []string{"node-a", "node-b"} {
			waitUntil(t, fmt.Sprintf("%s to get round %d", node, i), func() bool { m, _ := streams[node].last(); return same(m, want) })
		}
	}
	_, before := streams["stuck"].last()
	streams["stuck"].setOpen()
	want := latest()
	waitUntil(t, "the stuck stream to get the last round once it reads", func() bool { m, _ := streams["stuck"].last(); return same(m, want) })
	if _, n := streams["stuck"].last(); n != before+5 {
		t.Errorf("the stuck stream was sent %d messages after it read again, want the 5 rounds", n-before)
	}
	round(5)
	want = latest()
	for node := range streams {
		waitUntil(t, node+" to get a round after", func() bool { m, _ := streams[node].last(); return same(m, want) })
	}
	cancel()
	for range streams {
		if err := <-done; err != context.Canceled {
			t.Errorf("a stream ended with %v, want context.Canceled", err)
		}
	}
}

// TestBlockedSenderHandsTheRestBack: a sender whose send blocks past the
// stall time hands the stream back to its own goroutine with the
// messages it has not sent, in order, and leaves the pool.
func TestBlockedSenderHandsTheRestBack(t *testing.T) {
	s := sharedServer(t, time.Hour)
	s.senders.n = 0 // no sender running: serve is called below
	s.senders.stall = 20 * time.Millisecond
	sub := s.hub.subscribe("node-a", true, false, nil)
	r := newRecordingStream(true)
	out := &rawSender{stream: r, sent: func(int) {}}
	if err := s.sendShared(context.Background(), sub, out); err != nil {
		t.Fatal(err)
	}
	s.senders.take(sub, out)
	if s.senders.pop() != sub { // take's own signal
		t.Fatal("take did not queue the stream")
	}
	sub.mu.Lock()
	sub.queued = false
	sub.mu.Unlock()
	r.mu.Lock()
	r.open = false
	r.mu.Unlock()
	var rounds []rawBatch
	for i := range 3 {
		name := fmt.Sprintf("s%04d", i)
		s.hub.Update(model.ServiceKey{Namespace: "ns", Name: name}, nil, internalSvc(name, "changed"))
		if err := s.hub.Sync(); err != nil {
			t.Fatal(err)
		}
		s.hub.mu.RLock()
		rounds = append(rounds, rawBatch(s.hub.log[len(s.hub.log)-1].batches[0]))
		s.hub.mu.RUnlock()
	}
	stayed := make(chan bool, 1)
	go func() { stayed <- s.senders.newSender().serve(sub) }()
	time.Sleep(100 * time.Millisecond) // past the stall time, blocked
	r.setOpen()
	if <-stayed {
		t.Error("a sender that blocked stayed in the pool")
	}
	handed, pooled, err := sub.fromPool()
	if pooled || err != nil {
		t.Fatalf("after the blocked send: pooled %v, err %v; want handed back, no error", pooled, err)
	}
	if len(handed) != 2 || &handed[0][0].ReadOnlyData()[0] != &rounds[1][0].ReadOnlyData()[0] || &handed[1][0].ReadOnlyData()[0] != &rounds[2][0].ReadOnlyData()[0] {
		t.Errorf("handed back %d messages, want rounds 2 and 3 in order", len(handed))
	}
	if m, _ := r.last(); len(m) == 0 || &m[0].ReadOnlyData()[0] != &rounds[0][0].ReadOnlyData()[0] {
		t.Error("the blocked send was not round 1's")
	}
	select {
	case <-sub.notify:
	default:
		t.Error("the stream's own goroutine was not woken")
	}
}
