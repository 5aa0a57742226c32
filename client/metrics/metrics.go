// Package metrics records what a proxier built with kpng does, for
// operators: Prometheus metrics of the rounds delivered to its sink,
// /healthz and /livez with kube-proxy's semantics, and a debug endpoint
// listing what the backend holds and what it could not program. A Recorder
// observes the per-round records of localsink.Feeder
// (watcher.Config.Observe, remote.Config.Observe); client.Run programs and
// the kpng binary serve it with --metrics-bind-address,
// --healthz-bind-address and --debug-bind-address. A backend that applies
// the rounds after its Sync returns (kpng-callout) says so with
// Options.AppliedLater and reports its successes with Recorder.Applied,
// so that its health follows what it really applied.
//
// The metric names are kube-proxy's with the kpng_ prefix instead of
// kubeproxy_, and a service_proxy_name label: kpng runs beside kube-proxy,
// often several proxiers on one node, and a dashboard must not add their
// figures to kube-proxy's. The buckets are kube-proxy's. kpng's rounds are
// not per IP family, so no metric has kube-proxy's ip_family label.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
	"sigs.k8s.io/kpng/model/endpoints"
)

// DefaultHealthTimeout is how long a change may wait for a successful sync
// before the proxier is unhealthy (kube-proxy's --healthz-timeout default
// is 2 × its sync period; kpng syncs changes at once, so a fixed 60 s).
const DefaultHealthTimeout = 60 * time.Second

// Namespace is the prefix of kpng's metric names.
const Namespace = "kpng"

// maxWaiting bounds the queue times an AppliedLater Recorder keeps while
// its backend does not apply them, and maxUnmeasured the trigger times:
// beyond, the queue times are merged (health errs towards unhealthy) and
// the newer trigger times are not measured.
const (
	maxWaiting    = 10000
	maxUnmeasured = 10000
)

// Recorder turns the rounds delivered to a sink into metrics, health and
// the debug endpoint's view. Observe and Queued may be called from one
// goroutine at a time (the Feeder's guarantee); everything else, Applied
// included, from any.
type Recorder struct {
	name         string
	reg          *prometheus.Registry
	timeout      time.Duration
	now          func() time.Time
	appliedLater bool

	duration, fullDuration, partialDuration prometheus.Histogram
	networkProgramming                      prometheus.Histogram
	lastSync, lastQueued                    prometheus.Gauge
	serviceChanges, endpointChanges         prometheus.Counter
	servicesPending, endpointsPending       prometheus.Gauge
	noLocal                                 *prometheus.GaugeVec
	failures                                prometheus.Counter
	rounds                                  *prometheus.CounterVec
	healthz, livez                          *prometheus.CounterVec
	events, coalesced                       prometheus.Counter
	delivery                                prometheus.Histogram
	services, endpoints                     prometheus.Gauge
	problems                                *prometheus.GaugeVec
	problemsSeen                            *prometheus.CounterVec
	nodeEligibleGauge                       prometheus.Gauge

	mu sync.Mutex
	// pendingSince is when the oldest change not yet applied was
	// delivered (zero: none); lastSynced when the last round was applied.
	pendingSince, lastSynced time.Time
	// With appliedLater: waiting are the queue times of the changes not
	// applied yet, oldest first (pendingSince is the first), and
	// waitingAfter, when not zero, the newest queue time of those beyond
	// maxWaiting, which are not listed; appliedUpTo is the latest time
	// given to Applied; unmeasured are the trigger times of the rounds
	// delivered and not applied yet (nUnmeasured times in all).
	waiting      []time.Time
	waitingAfter time.Time
	appliedUpTo  time.Time
	unmeasured   []delivered
	nUnmeasured  int
	// nodeEligible is the node's eligibility (nil: not known, not
	// checked).
	nodeEligible *bool
	// proxyMode is what /proxyMode answers (SetProxyMode).
	proxyMode string
	// held is what the backend holds, noLocalOf each service's count of
	// service ports with a Local policy and no local endpoint (internal,
	// external); nEndpoints the endpoints held.
	held       map[model.ServiceKey]*model.ServiceEndpoints
	noLocalOf  map[model.ServiceKey][2]int
	noLocalSum [2]int
	nEndpoints int
	// refused are the problems the backend reported after the last
	// round; reasons every reason counted so far (set to 0 when gone).
	refused []model.Problem
	reasons map[model.Reason]bool
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
	// AppliedLater says that the backend applies the rounds after its
	// Sync returns (it hands them to a queue, another process, a command
	// run later): a round delivered without error is not applied yet.
	// The backend then reports each success with Applied, and the
	// Recorder counts a change as waiting until a state at least as new
	// is applied: health (a backend that keeps failing turns /healthz and
	// /livez 503 after HealthTimeout), the last sync and last queued
	// timestamps and the network programming latency follow Applied, not
	// the rounds. kpng-callout is such a backend.
	AppliedLater bool
}

// delivered are the trigger times of a round delivered to an AppliedLater
// backend, measured when a state at least as new as the round's is
// applied.
type delivered struct {
	start    time.Time
	triggers map[model.ServiceKey][]time.Time
}

// syncBuckets are kube-proxy's buckets of sync durations: 1 ms to 16 s.
var syncBuckets = prometheus.ExponentialBuckets(0.001, 2, 15)

// networkProgrammingBuckets are kube-proxy's buckets of network
// programming latency: 0.25 s, 0.5 s, 1–59 s by 1 s, 60–115 s by 5 s,
// 2–5 min by 30 s.
func networkProgrammingBuckets() []float64 {
	b := prometheus.LinearBuckets(0.25, 0.25, 2)
	b = append(b, prometheus.LinearBuckets(1, 1, 59)...)
	b = append(b, prometheus.LinearBuckets(60, 5, 12)...)
	return append(b, prometheus.LinearBuckets(120, 30, 7)...)
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
		return prometheus.Opts{Namespace: Namespace, Name: name, Help: help, ConstLabels: labels}
	}
	histogram := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: Namespace, Name: name, Help: help, ConstLabels: labels, Buckets: buckets})
	}
	// Nothing is applied yet: without a first successful round within
	// the timeout, the proxier is unhealthy.
	r := &Recorder{
		name: opts.ServiceProxyName, reg: prometheus.NewRegistry(), timeout: opts.HealthTimeout, now: opts.Now, pendingSince: opts.Now(),
		appliedLater: opts.AppliedLater,
		held:         map[model.ServiceKey]*model.ServiceEndpoints{}, noLocalOf: map[model.ServiceKey][2]int{}, reasons: map[model.Reason]bool{},
	}
	r.duration = histogram("sync_proxy_rules_duration_seconds", "How long one round took to reach the backend and be applied (its Sync included), in seconds.", syncBuckets)
	r.fullDuration = histogram("sync_full_proxy_rules_duration_seconds", "sync_proxy_rules_duration_seconds of the rounds that deliver the whole state (Reset: the first, and after the backend asked for it).", syncBuckets)
	r.partialDuration = histogram("sync_partial_proxy_rules_duration_seconds", "sync_proxy_rules_duration_seconds of the rounds that deliver changes only.", syncBuckets)
	r.networkProgramming = histogram("network_programming_duration_seconds", "From a change's trigger time in the cluster (the EndpointSlice controller's endpoints.kubernetes.io/last-change-trigger-time) to the backend's successful sync of it, in seconds.", networkProgrammingBuckets())
	r.lastSync = prometheus.NewGauge(prometheus.GaugeOpts(f("sync_proxy_rules_last_timestamp_seconds", "When the last round was applied successfully (Unix time; for a backend that applies later, when it last reported a state applied).")))
	r.lastQueued = prometheus.NewGauge(prometheus.GaugeOpts(f("sync_proxy_rules_last_queued_timestamp_seconds", "When the oldest change not yet applied was queued (Unix time; 0 when none is waiting).")))
	r.serviceChanges = prometheus.NewCounter(prometheus.CounterOpts(f("sync_proxy_rules_service_changes_total", "Service changes delivered to the backend (one per Update).")))
	r.endpointChanges = prometheus.NewCounter(prometheus.CounterOpts(f("sync_proxy_rules_endpoint_changes_total", "Endpoints added, changed or removed in the changes delivered.")))
	r.servicesPending = prometheus.NewGauge(prometheus.GaugeOpts(f("sync_proxy_rules_service_changes_pending", "Service changes delivered to the backend and not applied yet (its Sync failed; kpng retries).")))
	r.endpointsPending = prometheus.NewGauge(prometheus.GaugeOpts(f("sync_proxy_rules_endpoint_changes_pending", "Endpoint changes delivered to the backend and not applied yet.")))
	r.noLocal = prometheus.NewGaugeVec(prometheus.GaugeOpts(f("sync_proxy_rules_no_local_endpoints_total", "Service ports with a Local traffic policy (internal or external) whose traffic this node drops: endpoints elsewhere, none here.")), []string{"traffic_policy"})
	r.failures = prometheus.NewCounter(prometheus.CounterOpts(f("sync_proxy_rules_failures_total", "Rounds the backend failed to apply (its Sync returned an error; kpng retries).")))
	r.rounds = prometheus.NewCounterVec(prometheus.CounterOpts(f("rounds_total", "Rounds delivered, by kind: change, reset (the whole state) or retry (by the retry timer, after a failure).")), []string{"kind"})
	r.healthz = prometheus.NewCounterVec(prometheus.CounterOpts(f("proxy_healthz_total", "Answers of /healthz, by HTTP code.")), []string{"code"})
	r.livez = prometheus.NewCounterVec(prometheus.CounterOpts(f("proxy_livez_total", "Answers of /livez, by HTTP code.")), []string{"code"})
	r.events = prometheus.NewCounter(prometheus.CounterOpts(f("events_total", "Service and EndpointSlice events received from the API server (kube input).")))
	r.coalesced = prometheus.NewCounter(prometheus.CounterOpts(f("events_coalesced_total", "Events that did not become a service change of their own: merged with other events of the same service, or changing nothing the backend sees.")))
	r.delivery = histogram("event_delivery_duration_seconds", "From the first informer event of a round to the round's delivery to the backend (coalescing and kpng's own work), in seconds.", syncBuckets)
	r.services = prometheus.NewGauge(prometheus.GaugeOpts(f("services", "Services the backend holds.")))
	r.endpoints = prometheus.NewGauge(prometheus.GaugeOpts(f("endpoints", "Endpoints of the services the backend holds.")))
	r.problems = prometheus.NewGaugeVec(prometheus.GaugeOpts(f("service_problems", "Parts of services the backend could not program, by reason (AddressConflict, BadField, UnsupportedProtocol, Other); listed on /debug/kpng/services.")), []string{"reason"})
	r.problemsSeen = prometheus.NewCounterVec(prometheus.CounterOpts(f("service_problems_total", "Problems reported by the backend, each once when it appears, by reason.")), []string{"reason"})
	r.nodeEligibleGauge = prometheus.NewGauge(prometheus.GaugeOpts(f("node_eligible", "1 when the node is eligible for load-balancer traffic (it exists, is not being deleted, has no ToBeDeletedByClusterAutoscaler taint), 0 when not; /healthz fails then.")))
	r.reg.MustRegister(r.duration, r.fullDuration, r.partialDuration, r.networkProgramming, r.lastSync, r.lastQueued,
		r.serviceChanges, r.endpointChanges, r.servicesPending, r.endpointsPending, r.noLocal, r.failures, r.rounds,
		r.healthz, r.livez, r.events, r.coalesced, r.delivery, r.services, r.endpoints, r.problems, r.problemsSeen,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, policy := range []string{"internal", "external"} {
		r.noLocal.WithLabelValues(policy)
	}
	// Nothing is applied yet: it waits since now.
	if r.appliedLater {
		r.waiting = []time.Time{r.pendingSince}
	}
	r.setPending(r.pendingSince)
	return r
}

// Registry is the Recorder's registry, for a backend's own metrics.
func (r *Recorder) Registry() *prometheus.Registry { return r.reg }

// Opts returns the options of a metric of this Recorder: name with the
// kpng_ prefix and the service_proxy_name label, for a backend's own
// metrics.
func (r *Recorder) Opts(name, help string) prometheus.Opts {
	return prometheus.Opts{Namespace: Namespace, Name: name, Help: help, ConstLabels: prometheus.Labels{"service_proxy_name": r.name}}
}

// Counter returns the counter of this Recorder named name (with Opts' prefix
// and label), registering it the first time, for a backend's own counts
// (the reference backends' failure counters).
func (r *Recorder) Counter(name, help string) (prometheus.Counter, error) {
	c := prometheus.NewCounter(prometheus.CounterOpts(r.Opts(name, help)))
	if err := r.reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(prometheus.Counter); ok {
				return existing, nil
			}
		}
		return nil, fmt.Errorf("metric %s_%s: %w", Namespace, name, err)
	}
	return c, nil
}

// Queued records that a round with changes was queued at t (the
// signature of FeederOptions.Queued): from then on, it must be applied
// within the health timeout.
func (r *Recorder) Queued(t time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.wait(t)
}

// wait records that a change waits since t. r.mu is held.
func (r *Recorder) wait(t time.Time) {
	if r.appliedLater {
		switch n := len(r.waiting); {
		case n > 0 && !t.After(r.waiting[n-1]):
			// not newer than the newest listed: nothing to add
		case !r.waitingAfter.IsZero() || n >= maxWaiting:
			if t.After(r.waitingAfter) {
				r.waitingAfter = t
			}
		default:
			r.waiting = append(r.waiting, t)
		}
	}
	if r.pendingSince.IsZero() {
		r.setPending(t)
	}
}

// setPending sets the time since which the oldest change not applied
// waits (zero: none). r.mu is held.
func (r *Recorder) setPending(t time.Time) {
	r.pendingSince = t
	if t.IsZero() {
		r.lastQueued.Set(0)
	} else {
		r.lastQueued.Set(float64(t.UnixNano()) / 1e9)
	}
}

// synced records a successful sync at t. r.mu is held.
func (r *Recorder) synced(t time.Time) {
	r.lastSynced = t
	r.lastSync.Set(float64(t.UnixNano()) / 1e9)
}

// Applied reports, for a Recorder with Options.AppliedLater, that the
// backend has applied a state at least as new as the one delivered to it
// at upTo: the changes queued up to upTo are applied, those queued after
// still wait. The backend takes upTo from its clock in its Sync, when it
// receives the state, and calls Applied when that state, or a newer one,
// has been applied successfully, from any goroutine, before or after the
// round's Observe. Without AppliedLater, Applied does nothing (the rounds
// say when they are applied).
func (r *Recorder) Applied(upTo time.Time) {
	if !r.appliedLater {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	if upTo.After(r.appliedUpTo) {
		r.appliedUpTo = upTo
	}
	r.synced(now)
	i := 0
	for i < len(r.waiting) && !r.waiting[i].After(upTo) {
		i++
	}
	r.waiting = r.waiting[i:]
	if len(r.waiting) == 0 && !r.waitingAfter.IsZero() {
		if r.waitingAfter.After(upTo) {
			// Some change queued after upTo waits, its time not
			// kept: it waits since upTo at the earliest.
			r.waiting = append(r.waiting, upTo)
		} else {
			r.waitingAfter = time.Time{}
		}
	}
	if len(r.waiting) == 0 {
		r.waiting = nil
		r.setPending(time.Time{})
	} else {
		r.setPending(r.waiting[0])
	}

	i = 0
	for ; i < len(r.unmeasured) && !r.unmeasured[i].start.After(upTo); i++ {
		r.measure(now, r.unmeasured[i].triggers)
		r.nUnmeasured -= count(r.unmeasured[i].triggers)
	}
	r.unmeasured = r.unmeasured[i:]
	if len(r.unmeasured) == 0 {
		r.unmeasured = nil
	}
}

// SetNodeEligible records whether the node is eligible for load-balancer
// traffic (the signature of watcher.Config.NodeEligible): /healthz fails
// while it is not. Until it is first called, the node is not checked.
func (r *Recorder) SetNodeEligible(eligible bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.nodeEligible == nil {
		r.reg.MustRegister(r.nodeEligibleGauge)
	}
	r.nodeEligible = &eligible
	if eligible {
		r.nodeEligibleGauge.Set(1)
	} else {
		r.nodeEligibleGauge.Set(0)
	}
}

// Observe records one round (the signature of FeederOptions.Observe).
func (r *Recorder) Observe(round localsink.Round) {
	end := round.Start.Add(round.Duration)
	r.duration.Observe(round.Duration.Seconds())
	if round.Reset {
		r.fullDuration.Observe(round.Duration.Seconds())
	} else {
		r.partialDuration.Observe(round.Duration.Seconds())
	}
	r.serviceChanges.Add(float64(round.Services))
	r.endpointChanges.Add(float64(round.Endpoints))
	r.servicesPending.Set(float64(round.PendingServices))
	r.endpointsPending.Set(float64(round.PendingEndpoints))
	switch {
	case round.Retry:
		r.rounds.WithLabelValues("retry").Inc()
	case round.Reset:
		r.rounds.WithLabelValues("reset").Inc()
	default:
		r.rounds.WithLabelValues("change").Inc()
	}
	if round.Events > 0 {
		r.events.Add(float64(round.Events))
		r.coalesced.Add(float64(max(round.Events-round.Services, 0)))
	}
	if !round.FirstEvent.IsZero() {
		r.delivery.Observe(round.Start.Sub(round.FirstEvent).Seconds())
	}
	if !r.appliedLater {
		r.measure(end, round.Triggers)
	}
	for _, p := range round.NewProblems {
		r.problemsSeen.WithLabelValues(string(p.Reason)).Inc()
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	r.hold(round)
	switch {
	case round.Err != nil:
		r.failures.Inc()
		if r.pendingSince.IsZero() { // a retry without Queued
			r.wait(round.Start)
		}
	case r.appliedLater && !round.Start.After(r.appliedUpTo):
		// The backend applied this round's state, or a newer one,
		// before the round ended.
		r.measure(r.lastSynced, round.Triggers)
	case r.appliedLater:
		// Not applied yet: Applied measures the triggers.
		if n := count(round.Triggers); n > 0 && r.nUnmeasured+n <= maxUnmeasured {
			r.unmeasured = append(r.unmeasured, delivered{start: round.Start, triggers: round.Triggers})
			r.nUnmeasured += n
		}
	default:
		r.setPending(time.Time{})
		r.synced(end)
	}
}

// measure records the network programming latency of triggers, changes
// applied at end.
func (r *Recorder) measure(end time.Time, triggers map[model.ServiceKey][]time.Time) {
	for key, times := range triggers {
		for _, t := range times {
			latency := end.Sub(t)
			r.networkProgramming.Observe(latency.Seconds())
			klog.V(4).InfoS("Network programming", "service", klog.KRef(key.Namespace, key.Name), "elapsed", latency)
		}
	}
}

// count returns the number of trigger times in triggers.
func count(triggers map[model.ServiceKey][]time.Time) int {
	n := 0
	for _, times := range triggers {
		n += len(times)
	}
	return n
}

// hold updates the view of what the backend holds with a round. r.mu is
// held.
func (r *Recorder) hold(round localsink.Round) {
	if round.Reset {
		clear(r.held)
		clear(r.noLocalOf)
		r.noLocalSum, r.nEndpoints = [2]int{}, 0
	}
	for _, c := range round.Changes {
		if prev := r.held[c.Key]; prev != nil {
			r.nEndpoints -= len(prev.Endpoints)
		}
		old := r.noLocalOf[c.Key]
		r.noLocalSum[0] -= old[0]
		r.noLocalSum[1] -= old[1]
		if c.Cur == nil || c.Cur.Service == nil {
			delete(r.held, c.Key)
			delete(r.noLocalOf, c.Key)
			continue
		}
		r.held[c.Key] = c.Cur
		r.nEndpoints += len(c.Cur.Endpoints)
		n := noLocalEndpoints(c.Cur)
		if n == ([2]int{}) {
			delete(r.noLocalOf, c.Key)
		} else {
			r.noLocalOf[c.Key] = n
		}
		r.noLocalSum[0] += n[0]
		r.noLocalSum[1] += n[1]
	}
	r.services.Set(float64(len(r.held)))
	r.endpoints.Set(float64(r.nEndpoints))
	r.noLocal.WithLabelValues("internal").Set(float64(r.noLocalSum[0]))
	r.noLocal.WithLabelValues("external").Set(float64(r.noLocalSum[1]))

	r.refused = round.Problems
	count := map[model.Reason]int{}
	for _, p := range round.Problems {
		count[p.Reason]++
		r.reasons[p.Reason] = true
	}
	for reason := range r.reasons {
		r.problems.WithLabelValues(string(reason)).Set(float64(count[reason]))
	}
}

// noLocalEndpoints counts the ports of se whose internal and external
// traffic this node drops: a Local policy, usable endpoints, none on this
// node (kube-proxy's sync_proxy_rules_no_local_endpoints_total, counted
// per service port, both families together).
func noLocalEndpoints(se *model.ServiceEndpoints) [2]int {
	svc := se.Service
	var n [2]int
	if !svc.InternalTrafficToLocal && !svc.ExternalTrafficToLocal {
		return n
	}
	for _, p := range svc.Ports {
		if p == nil {
			continue
		}
		cats := endpoints.CategorizePort(p, se.Endpoints)
		if _, v := cats.Internal(svc); v == endpoints.Drop && svc.InternalTrafficToLocal {
			n[0]++
		}
		if _, v := cats.External(svc); v == endpoints.Drop && svc.ExternalTrafficToLocal {
			n[1]++
		}
	}
	return n
}

// MetricsHandler serves the metrics in Prometheus' text format.
func (r *Recorder) MetricsHandler() http.Handler {
	return promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{})
}

// Healthy reports whether no change has waited longer than the health
// timeout for a successful sync: /livez, and /healthz but for the node's
// eligibility. Health check node ports answer 503 while it is false.
func (r *Recorder) Healthy() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.healthyLocked()
}

func (r *Recorder) healthyLocked() bool {
	return r.pendingSince.IsZero() || r.now().Sub(r.pendingSince) <= r.timeout
}

// timeouts bound how long a client of the metrics, health and debug
// servers may hold a connection: to send its request (readHeader, read),
// to take the answer (write: a client that stops reading is dropped),
// and between two requests on one connection (idle).
type timeouts struct {
	readHeader, read, write, idle time.Duration
}

// serveTimeouts are Serve's (tests shorten them): room for a Prometheus
// scrape (10 s by default) or the debug endpoint's answer at 50,000
// services on loopback, and an idle keep-alive connection kept for a
// minute, as a scraper polling every 15 to 60 s reuses it.
var serveTimeouts = timeouts{readHeader: 10 * time.Second, read: 10 * time.Second, write: 30 * time.Second, idle: time.Minute}

// maxHeaderBytes bounds a request's header: the endpoints take none
// worth more than a few hundred bytes.
const maxHeaderBytes = 64 << 10

// Serve listens on addr and serves h there until ctx ends or stop is
// called (stop closes the listener before it returns). A request must
// arrive within 10 s, its answer be taken within 30 s, and an idle
// connection is closed after a minute. The listen error, if any, is
// returned at once.
func Serve(ctx context.Context, addr string, h http.Handler) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	t := serveTimeouts
	srv := &http.Server{Handler: h, ReadHeaderTimeout: t.readHeader, ReadTimeout: t.read, WriteTimeout: t.write, IdleTimeout: t.idle, MaxHeaderBytes: maxHeaderBytes}
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
