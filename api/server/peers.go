package server

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/api/kpngv1"
)

// Peers holds the addresses of a controller's replicas that its Peers call
// streams to backends. The controller sets them from the EndpointSlices of
// its own Service (to-api --peers-service); the zero value is not usable:
// call NewPeers.
type Peers struct {
	mu    sync.Mutex
	ips   []string
	known bool
	// changed is closed, and replaced, when ips change.
	changed chan struct{}
	// turns holds a token for each stream sending (send).
	turns chan struct{}
}

// NewPeers returns a Peers that knows no address yet: a Peers stream
// sends its first list once Set is called.
func NewPeers() *Peers {
	return &Peers{changed: make(chan struct{}), turns: make(chan struct{}, runtime.GOMAXPROCS(0))}
}

// Set replaces the replicas' addresses, IP addresses (checked and put in
// order by kpngv1.PeerIPs, as backends check them: a list it refuses is an
// error, and nothing is replaced). The streams are sent the list when it
// differs from the last.
func (p *Peers) Set(ips []string) error {
	list, err := kpngv1.PeerIPs(ips)
	if err != nil {
		return fmt.Errorf("the controller's replicas: %w", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.known && slices.Equal(p.ips, list) {
		return nil
	}
	p.ips, p.known = list, true
	close(p.changed)
	p.changed = make(chan struct{})
	return nil
}

// current returns the addresses, whether Set was called yet, and a channel
// closed at the next change.
func (p *Peers) current() ([]string, bool, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ips, p.known, p.changed
}

// Peers implements kpngv1.ControllerServer: the replicas' addresses as soon
// as they are known, then each change, until the backend goes or the
// controller stops. A client that may not watch any view is refused, as by
// Watch, and counted with the refused Watch calls. (A backend that stops
// reading blocks its Peers stream's send: a list is a few hundred bytes,
// sent when the replicas change, and the stream ends with its connection.)
func (s *Server) Peers(_ *kpngv1.PeersRequest, stream grpc.ServerStreamingServer[kpngv1.PeerAddresses]) error {
	ctx := stream.Context()
	select {
	case <-s.stopping:
		return errStopping
	default:
	}
	if err := authorizePeers(ctx, s.anyNode); err != nil {
		s.refused.Add(1)
		klog.ErrorS(err, "Refusing a backend's Peers call", "peer", peerAddr(ctx))
		return err
	}
	if s.peers == nil {
		return status.Error(codes.FailedPrecondition, "this controller was not given its replicas' Service (to-api --peers-service)")
	}
	var sent []string
	first := true
	for {
		ips, known, changed := s.peers.current()
		if known && (first || !slices.Equal(ips, sent)) {
			if err := s.peers.send(ctx, s.stopping, stream, ips); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			sent, first = ips, false
		}
		select {
		case <-ctx.Done():
			return nil
		case <-s.stopping:
			return errStopping
		case <-changed:
		}
	}
}

// send sends ips on stream in turn with the other Peers streams
// (inTurn): a change of the replicas wakes every stream's goroutine at
// once, and gRPC's writer of each connection takes a write buffer
// (writeBufferBytes) from the pool the connections share for a small
// message and yields before writing it (see sendChanges), so that at
// 5,000 backends the writers held a buffer each: some 600 MB, 0.6–0.7 s
// of CPU a change, mostly the collector's, the last backend holding it up
// to 1.1 s after the API call. At most one stream a P sends at once, and
// lets its connection's writer run before the next; a send that takes
// stallAfter gives its turn to the next while it goes on (gRPC's Send
// blocks once the stream's write quota is full, its backend not reading;
// a sender descheduled that long lets one more through).
func (p *Peers) send(ctx context.Context, stop <-chan struct{}, stream grpc.ServerStreamingServer[kpngv1.PeerAddresses], ips []string) error {
	return inTurn(ctx, stop, p.turns, stallAfter, func() error { return stream.Send(&kpngv1.PeerAddresses{Ips: ips}) })
}
