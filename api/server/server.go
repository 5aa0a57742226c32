package server

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/api/kpngv1"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

// Defaults of the gRPC server.
const (
	// DefaultBatchOps is the number of operations per Batch message.
	DefaultBatchOps = 1000
	// DefaultSendTimeout is how long a backend may take to accept a batch
	// before it is considered stalled and dropped.
	DefaultSendTimeout = 30 * time.Second
	// DefaultMaxConcurrentFirstStates is how many backends may be sent a
	// whole state (a first state, or all of a node's view again) at once;
	// the others wait their turn (node-independent streams too:
	// sendShared).
	DefaultMaxConcurrentFirstStates = 4
	// DefaultMaxStreamsPerNode is how many streams may watch one node's
	// view at once: a backend or two, and a reconnection overlapping.
	DefaultMaxStreamsPerNode = 4
	// batchBytes bounds the encoded size of a Batch: a batch is sent when
	// it holds DefaultBatchOps operations or this many bytes, well under
	// kpngv1.MaxBatchSize (a thousand services with large labels are more).
	batchBytes = 4 << 20
	// maxOpBytes is the largest operation a Batch can carry within
	// kpngv1.MaxBatchSize (the batch's own encoding aside).
	maxOpBytes = kpngv1.MaxBatchSize - 64
	// opOverhead bounds the encoding of an operation inside a Batch
	// beyond the operation itself: its field tag and length.
	opOverhead = 6
)

// Server implements the Controller gRPC service on top of a Hub.
type Server struct {
	kpngv1.UnimplementedControllerServer

	hub         *Hub
	batchOps    int
	sendTimeout time.Duration
	anyNode     []string
	// firstStates holds a token for each whole state being sent.
	firstStates chan struct{}
	// changeTurns holds a token for each per-node stream sending a round
	// of changes (one a P: serve).
	changeTurns chan struct{}
	// senders send the rounds of the node-independent streams that are
	// caught up (pool.go).
	senders *senders
	// turnHold is how long a send of a node-independent stream's first
	// state, or a per-node stream's round of changes, may take before it
	// gives its turn back (turnHold; tests change it).
	turnHold time.Duration
	// maxPerNode bounds byNode, the streams watching each node's view.
	maxPerNode int
	nodesMu    sync.Mutex
	byNode     map[string]int
	// watchdog drops the streams whose backend stopped reading.
	watchdog *watchdog
	// peers are the replicas' addresses the Peers call streams (nil:
	// the controller was not given them).
	peers *Peers
	// stopping is closed by Stop.
	stopping chan struct{}
	stopOnce sync.Once

	// The counters of Stats.
	connected                                             atomic.Int64
	connections, dropped, refused, sentBytes, sentBatches atomic.Uint64
}

// Options are a Server's settings; a field's zero value means its
// default.
type Options struct {
	// SendTimeout is how long a backend may take to accept a batch
	// before it is dropped (DefaultSendTimeout).
	SendTimeout time.Duration
	// MaxConcurrentFirstStates bounds the backends being sent a whole
	// state at once (DefaultMaxConcurrentFirstStates): on a per-node
	// stream each holds its node's view and its encoding in memory until
	// sent, so that many backends connecting at once would multiply the
	// controller's memory; on a node-independent stream (whose first
	// state is the shared snapshot) the turns keep the bytes in flight
	// within the machine's caches, and a slow backend gives its turn back
	// (sendShared). The others wait, holding nothing but their request.
	MaxConcurrentFirstStates int
	// MaxStreamsPerNode bounds the streams watching one node's view at
	// once (DefaultMaxStreamsPerNode; negative: no limit): each costs
	// the controller the node's view. Past it, a Watch is refused with
	// ResourceExhausted.
	MaxStreamsPerNode int
	// AnyNodeCommonNames are the common names of client certificates
	// without a node identity (CN=system:node:NAME, O=system:nodes) that
	// may watch any node's view; AnyCertificate allows them all. Other
	// certificates without a node identity are refused. A certificate
	// with one may only watch its node's view.
	AnyNodeCommonNames []string
	// Peers, if set, are the replicas' addresses the Peers call streams
	// to backends; without, that call answers FailedPrecondition.
	Peers *Peers
}

// Stats are a Server's counters since it was made, for its metrics.
type Stats struct {
	// Connected is the number of backends watching now; Connections the
	// number of Watch streams opened.
	Connected   int
	Connections uint64
	// Dropped is the number of streams the server ended: a backend that
	// did not read its stream for the send timeout, or a send that
	// failed while the backend was still there.
	Dropped uint64
	// Refused is the number of Watch and Peers requests refused: another
	// node's view than its certificate's, a certificate without a node
	// identity, a node name too long, a node with too many streams.
	Refused uint64
	// SentBytes and SentBatches are what was sent: the Batch messages
	// and their size in the protobuf encoding (before gRPC's framing).
	SentBytes, SentBatches uint64
	// The node-independent streams (Hub.SharedStats): the snapshots
	// encoded for first states, the streams started without one (their
	// client held the state), the streams sent one again after falling
	// behind the log of rounds; the snapshot batches compressed for the
	// streams that take deflated operations.
	Snapshots, Resumed, CaughtUp, Deflated uint64
}

// Stats returns the server's counters.
func (s *Server) Stats() Stats {
	sh := s.hub.SharedStats()
	return Stats{
		Connected: int(s.connected.Load()), Connections: s.connections.Load(), Dropped: s.dropped.Load(), Refused: s.refused.Load(),
		SentBytes: s.sentBytes.Load(), SentBatches: s.sentBatches.Load(),
		Snapshots: sh.Snapshots, Resumed: sh.Resumed, CaughtUp: sh.CaughtUp, Deflated: sh.Deflated,
	}
}

// NewServer returns a Server publishing hub's state with the default
// Options but for the send timeout (0 means DefaultSendTimeout).
func NewServer(hub *Hub, sendTimeout time.Duration) *Server {
	return New(hub, Options{SendTimeout: sendTimeout})
}

// New returns a Server publishing hub's state.
func New(hub *Hub, opts Options) *Server {
	if opts.SendTimeout <= 0 {
		opts.SendTimeout = DefaultSendTimeout
	}
	if opts.MaxConcurrentFirstStates <= 0 {
		opts.MaxConcurrentFirstStates = DefaultMaxConcurrentFirstStates
	}
	if opts.MaxStreamsPerNode == 0 {
		opts.MaxStreamsPerNode = DefaultMaxStreamsPerNode
	}
	s := &Server{
		hub: hub, batchOps: DefaultBatchOps, sendTimeout: opts.SendTimeout,
		anyNode: slices.Clone(opts.AnyNodeCommonNames), firstStates: make(chan struct{}, opts.MaxConcurrentFirstStates),
		changeTurns: make(chan struct{}, runtime.GOMAXPROCS(0)),
		maxPerNode:  opts.MaxStreamsPerNode, byNode: map[string]int{}, stopping: make(chan struct{}),
		watchdog: newWatchdog(opts.SendTimeout), peers: opts.Peers, turnHold: turnHold,
	}
	s.senders = newSenders(hub, s.stopping)
	return s
}

// Stop ends every Watch and Peers stream at once, and refuses new ones, with
// Unavailable ("the controller is stopping"): its backends move to another
// controller without waiting. A stream never ends by itself, so a
// grpc.Server's GracefulStop would otherwise wait for its connections to
// be cut, with the backends still watching a controller whose input has
// stopped. Call it before GracefulStop. It may be called more than once.
func (s *Server) Stop() {
	s.stopOnce.Do(func() { close(s.stopping) })
}

// errStopping is what a stream ended by Stop returns.
var errStopping = status.Error(codes.Unavailable, "the controller is stopping")

// Register registers s on a gRPC server.
func (s *Server) Register(g *grpc.Server) { kpngv1.RegisterControllerServer(g, s) }

// ServerOptions are the gRPC options the controller uses: message size
// limits; the codec that sends the node-independent stream's shared
// bytes without copying them (a Server registered without it cannot
// serve that stream); and the keepalive pings it allows: one every 5 s on
// a connection with a stream (client/remote pings after 10 s without
// receiving anything, to detect a controller gone without a reset; gRPC's
// default of 5 minutes would close such a client's connection as abusive);
// and the connections' write buffer (writeBufferBytes).
// Add credentials with grpc.Creds.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		codecOption(),
		grpc.WriteBufferSize(writeBufferBytes),
		grpc.MaxRecvMsgSize(kpngv1.MaxRequestSize), grpc.MaxSendMsgSize(kpngv1.MaxBatchSize),
		grpc.InitialWindowSize(kpngv1.WindowSize), grpc.InitialConnWindowSize(kpngv1.WindowSize),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second}),
	}
}

// writeBufferBytes is how many bytes a connection's writes gather before
// a write to its socket: a first state (megabytes) goes out in writes of
// this size, four times fewer than with gRPC's default of 32 KiB (with
// 5,000 first states, 13% less of the controller's CPU). gRPC takes the
// buffer from a pool for a write and gives it back after: a connection
// with nothing to send holds none.
const writeBufferBytes = 128 << 10

// Watch implements kpngv1.ControllerServer.
func (s *Server) Watch(req *kpngv1.WatchRequest, stream grpc.ServerStreamingServer[kpngv1.Batch]) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	select {
	case <-s.stopping:
		return errStopping
	default:
	}
	who := peerAddr(ctx)
	// The node name is the client's (up to the request's 64 KiB, any
	// bytes): logged bounded, on one line.
	node, err := authorize(ctx, req.GetNodeName(), s.anyNode)
	if err == nil {
		err = s.takeNodeSlot(node)
	}
	if err != nil {
		s.refused.Add(1)
		klog.ErrorS(err, "Refusing a backend", "node", model.LogValue(req.GetNodeName()), "peer", who)
		return err
	}
	logNode := model.LogValue(node)
	klog.InfoS("Backend connected", "node", logNode, "peer", who)
	s.connections.Add(1)
	s.connected.Add(1)
	defer s.connected.Add(-1)
	sub := s.hub.subscribe(node, req.GetNodeIndependent(), req.GetAcceptDeflated(), req.GetHaveState())
	defer s.hub.unsubscribe(sub)
	defer s.releaseNodeSlot(node) // before unsubscribing: Subscribers() tells the slot is free

	// The loop runs in its own goroutine so that a backend that stops
	// reading (Send blocked on flow control) can be dropped: returning from
	// Watch ends the stream, which unblocks Send.
	sent := func(bytes int) {
		s.sentBatches.Add(1)
		s.sentBytes.Add(uint64(bytes))
	}
	var sending *atomic.Int64 // the start of the send in progress
	var run func() error
	if sub.shared {
		out := &rawSender{stream: stream, sent: sent}
		sending, run = &out.sendingSince, func() error { return s.serveShared(ctx, sub, out) }
	} else {
		out := &batchSender{stream: stream, max: s.batchOps, sent: func(batch *kpngv1.Batch) { sent(proto.Size(batch)) }}
		sending, run = &out.sendingSince, func() error { return s.serve(ctx, sub, out) }
	}
	done := make(chan error, 1)
	go func() { done <- run() }()
	watched := s.watchdog.watch(sending)
	defer s.watchdog.forget(watched)
	select {
	case err := <-done:
		klog.InfoS("Backend disconnected", "node", logNode, "peer", who, "err", err)
		if errors.Is(err, context.Canceled) {
			return nil
		}
		if stream.Context().Err() == nil {
			s.dropped.Add(1) // the backend was still there
		}
		return err
	case <-s.stopping:
		klog.InfoS("Backend disconnected: the controller is stopping", "node", logNode, "peer", who)
		return errStopping
	case <-watched.expired:
		klog.ErrorS(nil, "Dropping a backend that stopped reading", "node", logNode, "peer", who, "timeout", s.sendTimeout)
		s.dropped.Add(1)
		return status.Errorf(codes.DeadlineExceeded, "backend did not read its stream for %v", s.sendTimeout)
	}
}

// peerAddr returns the address of the client behind ctx, for the logs.
func peerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok {
		return p.Addr.String()
	}
	return "unknown"
}

// takeNodeSlot counts a stream watching node's view, or refuses it past
// the limit.
func (s *Server) takeNodeSlot(node string) error {
	s.nodesMu.Lock()
	defer s.nodesMu.Unlock()
	if s.maxPerNode >= 0 && s.byNode[node] >= s.maxPerNode {
		return status.Errorf(codes.ResourceExhausted, "node %s already has %d streams watching its view (the controller's --max-streams-per-node)", model.Quote(node), s.byNode[node])
	}
	s.byNode[node]++
	return nil
}

func (s *Server) releaseNodeSlot(node string) {
	s.nodesMu.Lock()
	defer s.nodesMu.Unlock()
	if s.byNode[node]--; s.byNode[node] <= 0 {
		delete(s.byNode, node)
	}
}

// serve feeds one subscriber until ctx ends or sending fails.
func (s *Server) serve(ctx context.Context, sub *subscription, out *batchSender) error {
	// No retry timer: a failed send ends the stream.
	f := localsink.NewFeeder(out, localsink.FeederOptions{NoRetry: true})
	defer f.Close()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-sub.notify:
		}
		// A whole state waits for its turn (Options.MaxConcurrentFirstStates).
		if sub.wantsAll() {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case s.firstStates <- struct{}{}:
			}
			err := s.send(sub, f)
			<-s.firstStates
			if err != nil {
				return err
			}
			continue
		}
		if err := s.sendChanges(ctx, sub, f); err != nil {
			return err
		}
	}
}

// sendChanges sends a per-node stream's round of changes in a turn of its
// own (changeTurns, one a P), and lets the connection's writer run
// before giving the turn back: gRPC's writer (grpc-go v1.85's
// loopyWriter) takes a write buffer (writeBufferBytes) from a pool the
// connections share for a small message and yields to gather more before
// writing it and giving it back. Woken by one change, the goroutines of
// thousands of per-node streams each queued a message before any writer
// ran, and every connection held a buffer at once: one change to 400
// streams after a GC allocated 29 MiB, against 2.7 MiB for as many
// node-independent streams, whose senders yield the same way (pool.go).
// A round that takes longer than turnHold (a backend that does not read)
// gives the turn back, so that it holds no other stream's changes.
func (s *Server) sendChanges(ctx context.Context, sub *subscription, f *localsink.Feeder) error {
	return inTurn(ctx, nil, s.changeTurns, s.turnHold, func() error { return s.send(sub, f) })
}

// inTurn runs send, a few small messages to one stream, in a turn of
// tokens, then lets the connection's writer run before giving the turn
// back (see sendChanges); a send that takes longer than hold gives the
// turn back early while it goes on. It returns ctx's error if ctx ends,
// errStopping if stop (nil: never) is closed, while it waits for a turn.
func inTurn(ctx context.Context, stop <-chan struct{}, tokens chan struct{}, hold time.Duration, send func() error) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-stop:
		return errStopping
	case tokens <- struct{}{}:
	}
	t := &turn{tokens: tokens}
	t.held.Store(true)
	defer t.giveBack()
	slow := time.AfterFunc(hold, t.giveBack)
	err := send()
	slow.Stop()
	runtime.Gosched()
	return err
}

// serveShared feeds one node-independent stream until ctx ends or sending
// fails: the hub's shared bytes, as they are. Its first state waits for a
// turn (Options.MaxConcurrentFirstStates), and gives it back early when
// its backend reads slowly (turnHold).
func (s *Server) serveShared(ctx context.Context, sub *subscription, out *rawSender) error {
	// One channel to wait on, not a select of two: with thousands of
	// streams, each change wakes every one of them.
	stop := context.AfterFunc(ctx, sub.wake)
	defer stop()
	defer sub.close()
	for {
		<-sub.notify
		if err := ctx.Err(); err != nil {
			return err
		}
		handed, pooled, err := sub.fromPool()
		if pooled {
			continue // the senders' (a signal from before it was)
		}
		if err != nil {
			return fmt.Errorf("send to backend: %w", err)
		}
		for _, b := range handed {
			if err := out.send(b); err != nil {
				return fmt.Errorf("send to backend: %w", err)
			}
		}
		if err := s.sendShared(ctx, sub, out); err != nil {
			return err
		}
		// Caught up: its rounds go to the senders until they hand it
		// back.
		s.senders.take(sub, out)
	}
}

// turnHold is how long one send of a node-independent stream's first
// state, or a per-node stream's whole round of changes, may take before
// the stream gives its turn back: a backend reading that slowly, or not at
// all, would otherwise hold the others back, up to the send timeout.
const turnHold = 100 * time.Millisecond

// sendShared sends what a node-independent stream has to send next. Its
// first state waits for a turn, as a per-node stream's does, though not
// for memory (every stream sends the same snapshot) but for the machine's
// caches: measured with 5,000 backends starting at once, all of them
// sending together kept a socket buffer's worth of bytes in flight to
// each (up to a gigabyte in the kernel, written and read back cold),
// which cost the kernel a quarter more per byte than a few at a time,
// whose bytes are read back while the caches still hold them.
func (s *Server) sendShared(ctx context.Context, sub *subscription, out *rawSender) error {
	var t *turn
	if sub.wantsAll() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case s.firstStates <- struct{}{}:
		}
		t = &turn{tokens: s.firstStates}
		t.held.Store(true)
		defer t.giveBack()
	}
	for _, b := range s.hub.nextShared(sub) {
		var slow *time.Timer
		if t != nil && t.held.Load() {
			slow = time.AfterFunc(s.turnHold, t.giveBack)
		}
		err := out.send(b)
		if slow != nil {
			slow.Stop()
		}
		if err != nil {
			return fmt.Errorf("send to backend: %w", err)
		}
	}
	return nil
}

// turn is a node-independent stream's turn of the first states, a
// per-node stream's of the changes, or a Peers stream's of a list, given
// back once: when it is done, or by a timer when one send of the first
// state (sendShared), or the whole round of changes or the list (inTurn),
// takes longer than its hold.
type turn struct {
	tokens chan struct{}
	held   atomic.Bool
}

func (t *turn) giveBack() {
	if t.held.CompareAndSwap(true, false) {
		<-t.tokens
	}
}

// rawSender sends encoded Batch messages on a stream.
type rawSender struct {
	stream grpc.ServerStream
	// sendingSince is the start time (Unix ns) of the Send in progress, 0
	// when none is.
	sendingSince atomic.Int64
	sent         func(bytes int)
}

func (r *rawSender) send(m message) error {
	r.sendingSince.Store(time.Now().UnixNano())
	err := r.stream.SendMsg(rawBatch(m))
	r.sendingSince.Store(0)
	if err == nil {
		r.sent(m.size())
	}
	return err
}

// send sends sub's pending changes through f, if a state was published.
func (s *Server) send(sub *subscription, f *localsink.Feeder) error {
	keys, states, cluster, triggers, ok := s.hub.pending(sub)
	if !ok {
		return nil
	}
	f.SetCluster(cluster)
	for i, key := range keys {
		f.Update(key, states[i])
	}
	for key, times := range triggers {
		f.Triggered(key, times...)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("send to backend: %w", err)
	}
	return nil
}

// batchSender is the sending edge of the wire format: a localsink.Sink that
// turns each service's change into per-endpoint operations (which save
// bytes when one endpoint of a large service changes) in Batch messages on
// a stream, and the changes' trigger times (localsink.TriggerSink) into the
// round's Sync. A batch is sent when full and at each Sync. The first
// error stops all further sends and is returned by every later Sync.
type batchSender struct {
	stream   grpc.ServerStreamingServer[kpngv1.Batch]
	max      int
	ops      []*kpngv1.Op
	bytes    int // the encoded size of ops in a Batch
	triggers []*kpngv1.Triggers
	err      error
	// cluster is the cluster-level facts of the round, sent on its Sync
	// (when clusterSet).
	cluster    *kpngv1.Cluster
	clusterSet bool
	// sendingSince is the start time (Unix ns) of the Send in progress, 0
	// when none is.
	sendingSince atomic.Int64
	// sent, if set, is called with each batch sent.
	sent func(*kpngv1.Batch)
	// omitted are the services left out as too large for a message.
	omitted map[model.ServiceKey]bool
}

// add adds op to the batch, sending the batch first when op would take it
// past batchBytes, and after when it holds max operations.
func (b *batchSender) add(op *kpngv1.Op) {
	n := proto.Size(op) + opOverhead
	if len(b.ops) > 0 && b.bytes+n > batchBytes {
		b.flush()
	}
	b.ops = append(b.ops, op)
	b.bytes += n
	if len(b.ops) >= b.max {
		b.flush()
	}
}

func (b *batchSender) flush() {
	if b.err != nil || len(b.ops) == 0 {
		b.ops, b.bytes = b.ops[:0], 0
		return
	}
	b.sendingSince.Store(time.Now().UnixNano())
	batch := &kpngv1.Batch{Ops: b.ops}
	b.err = b.stream.Send(batch)
	b.sendingSince.Store(0)
	if b.err == nil && b.sent != nil {
		b.sent(batch)
	}
	b.ops, b.bytes = nil, 0
}

// Reset implements localsink.Sink.
func (b *batchSender) Reset() { b.add(&kpngv1.Op{Op: &kpngv1.Op_Reset_{Reset_: &kpngv1.Reset{}}}) }

// SetCluster implements localsink.ClusterSink: the facts go on the
// round's Sync operation (an older client ignores them).
func (b *batchSender) SetCluster(c *model.Cluster) {
	b.cluster, b.clusterSet = kpngv1.FromCluster(c), true
}

// Update implements localsink.Sink with the wire's operations (serviceOps).
// A service left out (too large for a message) is new to the backend when
// it is sent again.
func (b *batchSender) Update(key model.ServiceKey, prev, cur *model.ServiceEndpoints) {
	if b.omitted[key] {
		prev = nil
		delete(b.omitted, key)
	}
	if !serviceOps(key, prev, cur, b.add) {
		if b.omitted == nil {
			b.omitted = map[model.ServiceKey]bool{}
		}
		b.omitted[key] = true
	}
}

// serviceOps turns one service's change into the wire's operations, in
// order: set_service when the service is new or changed, delete_endpoint
// for the endpoints gone, set_endpoint for the new and changed ones; for a
// deleted service, delete_endpoint for each endpoint, then delete_service.
// A service too large for a message (labels of megabytes, from a state
// file) is not sent: an error log names it, and the backend loses what it
// had of it; serviceOps then returns false.
func serviceOps(key model.ServiceKey, prev, cur *model.ServiceEndpoints, add func(*kpngv1.Op)) (sent bool) {
	wireKey := kpngv1.FromServiceKey(key)
	if cur != nil && (prev == nil || (prev.Service != cur.Service && !reflect.DeepEqual(prev.Service, cur.Service))) {
		op := &kpngv1.Op{Op: &kpngv1.Op_SetService{SetService: kpngv1.FromService(cur.Service)}}
		if n := proto.Size(op); n > maxOpBytes {
			klog.ErrorS(nil, "A service is larger than a message to a backend may be: the backend does not get it",
				"service", key, "bytes", n, "limit", maxOpBytes)
			if prev == nil {
				return false
			}
			defer func() { sent = false }()
			cur = nil
		} else {
			add(op)
		}
	}
	removed, set := localsink.EndpointChanges(prev, cur)
	for _, ep := range removed {
		add(&kpngv1.Op{Op: &kpngv1.Op_DeleteEndpoint{DeleteEndpoint: &kpngv1.EndpointKey{Service: wireKey, Key: ep.Key()}}})
	}
	for _, ep := range set {
		add(&kpngv1.Op{Op: &kpngv1.Op_SetEndpoint{SetEndpoint: &kpngv1.SetEndpoint{
			Service: wireKey, Key: ep.Key(), Endpoint: kpngv1.FromEndpoint(ep),
		}}})
	}
	if cur == nil {
		add(&kpngv1.Op{Op: &kpngv1.Op_DeleteService{DeleteService: wireKey}})
	}
	return true
}

// Triggered implements localsink.TriggerSink: the times go in the round's
// Sync.
func (b *batchSender) Triggered(key model.ServiceKey, times []time.Time) {
	b.triggers = append(b.triggers, kpngv1.FromTriggers(key, times))
}

// Sync implements localsink.Sink: it ends the round on the wire and sends
// it, returning the stream's error.
func (b *batchSender) Sync() error {
	sync := &kpngv1.Sync{Triggers: b.triggers}
	b.triggers = nil
	if b.clusterSet {
		sync.Cluster, b.cluster, b.clusterSet = b.cluster, nil, false
	}
	b.add(&kpngv1.Op{Op: &kpngv1.Op_Sync{Sync: sync}})
	b.flush()
	return b.err
}
