// Package remote is the backend side of the kpng API: it connects to a kpng
// controller (`kpng ... to-api`), watches the state for its node and feeds a
// localsink.Sink, reconnecting when the controller goes away: to the next
// controller at once when it was given several, with backoff once all of
// them have failed in a row.
//
// A reconnection does not make the backend start over: the client keeps a
// mirror of what the sink holds, and after the controller (the same or
// another) has sent its whole state, the sink receives only the
// difference.
package remote

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/api/address"
	"sigs.k8s.io/kpng/api/certs"
	"sigs.k8s.io/kpng/api/kpngv1"
	"sigs.k8s.io/kpng/localsink"
)

// Keepalive of the connections to a controller: after KeepaliveTime
// without receiving anything, the client pings, and closes the connection
// when nothing comes back within KeepaliveTimeout (gRPC's TCP_USER_TIMEOUT
// is set to it too). A controller that died without a TCP reset (a node
// powered off, a pod's address gone) is so detected within KeepaliveTime +
// KeepaliveTimeout of its last message; one killed or whose connection was
// reset is detected at once. gRPC refuses a ping time below 10 s, and the
// controller must allow pings this often (api/server.ServerOptions). The
// timeout leaves room for a controller busy with thousands of first
// states: with 5 s, 38 of 5,000 backends (kpng-scale) that had their
// first state and nothing since for 10 s gave up on a controller that was
// still sending the others theirs.
const (
	KeepaliveTime    = 10 * time.Second
	KeepaliveTimeout = 20 * time.Second
)

// Config configures a connection to a controller, or to one of several.
type Config struct {
	// Address is the controller's address: a unix socket
	// ("unix:///var/run/kpng/kpng.sock") or host:port; or several,
	// separated by commas, for controllers any of which can serve this
	// backend (replicas). A host name resolving to several addresses
	// counts as one controller address served by all of them (round_robin:
	// a connection to each, a new stream on one that is up); the name is
	// resolved again every ResolvePeriod and at once (ResolveNowGap at
	// most) when a connection fails, and the replicas its controllers
	// tell (their Peers call) are added to its addresses.
	Address string
	// NodeName is this backend's node.
	NodeName string
	// TLSCA verifies the controller's certificate (PEM file); empty means
	// the system roots. TLSCert and TLSKey are this client's certificate,
	// for controllers that require one.
	TLSCA, TLSCert, TLSKey string
	// TLSServerName overrides the name checked in the server certificate.
	TLSServerName string
	// Insecure allows plain TCP to a loopback address.
	Insecure bool
	// MinBackoff and MaxBackoff bound the delay between reconnections
	// once every address has failed in a row (defaults 500ms and 30s).
	MinBackoff, MaxBackoff time.Duration
	// Observe, if set, receives the record of each round delivered to the
	// sink, and Queued the time each round with changes was queued (see
	// localsink.FeederOptions).
	Observe func(localsink.Round)
	Queued  func(time.Time)
	// PerNodeView asks the controller for the node's view computed by the
	// controller, as clients did before node-independent streams (each
	// node's view encoded on its own: a cost for the controller that grows
	// with the nodes), for tests and comparisons. By default the client
	// asks for the state every node shares and computes its view itself.
	PerNodeView bool
	// Watching, if set, is called with a controller's address (as in
	// Address) when a stream to it receives its first sync, its whole
	// state, before the sink is given the difference: from then on the
	// backend follows that controller. It must not block.
	Watching func(address string)

	// resolve is how host names are resolved (tests set their own).
	resolve resolveConfig
}

// Target is how to reach one of the controller addresses of a Config.
type Target struct {
	// Address is the address as given.
	Address string
	// Target is the gRPC dial target, Options its dial options.
	Target  string
	Options []grpc.DialOption

	// names is the resolver of a name (nil for an IP address or a
	// socket): Run gives it the replicas the controllers tell.
	names *resolverBuilder
}

// Targets returns, for each controller address of c in order, the gRPC
// dial target and options.
func (c Config) Targets() ([]Target, error) {
	var out []Target
	for _, a := range strings.Split(c.Address, ",") {
		a = strings.TrimSpace(a)
		if a == "" && strings.Contains(c.Address, ",") {
			return nil, fmt.Errorf("API addresses %q: empty address in the list", c.Address)
		}
		t, err := c.dialOptions(a)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

// DialOptions returns the gRPC dial target and options for c's address. A
// Config with several addresses is an error: see Targets.
func (c Config) DialOptions() (string, []grpc.DialOption, error) {
	targets, err := c.Targets()
	if err != nil {
		return "", nil, err
	}
	if len(targets) != 1 {
		return "", nil, fmt.Errorf("API addresses %q: %d addresses, DialOptions takes one", c.Address, len(targets))
	}
	return targets[0].Target, targets[0].Options, nil
}

// dialOptions returns the gRPC dial target and options for one address.
func (c Config) dialOptions(a string) (Target, error) {
	addr, err := address.Parse(a)
	if err != nil {
		return Target{}, err
	}
	opts := []grpc.DialOption{
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(kpngv1.MaxBatchSize)),
		grpc.WithInitialWindowSize(kpngv1.WindowSize), grpc.WithInitialConnWindowSize(kpngv1.WindowSize),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: KeepaliveTime, Timeout: KeepaliveTimeout}),
	}
	tlsSet := c.TLSCA != "" || c.TLSCert != "" || c.TLSKey != ""
	if addr.Network == "unix" {
		if tlsSet || c.Insecure {
			return Target{}, fmt.Errorf("API %s: TLS and --api-insecure apply to TCP addresses only", addr)
		}
		path := addr.Addr
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "unix", path)
			}))
		return Target{Address: a, Target: "passthrough:///unix", Options: opts}, nil
	}
	switch {
	case c.Insecure && tlsSet:
		return Target{}, fmt.Errorf("API %s: --api-insecure and TLS flags are exclusive", addr)
	case c.Insecure && !addr.IsLoopback():
		return Target{}, fmt.Errorf("API %s: refusing --api-insecure to a non-loopback address; use TLS", addr)
	case c.Insecure:
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	default:
		cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.TLSServerName}
		if c.TLSCA != "" {
			pool, err := certs.LoadPool(c.TLSCA)
			if err != nil {
				return Target{}, err
			}
			cfg.RootCAs = pool
		}
		if c.TLSCert != "" || c.TLSKey != "" {
			cert, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey)
			if err != nil {
				return Target{}, fmt.Errorf("load client certificate: %w", err)
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	}
	host, _, _ := net.SplitHostPort(addr.Addr)
	if _, err := netip.ParseAddr(host); err != nil && host != "" {
		// A name: every address it resolves to, a connection to each,
		// streams on one that is up; the addresses kept fresh by the
		// client's own resolver, given to this connection only.
		names := &resolverBuilder{cfg: c.resolve}
		opts = append(opts, grpc.WithResolvers(names),
			grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`))
		return Target{Address: a, Target: ResolveScheme + ":///" + addr.Addr, Options: opts, names: names}, nil
	}
	return Target{Address: a, Target: "passthrough:///" + addr.Addr, Options: opts}, nil
}

// Run watches the controller until ctx ends, feeding sink. It returns nil
// when ctx ends, and an error only for a configuration that can never work.
//
// Given several controller addresses, it starts with the one its node name
// hashes to (the nodes spread over the controllers), and when a stream
// ends, it opens one to the next address at once; it waits (MinBackoff,
// doubling up to MaxBackoff) only once every address has failed in a row
// since a stream last delivered a whole state, and then only until the
// connection to the next address becomes ready (a controller back, or a
// name's new address).
func Run(ctx context.Context, cfg Config, sink localsink.Sink) error {
	logger := klog.FromContext(ctx)
	cfg.resolve.logger = &logger
	targets, err := cfg.Targets()
	if err != nil {
		return err
	}
	clients := make([]kpngv1.ControllerClient, len(targets))
	conns := make([]*grpc.ClientConn, len(targets))
	for i, t := range targets {
		opts := t.Options
		if cfg.Watching != nil {
			opts = append(opts[:len(opts):len(opts)], grpc.WithStreamInterceptor(watchingInterceptor(t.Address, cfg.Watching)))
		}
		conn, err := grpc.NewClient(t.Target, opts...)
		if err != nil {
			return fmt.Errorf("API %s: %w", t.Address, err)
		}
		defer conn.Close()
		conns[i], clients[i] = conn, kpngv1.NewControllerClient(conn)
	}
	// The replicas the controllers of a name tell, added to the name's
	// addresses; stopped before the connections close.
	ctx, cancel := context.WithCancel(ctx)
	var peers sync.WaitGroup
	defer peers.Wait()
	defer cancel()
	for i, t := range targets {
		if t.names != nil {
			peers.Go(func() { followPeers(ctx, clients[i], t.names, t.Address) })
		}
	}

	minB, maxB := cfg.MinBackoff, cfg.MaxBackoff
	if minB <= 0 {
		minB = 500 * time.Millisecond
	}
	if maxB <= 0 {
		maxB = 30 * time.Second
	}
	feeder := localsink.NewFeeder(sink, localsink.FeederOptions{Observe: cfg.Observe, Queued: cfg.Queued})
	defer feeder.Close()
	m := newMirror(feeder, cfg.NodeName)
	newBackoff := func() wait.Backoff {
		return wait.Backoff{Duration: minB, Factor: 2, Jitter: 0.1, Steps: 1 << 30, Cap: maxB}
	}
	backoff := newBackoff()
	i := startIndex(cfg.NodeName, len(targets))
	// failures counts the streams in a row that ended without a whole
	// state.
	failures := 0
	for {
		gotState, err := watchOnce(ctx, clients[i], cfg, m)
		if ctx.Err() != nil {
			return nil
		}
		lost := targets[i].Address
		i = (i + 1) % len(targets)
		if gotState {
			backoff, failures = newBackoff(), 0
		} else {
			failures++
		}
		if failures%len(targets) != 0 || failures == 0 {
			// Another address not tried since the last whole state (or,
			// after one, any): at once.
			logger.Error(err, "Lost the kpng controller, trying the next", "address", lost, "next", targets[i].Address)
			continue
		}
		delay := backoff.Step()
		logger.Error(err, "Lost the kpng controller, reconnecting", "address", lost, "next", targets[i].Address, "retryIn", delay.Round(time.Millisecond))
		if waitReady(ctx, conns[i], delay) {
			logger.V(2).Info("Connected to the kpng controller before the backoff's end", "address", targets[i].Address)
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

// waitReady waits for delay, or until conn becomes ready (a controller
// back, or the new address of a name), or ctx ends. It reports whether
// conn became ready. A connection ready all along (its controller refused
// the stream) waits the whole delay: no busy loop.
func waitReady(ctx context.Context, conn *grpc.ClientConn, delay time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, delay)
	defer cancel()
	state := conn.GetState()
	if state == connectivity.Idle {
		conn.Connect()
	}
	for conn.WaitForStateChange(ctx, state) {
		if state = conn.GetState(); state == connectivity.Ready {
			return true
		}
	}
	return false
}

// startIndex returns the address a node starts with: its name's hash, so
// that the nodes spread over the controllers.
func startIndex(node string, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(node))
	return int(h.Sum32() % uint32(n))
}

// watchingInterceptor calls watching with addr when a stream receives its
// first batch holding a sync.
func watchingInterceptor(addr string, watching func(string)) grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		s, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			return nil, err
		}
		return &watchingStream{ClientStream: s, addr: addr, watching: watching}, nil
	}
}

// watchingStream is a stream that reports its first sync.
type watchingStream struct {
	grpc.ClientStream
	addr     string
	watching func(string)
	synced   bool
}

// RecvMsg implements grpc.ClientStream.
func (s *watchingStream) RecvMsg(msg any) error {
	err := s.ClientStream.RecvMsg(msg)
	if err != nil || s.synced {
		return err
	}
	if b, ok := msg.(*kpngv1.Batch); ok {
		if err := b.Inflate(); err != nil {
			return err
		}
		for _, op := range b.GetOps() {
			if op.GetSync() != nil {
				s.synced = true
				s.watching(s.addr)
				break
			}
		}
	}
	return err
}

// watchOnce runs one Watch stream into m. It reports whether a whole state
// was received.
func watchOnce(ctx context.Context, client kpngv1.ControllerClient, cfg Config, m *mirror) (bool, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer m.streamEnded()
	req := &kpngv1.WatchRequest{NodeName: cfg.NodeName, NodeIndependent: !cfg.PerNodeView, AcceptDeflated: true}
	if !cfg.PerNodeView {
		req.HaveState = m.haveState()
	}
	stream, err := client.Watch(ctx, req)
	if err != nil {
		return false, fmt.Errorf("watch: %w", err)
	}
	klog.V(2).InfoS("Watching the kpng controller", "node", cfg.NodeName, "resuming", len(req.HaveState) > 0)
	gotState := false
	for {
		batch, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return gotState, errors.New("controller closed the stream")
		}
		if err != nil {
			return gotState, fmt.Errorf("receive: %w", err)
		}
		if err := batch.Inflate(); err != nil {
			return gotState, fmt.Errorf("receive: %w", err)
		}
		for _, op := range batch.GetOps() {
			if err := m.apply(op); err != nil {
				return gotState, err
			}
			if op.GetSync() != nil {
				gotState = true
			}
		}
	}
}
