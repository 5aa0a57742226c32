package client

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/client/metrics"
	"sigs.k8s.io/kpng/client/remote"
	"sigs.k8s.io/kpng/client/watcher"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

// Flags are the command-line options of Run and RunSink.
type Flags struct {
	// Kubeconfig is the kubeconfig file; empty means $KUBECONFIG, then the
	// in-cluster configuration.
	Kubeconfig string
	// ServiceProxyName selects the services labelled
	// service.kubernetes.io/service-proxy-name=<name>; empty selects the
	// services without that label.
	ServiceProxyName string
	// NodeName is this node's name; empty means $NODE_NAME, then the
	// hostname.
	NodeName string
	// Once delivers the first consistent state, then returns.
	Once bool
	// MinSyncInterval is the minimum time between two deliveries.
	MinSyncInterval time.Duration
	// API, when set, is the address of a kpng controller to watch instead
	// of the Kubernetes API server (see package remote); APITLSCA,
	// APITLSCert, APITLSKey and APIInsecure secure the connection.
	API                             string
	APITLSCA, APITLSCert, APITLSKey string
	APIInsecure                     bool
	// MetricsBindAddress and HealthzBindAddress, when set, are where
	// StartMetrics serves the Prometheus metrics (/metrics) and /healthz
	// and /livez; HealthzTimeout is how long a change may wait for a
	// successful sync before those answer 503.
	MetricsBindAddress, HealthzBindAddress string
	HealthzTimeout                         time.Duration
	// DebugBindAddress, when set, is where StartMetrics serves the debug
	// endpoint (metrics.DebugPath: every service and endpoint the backend
	// holds); empty, the default, serves it nowhere. An address equal to
	// MetricsBindAddress (or HealthzBindAddress) serves it on that
	// server.
	DebugBindAddress string
	// AppliedLater tells StartMetrics that the sink applies the rounds
	// after its Sync returns and reports each success to the Recorder
	// with Applied (metrics.Options.AppliedLater): health then follows
	// what the sink applied, not the rounds.
	AppliedLater bool
	// Observe and Queued, set by StartMetrics, receive each round
	// delivered and queued (the watcher's and the remote client's);
	// NodeEligible the node's eligibility (the watcher's).
	Observe      func(localsink.Round)
	Queued       func(time.Time)
	NodeEligible func(eligible bool)
	// recorder is what StartMetrics started (a second call returns it),
	// stopMetrics closes its servers.
	recorder    *metrics.Recorder
	stopMetrics func()
}

// Bind registers all the flags on fs, with klog's flags.
func (f *Flags) Bind(fs *flag.FlagSet) {
	f.BindKube(fs)
	f.BindAPI(fs)
	f.BindMetrics(fs)
	fs.BoolVar(&f.Once, "once", false, "deliver the first consistent state, then exit")
	klog.InitFlags(fs)
}

// BindKube registers the flags of the Kubernetes watcher on fs:
// --kubeconfig, --service-proxy-name, --node-name and --min-sync-interval.
func (f *Flags) BindKube(fs *flag.FlagSet) {
	fs.StringVar(&f.Kubeconfig, "kubeconfig", "", "kubeconfig file (default $KUBECONFIG, then the in-cluster configuration)")
	fs.StringVar(&f.ServiceProxyName, "service-proxy-name", "", "handle the services labelled service.kubernetes.io/service-proxy-name=<name> (empty: the services without that label)")
	f.BindNodeName(fs)
	fs.DurationVar(&f.MinSyncInterval, "min-sync-interval", watcher.DefaultMinSyncInterval, "minimum time between two deliveries (bursts of changes are coalesced)")
}

// BindNodeName registers --node-name on fs.
func (f *Flags) BindNodeName(fs *flag.FlagSet) {
	fs.StringVar(&f.NodeName, "node-name", "", "this node's name, for Local endpoints and topology (default $NODE_NAME, then the hostname)")
}

// BindAPI registers the flags of a connection to a kpng controller on fs:
// --api and its TLS flags.
func (f *Flags) BindAPI(fs *flag.FlagSet) {
	fs.StringVar(&f.API, "api", "", "watch a kpng controller at this address (unix:///path or host:port) instead of the Kubernetes API server; several, comma-separated, for replicas: the backend moves to the next at once when its controller goes away")
	fs.StringVar(&f.APITLSCA, "api-tls-ca", "", "CA file verifying the controller's certificate (TCP)")
	fs.StringVar(&f.APITLSCert, "api-tls-cert", "", "client certificate file, for controllers that require one")
	fs.StringVar(&f.APITLSKey, "api-tls-key", "", "client key file")
	fs.BoolVar(&f.APIInsecure, "api-insecure", false, "plain TCP to a loopback controller address")
}

// BindMetrics registers --metrics-bind-address, --healthz-bind-address,
// --healthz-timeout (kube-proxy's names; empty addresses serve nothing,
// and kube-proxy's ports 10249 and 10256 are left to it) and
// --debug-bind-address on fs.
func (f *Flags) BindMetrics(fs *flag.FlagSet) {
	fs.StringVar(&f.MetricsBindAddress, "metrics-bind-address", "", "serve Prometheus metrics on /metrics at this address (e.g. 127.0.0.1:10349; empty: not served)")
	fs.StringVar(&f.HealthzBindAddress, "healthz-bind-address", "", "serve /healthz and /livez at this address (e.g. 0.0.0.0:10356; empty: not served)")
	fs.StringVar(&f.DebugBindAddress, "debug-bind-address", "", "serve the debug endpoint "+metrics.DebugPath+" (every service and endpoint the backend holds, unauthenticated) at this address; the metrics address serves both on one port (e.g. 127.0.0.1:10349; empty: not served)")
	fs.DurationVar(&f.HealthzTimeout, "healthz-timeout", metrics.DefaultHealthTimeout, "how long a change may wait for a successful sync before /healthz and /livez answer 503")
}

// StartMetrics makes the Recorder of the rounds these flags run, serves
// the endpoints they ask for until ctx ends (the metrics and /proxyMode on
// --metrics-bind-address, /healthz and /livez on --healthz-bind-address,
// the debug endpoint on --debug-bind-address; one server for the
// endpoints given the same address; nothing when none is set), and sets
// f.Observe, f.Queued and f.NodeEligible to feed it. A second call returns
// what the first started. The Recorder is returned for a backend's own
// metrics and for its health (Recorder.Healthy: the health check node
// ports answer 503 while the proxier is not healthy, served or not).
func (f *Flags) StartMetrics(ctx context.Context) (*metrics.Recorder, error) {
	if f.recorder != nil {
		return f.recorder, nil
	}
	r := metrics.New(metrics.Options{ServiceProxyName: f.ServiceProxyName, HealthTimeout: f.HealthzTimeout, AppliedLater: f.AppliedLater})
	health := r.HealthHandler()
	// servers are the addresses to serve, in the flags' order, each with
	// its flags and the paths they ask for.
	type server struct {
		addr  string
		flags []string
		mux   *http.ServeMux
	}
	var servers []*server
	for _, e := range []struct {
		flag, addr string
		paths      map[string]http.Handler
	}{
		{"--metrics-bind-address", f.MetricsBindAddress, map[string]http.Handler{"/metrics": r.MetricsHandler(), "/proxyMode": r.ProxyModeHandler()}},
		{"--healthz-bind-address", f.HealthzBindAddress, map[string]http.Handler{"/healthz": health, "/livez": health}},
		{"--debug-bind-address", f.DebugBindAddress, map[string]http.Handler{metrics.DebugPath: r.DebugHandler()}},
	} {
		if e.addr == "" {
			continue
		}
		i := slices.IndexFunc(servers, func(s *server) bool { return s.addr == e.addr })
		if i < 0 {
			servers = append(servers, &server{addr: e.addr, mux: http.NewServeMux()})
			i = len(servers) - 1
		}
		s := servers[i]
		s.flags = append(s.flags, e.flag)
		for path, h := range e.paths {
			s.mux.Handle(path, h)
		}
	}
	var stops []func()
	for _, s := range servers {
		stop, err := metrics.Serve(ctx, s.addr, s.mux)
		if err != nil {
			for _, stop := range stops {
				stop() // the servers started before, if any
			}
			return nil, fmt.Errorf("%s=%s: %w", strings.Join(s.flags, ", "), s.addr, err)
		}
		stops = append(stops, stop)
		for _, fl := range s.flags {
			klog.InfoS("Serving", "flag", fl, "address", s.addr)
		}
	}
	f.Observe, f.Queued, f.NodeEligible, f.recorder = r.Observe, r.Queued, r.SetNodeEligible, r
	f.stopMetrics = func() {
		for _, stop := range stops {
			stop()
		}
	}
	return r, nil
}

// usageError marks errors in the command line or configuration: exit
// status 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// Run parses the command line, watches the API server and calls handler
// with the whole state on each change, until SIGINT or SIGTERM (or, with
// --once, after the first state). It exits the process: status 0 on a clean
// stop, 2 on bad flags or configuration, 1 on other errors.
func Run(handler HandlerFunc) {
	RunSink(localsink.NewFullState(handler))
}

// RunSink is Run for an incremental sink.
func RunSink(sink localsink.Sink) {
	os.Exit(Main(os.Args[1:], os.Stderr, sink))
}

// Main is Run without the exit: it parses args, runs until a signal (or the
// first state with --once) and returns the process exit status, printing a
// one-line error to stderr on failure.
func Main(args []string, stderr io.Writer, sink localsink.Sink) int {
	return mainWith(args, stderr, nil, func(context.Context, *Flags) (localsink.Sink, error) { return sink, nil }, false)
}

// RunWith is RunSink for a backend with command-line flags of its own: bind
// registers them on the FlagSet that holds kpng's flags (nil: none), and
// newSink builds the sink once the command line is parsed, from kpng's
// flags (f) and the program's own (the variables bind registered). kpng
// keeps the rest of Run's lifecycle: the exit statuses, SIGINT and SIGTERM,
// --once, the metrics and health endpoints. It exits the process.
func RunWith(bind func(fs *flag.FlagSet), newSink func(ctx context.Context, f *Flags) (Sink, error)) {
	os.Exit(MainWith(os.Args[1:], os.Stderr, bind, newSink))
}

// MainWith is RunWith without the exit: it returns the process exit status.
//
// newSink's ctx ends on SIGINT or SIGTERM, as the run does. An error it
// returns ends the program with status 1, or 2 when the error is wrapped
// with UsageError (a bad value of the program's own flags); a nil sink
// with a nil error ends it with status 0 without watching (a flag such as
// --cleanup that did its work). When the run ends, a sink with a Close
// method (io.Closer, or a Close without a result, as the reference
// backends') is closed before MainWith returns; an error from Close is
// status 1.
func MainWith(args []string, stderr io.Writer, bind func(fs *flag.FlagSet), newSink func(ctx context.Context, f *Flags) (Sink, error)) int {
	return mainWith(args, stderr, bind, newSink, true)
}

// mainWith is MainWith; closeSink says whether to close the sink when it
// implements io.Closer (Main leaves the caller's sink open).
func mainWith(args []string, stderr io.Writer, bind func(fs *flag.FlagSet), newSink func(ctx context.Context, f *Flags) (Sink, error), closeSink bool) int {
	name := filepath.Base(os.Args[0])
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	var f Flags
	f.Bind(fs)
	if bind != nil {
		bind(fs)
	}
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stderr)
			fmt.Fprintf(stderr, "Usage: %s [flags]\n", name)
			fs.PrintDefaults()
			return 0
		}
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected argument %q\n", name, fs.Arg(0))
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	defer klog.Flush()
	sink, err := newSink(ctx, &f)
	if err == nil && sink != nil {
		err = f.Run(ctx, sink)
		if closeSink {
			switch c := sink.(type) {
			case io.Closer:
				if cerr := c.Close(); cerr != nil && err == nil {
					err = fmt.Errorf("close: %w", cerr)
				}
			case interface{ Close() }:
				// The reference backends' Close (userspace,
				// healthcheck) waits for what they serve to end.
				c.Close()
			}
		}
	}
	switch {
	case err == nil:
		return 0
	case errors.As(err, new(usageError)):
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 2
	default:
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
}

// UsageError marks err as an error in the command line or the
// configuration: MainWith exits with status 2 (IsUsageError reports it).
// A nil err stays nil.
func UsageError(err error) error {
	if err == nil {
		return nil
	}
	return usageError{err}
}

// Run watches with these flags until ctx is done (or the first state with
// Once), feeding sink. Errors in the configuration are usage errors (exit status 2 in Main).
func (f *Flags) Run(ctx context.Context, sink localsink.Sink) error {
	if f.Once {
		ctx2, cancel := context.WithCancel(ctx)
		defer cancel()
		ctx = ctx2
		sink = &onceSink{Sink: sink, done: cancel}
	}
	// The servers StartMetrics opens here end with Run (those a caller
	// started before are the caller's).
	if f.recorder == nil {
		defer func() {
			if f.recorder != nil {
				f.stopMetrics()
				f.recorder, f.stopMetrics, f.Observe, f.Queued, f.NodeEligible = nil, nil, nil, nil, nil
			}
		}()
	}
	if _, err := f.StartMetrics(ctx); err != nil {
		return err
	}
	if f.API != "" {
		return f.runRemote(ctx, sink)
	}
	w, _, err := f.watcher(newWatchClient)
	if err != nil {
		return err
	}
	return w.Run(ctx, sink)
}

// Watcher builds the Kubernetes watcher these flags describe, and the
// client it uses (a full clientset, for the caller's other uses). Errors
// are configuration errors (exit status 2 in Main).
func (f *Flags) Watcher() (*watcher.Watcher, kubernetes.Interface, error) {
	return f.watcher(func(cfg *rest.Config) (kubernetes.Interface, error) { return kubernetes.NewForConfig(cfg) })
}

// watcher is Watcher with the client newClient builds: Run uses
// newWatchClient, which links only the API groups the watcher reads.
func (f *Flags) watcher(newClient func(*rest.Config) (kubernetes.Interface, error)) (*watcher.Watcher, kubernetes.Interface, error) {
	cfg, err := f.restConfig()
	if err != nil {
		return nil, nil, usageError{err}
	}
	cs, err := newClient(cfg)
	if err != nil {
		return nil, nil, usageError{fmt.Errorf("kubernetes client: %w", err)}
	}
	nodeName, err := f.nodeName()
	if err != nil {
		return nil, nil, usageError{err}
	}
	w, err := watcher.New(watcher.Config{
		Client:           cs,
		ServiceProxyName: f.ServiceProxyName,
		NodeName:         nodeName,
		MinSyncInterval:  f.MinSyncInterval,
		Observe:          f.Observe,
		Queued:           f.Queued,
		NodeEligible:     f.NodeEligible,
	})
	if err != nil {
		return nil, nil, usageError{err}
	}
	klog.InfoS("Starting kpng watcher", "serviceProxyName", f.ServiceProxyName, "node", nodeName, "apiServer", cfg.Host)
	return w, cs, nil
}

func (f *Flags) runRemote(ctx context.Context, sink localsink.Sink) error {
	cfg, err := f.RemoteConfig()
	if err != nil {
		return err
	}
	klog.InfoS("Watching a kpng controller", "address", f.API, "node", cfg.NodeName)
	return remote.Run(ctx, cfg, sink)
}

// RemoteConfig returns the configuration of the connection to a kpng
// controller these flags describe. Errors are configuration errors.
func (f *Flags) RemoteConfig() (remote.Config, error) {
	nodeName, err := f.nodeName()
	if err != nil {
		return remote.Config{}, usageError{err}
	}
	cfg := remote.Config{
		Address: f.API, NodeName: nodeName,
		TLSCA: f.APITLSCA, TLSCert: f.APITLSCert, TLSKey: f.APITLSKey, Insecure: f.APIInsecure,
		Observe: f.Observe, Queued: f.Queued,
	}
	if _, err := cfg.Targets(); err != nil {
		return remote.Config{}, usageError{err}
	}
	return cfg, nil
}

func (f *Flags) restConfig() (*rest.Config, error) {
	path := f.Kubeconfig
	if path == "" {
		path = os.Getenv("KUBECONFIG")
	}
	if path != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
		}
		return cfg, nil
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("no kubeconfig: pass --kubeconfig or set $KUBECONFIG when not running in a cluster (%w)", err)
	}
	return cfg, nil
}

func (f *Flags) nodeName() (string, error) {
	if f.NodeName != "" {
		return f.NodeName, nil
	}
	if n := os.Getenv("NODE_NAME"); n != "" {
		return n, nil
	}
	h, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("no --node-name, no $NODE_NAME and no hostname: %w", err)
	}
	return h, nil
}

// onceSink stops the run after the first successful Sync.
type onceSink struct {
	localsink.Sink
	done func()
}

func (o *onceSink) Sync() error {
	err := o.Sink.Sync()
	if err == nil {
		o.done()
	}
	return err
}

// Problems passes on the sink's problems (localsink.ProblemReporter).
func (o *onceSink) Problems() []model.Problem {
	if pr, ok := o.Sink.(localsink.ProblemReporter); ok {
		return pr.Problems()
	}
	return nil
}

// IsUsageError reports whether err comes from the command line or the
// configuration (exit status 2), rather than from running.
func IsUsageError(err error) bool { return errors.As(err, new(usageError)) }
