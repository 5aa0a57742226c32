package server

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"

	"sigs.k8s.io/kpng/api/kpngv1"
)

// gatedPeersStream is a Peers stream whose sends block until open is
// closed; entered is closed when the first send starts.
type gatedPeersStream struct {
	grpc.ServerStream
	open, entered chan struct{}
	sent          [][]string
}

func (g *gatedPeersStream) Send(m *kpngv1.PeerAddresses) error {
	select {
	case <-g.entered:
	default:
		close(g.entered)
	}
	<-g.open
	g.sent = append(g.sent, m.GetIps())
	return nil
}

// TestStuckPeersSendGivesItsTurnBack: with one turn, a Peers stream whose
// backend stopped reading (its send blocks) gives its turn to the next
// after stallAfter, so that the others are sent a change of the replicas
// while it waits; once it is sent, the turn is free and given back once.
// Kept until the send ended, the turn would hold every other Peers stream
// back up to the send timeout.
func TestStuckPeersSendGivesItsTurnBack(t *testing.T) {
	p := NewPeers()
	p.turns = make(chan struct{}, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ips := []string{"10.0.0.1"}
	stuck := &gatedPeersStream{open: make(chan struct{}), entered: make(chan struct{})}
	stuckDone := make(chan error, 1)
	go func() { stuckDone <- p.send(ctx, nil, stuck, ips) }()
	select {
	case <-stuck.entered:
	case <-ctx.Done():
		t.Fatal("the first stream's send did not start")
	}
	next := &gatedPeersStream{open: make(chan struct{}), entered: make(chan struct{})}
	close(next.open)
	if err := p.send(ctx, nil, next, ips); err != nil || len(next.sent) != 1 {
		t.Fatalf("the next stream's send, with the first stuck: %v, sent %v", err, next.sent)
	}
	close(stuck.open)
	select {
	case err := <-stuckDone:
		if err != nil || len(stuck.sent) != 1 {
			t.Fatalf("the stuck stream's send once its backend read: %v, sent %v", err, stuck.sent)
		}
	case <-ctx.Done():
		t.Fatal("the stuck stream's send did not end once its backend read (its turn given back twice?)")
	}
	if n := len(p.turns); n != 0 {
		t.Errorf("%d turns held after both sends (one given back twice or not at all)", n)
	}
	// A stream waiting for a turn ends with its backend.
	p.turns <- struct{}{}
	gone, stop := context.WithCancel(ctx)
	stop()
	if err := p.send(gone, nil, next, ips); err == nil || len(next.sent) != 1 {
		t.Errorf("a send waiting for a turn after its backend went: %v, sent %v", err, next.sent)
	}
}
