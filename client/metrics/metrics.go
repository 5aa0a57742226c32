// Package metrics records what a proxier built with kpng does, for
// operators: Prometheus metrics of the rounds delivered to its sink, and
// /healthz and /livez with kube-proxy's semantics. A Recorder observes the
// per-round records of localsink.Feeder (watcher.Config.Observe,
// remote.Config.Observe); client.Run programs and the kpng binary serve it
// with --metrics-bind-address and --healthz-bind-address.
//
// The metric names are kube-proxy's with the kpng_ prefix instead of
// kubeproxy_, and a service_proxy_name label: kpng runs beside kube-proxy,
// often several proxiers on one node, and a dashboard must not add their
// figures to kube-proxy's. The buckets are kube-proxy's.
package metrics

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/localsink"
)

// DefaultHealthTimeout is how long a change may wait for a successful sync
// before the proxier is unhealthy (kube-proxy's --healthz-timeout default
// is 2 × its sync period; kpng syncs changes at once, so a fixed 60 s).
const DefaultHealthTimeout = 60 * time.Second

// Recorder turns the rounds delivered to a sink into metrics and health.
// Observe may be called from one goroutine at a time (the Feeder's
// guarantee); the handlers from any.
type Recorder struct {
	reg     *prometheus.Registry
	timeout time.Duration
	now     func() time.Time

	duration        prometheus.Histogram
	lastSync        prometheus.Gauge
	lastQueued      prometheus.Gauge
	serviceChanges  prometheus.Counter
	endpointChanges prometheus.Counter
	failures        prometheus.Counter
	rounds          *prometheus.CounterVec
	healthz, livez  *prometheus.CounterVec

	mu sync.Mutex
	// pendingSince is when the oldest change not yet applied was
	// delivered (zero: none); lastSynced when the last round was applied.
	pendingSince, lastSynced time.Time
}

// Options configure a Recorder.
type Options struct {
	// ServiceProxyName labels every metric.
	ServiceProxyName string
	// HealthTimeout (default DefaultHealthTimeout) is how long a change
	// may wait for a successful sync before /healthz and /livez answer
	// 503.
	HealthTimeout time.Duration
	// Now is the clock (default time.Now), for tests.
	Now func() time.Time
}

// New returns a Recorder with its own registry (the Go and process
// collectors included).
func New(opts Options) *Recorder {
	if opts.HealthTimeout <= 0 {
		opts.HealthTimeout = DefaultHealthTimeout
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	labels := prometheus.Labels{"service_proxy_name": opts.ServiceProxyName}
	f := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: "kpng", Name: name, Help: help, ConstLabels: labels}
	}
	// Nothing is applied yet: without a first successful round within
	// the timeout, the proxier is unhealthy.
	r := &Recorder{reg: prometheus.NewRegistry(), timeout: opts.HealthTimeout, now: opts.Now, pendingSince: opts.Now()}
	r.duration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "kpng", Name: "sync_proxy_rules_duration_seconds", ConstLabels: labels,
		Help:    "How long one round took to reach the backend and be applied (its Sync included), in seconds.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
	})
	r.lastSync = prometheus.NewGauge(prometheus.GaugeOpts(f("sync_proxy_rules_last_timestamp_seconds", "When the last round was applied successfully (Unix time).")))
	r.lastQueued = prometheus.NewGauge(prometheus.GaugeOpts(f("sync_proxy_rules_last_queued_timestamp_seconds", "When the oldest change not yet applied was delivered (Unix time; 0 when none is waiting).")))
	r.serviceChanges = prometheus.NewCounter(prometheus.CounterOpts(f("sync_proxy_rules_service_changes_total", "Service changes delivered to the backend (one per Update).")))
	r.endpointChanges = prometheus.NewCounter(prometheus.CounterOpts(f("sync_proxy_rules_endpoint_changes_total", "Endpoints added, changed or removed in the changes delivered.")))
	r.failures = prometheus.NewCounter(prometheus.CounterOpts(f("sync_proxy_rules_failures_total", "Rounds the backend failed to apply (its Sync returned an error; kpng retries).")))
	r.rounds = prometheus.NewCounterVec(prometheus.CounterOpts(f("rounds_total", "Rounds delivered, by kind: change, reset (the whole state) or retry.")), []string{"kind"})
	r.healthz = prometheus.NewCounterVec(prometheus.CounterOpts(f("proxy_healthz_total", "Answers of /healthz, by HTTP code.")), []string{"code"})
	r.livez = prometheus.NewCounterVec(prometheus.CounterOpts(f("proxy_livez_total", "Answers of /livez, by HTTP code.")), []string{"code"})
	r.reg.MustRegister(r.duration, r.lastSync, r.lastQueued, r.serviceChanges, r.endpointChanges, r.failures, r.rounds, r.healthz, r.livez,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return r
}

// Registry is the Recorder's registry, for a backend's own metrics.
func (r *Recorder) Registry() *prometheus.Registry { return r.reg }

// Queued records that a round with changes was queued at t (the
// signature of FeederOptions.Queued): from then on, it must be applied
// within the health timeout.
func (r *Recorder) Queued(t time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pendingSince.IsZero() {
		r.pendingSince = t
		r.lastQueued.Set(float64(t.UnixNano()) / 1e9)
	}
}

// Observe records one round (the signature of FeederOptions.Observe).
func (r *Recorder) Observe(round localsink.Round) {
	r.duration.Observe(round.Duration.Seconds())
	r.serviceChanges.Add(float64(round.Services))
	r.endpointChanges.Add(float64(round.Endpoints))
	switch {
	case round.Retry:
		r.rounds.WithLabelValues("retry").Inc()
	case round.Reset:
		r.rounds.WithLabelValues("reset").Inc()
	default:
		r.rounds.WithLabelValues("change").Inc()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if round.Err != nil {
		r.failures.Inc()
		if r.pendingSince.IsZero() { // a retry without Queued
			r.pendingSince = round.Start
			r.lastQueued.Set(float64(round.Start.UnixNano()) / 1e9)
		}
		return
	}
	r.pendingSince = time.Time{}
	r.lastQueued.Set(0)
	r.lastSynced = round.Start.Add(round.Duration)
	r.lastSync.Set(float64(r.lastSynced.UnixNano()) / 1e9)
}

// MetricsHandler serves the metrics in Prometheus' text format.
func (r *Recorder) MetricsHandler() http.Handler {
	return promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{})
}

// health is the body of /healthz and /livez, in kube-proxy's shape.
type health struct {
	LastUpdated  time.Time `json:"lastUpdated"`
	CurrentTime  time.Time `json:"currentTime"`
	NodeEligible *bool     `json:"nodeEligible,omitempty"`
}

// Healthy reports whether no change has waited longer than the health
// timeout for a successful sync.
func (r *Recorder) Healthy() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pendingSince.IsZero() || r.now().Sub(r.pendingSince) <= r.timeout
}

// HealthHandler serves /healthz and /livez: 200 while Healthy, 503
// otherwise, with kube-proxy's JSON body.
func (r *Recorder) HealthHandler() http.Handler {
	mux := http.NewServeMux()
	for path, counter := range map[string]*prometheus.CounterVec{"/healthz": r.healthz, "/livez": r.livez} {
		mux.HandleFunc(path, func(w http.ResponseWriter, _ *http.Request) {
			r.mu.Lock()
			b := health{LastUpdated: r.lastSynced, CurrentTime: r.now()}
			r.mu.Unlock()
			code := http.StatusOK
			if !r.Healthy() {
				code = http.StatusServiceUnavailable
			}
			counter.WithLabelValues(http.StatusText(code)).Inc()
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.WriteHeader(code)
			_ = json.NewEncoder(w).Encode(b)
		})
	}
	return mux
}

// Serve listens on addr and serves h there until ctx ends or stop is
// called (stop closes the listener before it returns). The listen error,
// if any, is returned at once.
func Serve(ctx context.Context, addr string, h http.Handler) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.ErrorS(err, "Metrics or health server stopped", "address", addr)
		}
	}()
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	return func() { cancel(); _ = srv.Close(); _ = ln.Close() }, nil
}
