package app

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/api/address"
	"sigs.k8s.io/kpng/api/server"
	"sigs.k8s.io/kpng/client/metrics"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/localsink/statefile"
	"sigs.k8s.io/kpng/model"
)

// output is where the state goes.
type output struct {
	sink localsink.Sink
	// hub is to-api's hub: the kube input feeds it node zones.
	hub *server.Hub
	// peersService is to-api's --peers-service (namespace/name), whose
	// ready addresses the kube input sets in peers.
	peersService string
	peers        *server.Peers
	// serve, when set, runs beside the input until ctx ends.
	serve func(ctx context.Context) error
	// build, when set, makes the sink once everything is parsed.
	build func(ctx context.Context, env BackendEnv) (localsink.Sink, error)
	env   func() BackendEnv
	// metrics, set by the input when it records its rounds, takes the
	// output's own metrics (to-api's).
	metrics *metrics.Recorder
}

// run runs feed into the output, with the output's server beside it; both
// stop when ctx ends or either fails.
func (o *output) run(ctx context.Context, feed func(context.Context, localsink.Sink) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if o.build != nil {
		sink, err := o.build(ctx, o.env())
		if errors.Is(err, ErrBackendDone) {
			return nil
		}
		if err != nil {
			return err
		}
		o.sink = sink
	}
	var wg sync.WaitGroup
	var serveErr error
	if o.serve != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if serveErr = o.serve(ctx); serveErr != nil {
				cancel()
			}
		}()
	}
	err := feed(ctx, o.sink)
	cancel()
	wg.Wait()
	return errors.Join(err, serveErr)
}

func bindOutput(inputCmd string, args []string, stderr io.Writer, backends []Backend, nodeViews bool, env func() BackendEnv) (*output, error) {
	name := args[0]
	fs := flag.NewFlagSet(inputCmd+" "+name, flag.ContinueOnError)
	var out *output
	var finish func() error
	var help string
	switch name {
	case "to-api":
		help = toAPIHelp
		out, finish = bindToAPI(fs, nodeViews)
	case "to-file":
		help = toFileHelp
		out, finish = bindToFile(fs)
	case "to-local":
		return bindToLocal(fs, args[1:], stderr, backends, env)
	default:
		return nil, usagef("unknown output %q (want to-api, to-file or to-local)", name)
	}
	rest, err := parse(fs, args[1:], stderr, help)
	if err != nil {
		return nil, err
	}
	if len(rest) > 0 {
		return nil, usagef("%s: unexpected argument %q", fs.Name(), rest[0])
	}
	if err := finish(); err != nil {
		return nil, err
	}
	return out, nil
}

const toAPIHelp = `to-api: serve the state to backends over gRPC (see api/kpngv1/kpng.proto).
Each backend names its node and gets the state as seen from it, then only
what changes for it. Listens on a unix socket (mode 0600) by default; TCP
requires TLS unless --insecure is given for a loopback address, and client
certificates (--tls-client-ca) unless --insecure-no-client-auth. A client
certificate of a node (CN=system:node:NAME, O=system:nodes, as kubelet's)
may watch only that node's view; one without a node identity is refused
unless its common name is in --tls-any-node-cn.
`

func bindToAPI(fs *flag.FlagSet, nodeViews bool) (*output, func() error) {
	cfg := server.ListenConfig{}
	fs.StringVar(&cfg.Address, "listen", address.DefaultSocket, "where to serve backends: unix:///path or host:port")
	fs.StringVar(&cfg.TLSCert, "tls-cert", "", "server certificate file (TCP)")
	fs.StringVar(&cfg.TLSKey, "tls-key", "", "server key file (TCP)")
	fs.StringVar(&cfg.TLSClientCA, "tls-client-ca", "", "require client certificates signed by this CA file (TCP; required unless --insecure-no-client-auth)")
	fs.BoolVar(&cfg.NoClientAuth, "insecure-no-client-auth", false, "serve TLS on TCP without client certificates: anyone who reaches the address can watch any node's view")
	fs.BoolVar(&cfg.Insecure, "insecure", false, "plain TCP, only allowed on a loopback address")
	anyNode := fs.String("tls-any-node-cn", "", "comma-separated common names of client certificates without a node identity that may watch any node's view (\"*\": every certificate the CA signed)")
	fs.IntVar(&cfg.Limits.MaxStreamsPerConnection, "http2-max-streams-per-connection", server.DefaultMaxStreamsPerConnection, "streams a client connection may have open at once, at least 2: a backend's Watch and Peers (-1: no limit)")
	fs.IntVar(&cfg.Limits.MaxConnections, "max-connections", server.DefaultMaxConnections, "TCP connections served at once (-1: no limit)")
	fs.IntVar(&cfg.Limits.MaxConnectionsPerClient, "max-connections-per-client", server.DefaultMaxConnectionsPerClient, "TCP connections served at once from one client IP address (-1: no limit)")
	fs.DurationVar(&cfg.Limits.ConnectionIdleTimeout, "connection-idle-timeout", server.DefaultConnectionIdleTimeout, "close a connection without a stream after this long (-1s: never)")
	fs.DurationVar(&cfg.Limits.HandshakeTimeout, "handshake-timeout", server.DefaultHandshakeTimeout, "close a new connection that has not finished its TLS handshake and HTTP/2 preface after this long (-1s: never)")
	maxPerNode := fs.Int("max-streams-per-node", server.DefaultMaxStreamsPerNode, "streams watching one node's view at once (-1: no limit)")
	maxFirstStates := fs.Int("max-concurrent-first-states", server.DefaultMaxConcurrentFirstStates, "backends sent their whole view at once; the others wait their turn")
	sendTimeout := fs.Duration("send-timeout", server.DefaultSendTimeout, "drop a backend that does not read its stream for this long")
	hub := server.NewHub(nodeViews)
	out := &output{sink: hub, hub: hub}
	fs.StringVar(&out.peersService, "peers-service", "", "NAMESPACE/NAME of the Service whose ready endpoints are this controller's replicas (kube input only): backends that reach the controllers by a name learn a new replica from them as soon as it is ready, not when a DNS cache expires")
	return out, func() error {
		if out.peersService != "" {
			ns, name, ok := strings.Cut(out.peersService, "/")
			if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
				return usagef("to-api: --peers-service=%q: want NAMESPACE/NAME", out.peersService)
			}
			out.peers = server.NewPeers()
		}
		if _, _, err := cfg.Options(); err != nil {
			return usagef("to-api: %v", err)
		}
		if *maxPerNode == 0 {
			return usagef("to-api: --max-streams-per-node must be at least 1, or -1 for no limit")
		}
		if *maxFirstStates < 1 {
			return usagef("to-api: --max-concurrent-first-states must be at least 1, not %d", *maxFirstStates)
		}
		var anyNodeCNs []string
		for _, cn := range strings.Split(*anyNode, ",") {
			if cn = strings.TrimSpace(cn); cn != "" {
				anyNodeCNs = append(anyNodeCNs, cn)
			}
		}
		if len(anyNodeCNs) > 0 && cfg.TLSClientCA == "" {
			return usagef("to-api: --tls-any-node-cn needs --tls-client-ca")
		}
		out.serve = func(ctx context.Context) error {
			lis, opts, err := cfg.Listen()
			if err != nil {
				return err
			}
			g := grpc.NewServer(opts...)
			srv := server.New(hub, server.Options{SendTimeout: *sendTimeout, MaxConcurrentFirstStates: *maxFirstStates, MaxStreamsPerNode: *maxPerNode, AnyNodeCommonNames: anyNodeCNs, Peers: out.peers})
			srv.Register(g)
			if out.metrics != nil {
				if err := registerAPIMetrics(out.metrics, srv); err != nil {
					return err
				}
			}
			klog.InfoS("Serving backends", "address", cfg.Address)
			errc := make(chan error, 1)
			go func() { errc <- g.Serve(lis) }()
			select {
			case err := <-errc:
				srv.Stop()
				return fmt.Errorf("serve %s: %w", cfg.Address, err)
			case <-ctx.Done():
			}
			// The streams ended at once (their backends move to
			// another controller), then the connections closed.
			srv.Stop()
			stopped := make(chan struct{})
			go func() { g.GracefulStop(); close(stopped) }()
			select {
			case <-stopped:
			case <-time.After(5 * time.Second):
				g.Stop()
			}
			return nil
		}
		return nil
	}
}

const toFileHelp = `to-file: write the state to a file (YAML) on every change, atomically. The
file is what "kpng file --input" reads. A write that fails (a full disk) is
tried again after a backoff; the file keeps the last state written, whole.
`

func bindToFile(fs *flag.FlagSet) (*output, func() error) {
	path := fs.String("output", "", "state file to write (required)")
	out := &output{}
	return out, func() error {
		if *path == "" {
			return usagef("to-file: --output is required")
		}
		out.sink = statefile.NewSink(*path)
		return nil
	}
}

func bindToLocal(fs *flag.FlagSet, args []string, stderr io.Writer, backends []Backend, env func() BackendEnv) (*output, error) {
	help := "to-local: run an in-process backend.\n\nUsage: to-local <backend> [backend flags]\n\nBackends:\n"
	for _, b := range backends {
		help += fmt.Sprintf("  %-10s %s\n", b.Name, b.Help)
	}
	rest, err := parse(fs, args, stderr, help)
	if err != nil {
		return nil, err
	}
	if len(rest) == 0 {
		return nil, usagef("to-local: missing backend")
	}
	for _, b := range backends {
		if b.Name != rest[0] {
			continue
		}
		bfs := flag.NewFlagSet(fs.Name()+" "+b.Name, flag.ContinueOnError)
		build := b.Bind(bfs)
		extra, err := parse(bfs, rest[1:], stderr, b.Help+"\n")
		if err != nil {
			return nil, err
		}
		if len(extra) > 0 {
			return nil, usagef("%s: unexpected argument %q", bfs.Name(), extra[0])
		}
		return &output{build: build, env: env}, nil
	}
	return nil, usagef("to-local: unknown backend %q", rest[0])
}

// JSONBackend is the to-json backend: it prints the state like kpng-json,
// one JSON object per service, on each change.
func JSONBackend(w io.Writer) Backend {
	return Backend{
		Name: "to-json",
		Help: "print the state as JSON on each change, like kpng-json",
		Bind: func(*flag.FlagSet) func(context.Context, BackendEnv) (localsink.Sink, error) {
			return func(context.Context, BackendEnv) (localsink.Sink, error) {
				enc := json.NewEncoder(w)
				return localsink.NewFullState(func(items []*model.ServiceEndpoints) {
					for _, it := range items {
						if err := enc.Encode(it); err != nil {
							klog.ErrorS(err, "Cannot print the state")
							return
						}
					}
				}), nil
			}
		},
	}
}

// registerAPIMetrics adds the metrics of to-api's server to rec.
func registerAPIMetrics(rec *metrics.Recorder, srv *server.Server) error {
	counter := func(name, help string, v func(server.Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts(rec.Opts(name, help)), func() float64 { return float64(v(srv.Stats())) })
	}
	for _, c := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts(rec.Opts("api_backends", "Backends watching this controller now (to-api).")),
			func() float64 { return float64(srv.Stats().Connected) }),
		counter("api_backend_connections_total", "Watch streams opened by backends.", func(s server.Stats) uint64 { return s.Connections }),
		counter("api_backends_refused_total", "Watch requests refused: another node's view than the client certificate's, a certificate without a node identity, a node name too long, too many streams for a node.", func(s server.Stats) uint64 { return s.Refused }),
		counter("api_backends_dropped_total", "Streams the controller ended: a backend that did not read for --send-timeout, or a send that failed.", func(s server.Stats) uint64 { return s.Dropped }),
		counter("api_sent_batches_total", "Batch messages sent to backends.", func(s server.Stats) uint64 { return s.SentBatches }),
		counter("api_sent_bytes_total", "Bytes of the batches sent to backends (protobuf encoding, before gRPC framing).", func(s server.Stats) uint64 { return s.SentBytes }),
		counter("api_snapshots_total", "Whole states encoded for the first states of node-independent streams (each shared by every stream starting before the next round of changes).", func(s server.Stats) uint64 { return s.Snapshots }),
		counter("api_snapshot_batches_deflated_total", "Batches of whole states compressed for the backends that take deflated operations (each once, for all of them).", func(s server.Stats) uint64 { return s.Deflated }),
		counter("api_backends_resumed_total", "Node-independent streams started without a whole state: the backend held the controller's state already.", func(s server.Stats) uint64 { return s.Resumed }),
		counter("api_backends_caught_up_total", "Node-independent streams sent a whole state again after falling behind the controller's log of changes (a slow backend).", func(s server.Stats) uint64 { return s.CaughtUp }),
	} {
		if err := rec.Registry().Register(c); err != nil {
			return fmt.Errorf("to-api metrics: %w", err)
		}
	}
	return nil
}
