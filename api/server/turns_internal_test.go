package server

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"sigs.k8s.io/kpng/model"
)

// gatedStream is a stream whose sends wait until its gate is opened (or
// closed), counting them.
type gatedStream struct {
	grpc.ServerStream
	gate  chan struct{}
	sends atomic.Int32
}

func (g *gatedStream) SendMsg(any) error {
	<-g.gate
	g.sends.Add(1)
	return nil
}

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
	return s
}

// startShared starts sendShared for a new node-independent subscription
// of node on a gated stream; its result arrives on the channel.
func startShared(ctx context.Context, s *Server, node string) (*gatedStream, <-chan error) {
	g := &gatedStream{gate: make(chan struct{})}
	sub := s.hub.subscribe(node, true, nil)
	done := make(chan error, 1)
	go func() { done <- s.sendShared(ctx, sub, &rawSender{stream: g, sent: func(int) {}}) }()
	return g, done
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
	close(second.gate) // it would send at once, given a turn
	time.Sleep(200 * time.Millisecond)
	if n := second.sends.Load(); n != 0 {
		t.Fatalf("the second stream sent %d batches while the first held the only turn", n)
	}
	close(first.gate)
	if err := <-firstDone; err != nil {
		t.Fatal(err)
	}
	if err := <-secondDone; err != nil {
		t.Fatal(err)
	}
	if a, b := first.sends.Load(), second.sends.Load(); a < 3 || a != b {
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
	close(second.gate)
	select {
	case err := <-secondDone:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the second first state waited for a stream stuck in its first send")
	}
	if n := stuck.sends.Load(); n != 0 {
		t.Fatalf("the stuck stream sent %d batches", n)
	}
	close(stuck.gate)
	if err := <-stuckDone; err != nil {
		t.Fatal(err)
	}
	if n := len(s.firstStates); n != 0 {
		t.Errorf("%d turns still held after both first states (the stuck one's given back twice or not at all)", n)
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
