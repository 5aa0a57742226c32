// Package remote is the backend side of the kpng API: it connects to a kpng
// controller (`kpng ... to-api`), watches the state for its node and feeds a
// localsink.Sink, reconnecting with backoff when the controller goes away.
//
// A reconnection does not make the backend start over: the client keeps a
// mirror of what the sink holds, and after the controller has sent its
// whole state again, the sink receives only the difference.
package remote

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/api/address"
	"sigs.k8s.io/kpng/api/certs"
	"sigs.k8s.io/kpng/api/kpngv1"
	"sigs.k8s.io/kpng/localsink"
)

// Config configures a connection to a controller.
type Config struct {
	// Address is the controller's address: a unix socket
	// ("unix:///var/run/kpng/kpng.sock") or host:port.
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
	// (defaults 500ms and 30s).
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
}

// DialOptions returns the gRPC dial target and options for c.
func (c Config) DialOptions() (string, []grpc.DialOption, error) {
	addr, err := address.Parse(c.Address)
	if err != nil {
		return "", nil, err
	}
	opts := []grpc.DialOption{
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(kpngv1.MaxBatchSize)),
		grpc.WithInitialWindowSize(kpngv1.WindowSize), grpc.WithInitialConnWindowSize(kpngv1.WindowSize),
	}
	tlsSet := c.TLSCA != "" || c.TLSCert != "" || c.TLSKey != ""
	if addr.Network == "unix" {
		if tlsSet || c.Insecure {
			return "", nil, fmt.Errorf("API %s: TLS and --api-insecure apply to TCP addresses only", addr)
		}
		path := addr.Addr
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "unix", path)
			}))
		return "passthrough:///unix", opts, nil
	}
	switch {
	case c.Insecure && tlsSet:
		return "", nil, fmt.Errorf("API %s: --api-insecure and TLS flags are exclusive", addr)
	case c.Insecure && !addr.IsLoopback():
		return "", nil, fmt.Errorf("API %s: refusing --api-insecure to a non-loopback address; use TLS", addr)
	case c.Insecure:
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	default:
		cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.TLSServerName}
		if c.TLSCA != "" {
			pool, err := certs.LoadPool(c.TLSCA)
			if err != nil {
				return "", nil, err
			}
			cfg.RootCAs = pool
		}
		if c.TLSCert != "" || c.TLSKey != "" {
			cert, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey)
			if err != nil {
				return "", nil, fmt.Errorf("load client certificate: %w", err)
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	}
	return "passthrough:///" + addr.Addr, opts, nil
}

// Run watches the controller until ctx ends, feeding sink. It returns nil
// when ctx ends, and an error only for a configuration that can never work.
func Run(ctx context.Context, cfg Config, sink localsink.Sink) error {
	target, opts, err := cfg.DialOptions()
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		return fmt.Errorf("API %s: %w", cfg.Address, err)
	}
	defer conn.Close()
	client := kpngv1.NewControllerClient(conn)

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
	backoff := wait.Backoff{Duration: minB, Factor: 2, Jitter: 0.1, Steps: 1 << 30, Cap: maxB}
	for {
		gotState, err := watchOnce(ctx, client, cfg, m)
		if ctx.Err() != nil {
			return nil
		}
		if gotState {
			backoff = wait.Backoff{Duration: minB, Factor: 2, Jitter: 0.1, Steps: 1 << 30, Cap: maxB}
		}
		delay := backoff.Step()
		klog.ErrorS(err, "Lost the kpng controller, reconnecting", "address", cfg.Address, "retryIn", delay.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
	}
}

// watchOnce runs one Watch stream into m. It reports whether a whole state
// was received.
func watchOnce(ctx context.Context, client kpngv1.ControllerClient, cfg Config, m *mirror) (bool, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer m.streamEnded()
	req := &kpngv1.WatchRequest{NodeName: cfg.NodeName, NodeIndependent: !cfg.PerNodeView}
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
