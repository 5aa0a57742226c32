package localsink

import (
	"errors"
	"reflect"
	"slices"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/model"
)

// Defaults of FeederOptions.
const (
	// DefaultMinRetry is the delay before the first retry of a failed round.
	DefaultMinRetry = time.Second
	// DefaultMaxRetry bounds the delay between retries (it doubles after
	// each failure).
	DefaultMaxRetry = time.Minute
)

// FeederOptions configure a Feeder.
type FeederOptions struct {
	// NoRetry turns the retry timer off: a failed round is delivered again
	// only with the next Sync (for a sink whose failure ends the feed, such
	// as a network stream).
	NoRetry bool
	// MinRetry and MaxRetry bound the backoff between retries of a failed
	// round (defaults DefaultMinRetry and DefaultMaxRetry).
	MinRetry, MaxRetry time.Duration
	// Observe, if set, is called after each round delivered to the sink,
	// with its record, from the goroutine that delivered it (never
	// concurrently).
	Observe func(Round)
	// Queued, if set, is called when the source ends a round that has
	// something to deliver, before the sink is called: a health check
	// measures from there how long the change waits (a sink whose Sync
	// hangs never reaches Observe).
	Queued func(time.Time)
}

// Round is the record of one round delivered to a sink: what a metrics or
// health layer needs.
type Round struct {
	// Start is when the delivery began, Duration how long it took, the
	// sink's Sync included.
	Start    time.Time
	Duration time.Duration
	// Reset is true when the round started with Reset (the whole state).
	Reset bool
	// Retry is true when the round was delivered by the retry timer, not
	// by the source.
	Retry bool
	// Services is the number of Update calls; Endpoints the number of
	// endpoints added, changed or removed in them (EndpointChanges).
	Services, Endpoints int
	// Cluster is true when the round gave the sink the cluster-level
	// facts (ClusterSink.SetCluster).
	Cluster bool
	// Err is the sink's Sync error (nil: applied).
	Err error
	// Changes are the services of the Update calls, in order, with their
	// new value (nil: deleted); after a Reset, the whole state. Filled
	// only when FeederOptions.Observe is set.
	Changes []Change
	// Events is the number of source events (informer notifications,
	// given with Feeder.Seen) behind the changes of the round, FirstEvent
	// when the first of them was received (zero when the source does not
	// say, and for retries). Events that changed nothing for the sink
	// count in the next round delivered.
	Events     int
	FirstEvent time.Time
	// Triggers, for a round applied (Err nil), are the times the changes
	// it applied were triggered in the cluster, by service (given with
	// Feeder.Triggered: the EndpointSlice controller's
	// last-change-trigger-time), those of earlier rounds that failed
	// included: network programming latency is measured from them.
	Triggers map[model.ServiceKey][]time.Time
	// PendingServices and PendingEndpoints are the service and endpoint
	// changes delivered since the last round applied and not applied yet:
	// 0 when Err is nil, those of this round and the failed ones before
	// it otherwise.
	PendingServices, PendingEndpoints int
	// Problems are what the sink reports it could not program, after its
	// Sync (ProblemReporter; nil when it does not report, or has none).
	// NewProblems are those it did not report after the round before:
	// the Feeder logs each of them once, at error level.
	Problems, NewProblems []model.Problem
}

// Change is one service delivered in a round: its key and new value (nil:
// deleted).
type Change struct {
	Key model.ServiceKey
	Cur *model.ServiceEndpoints
}

// maxUnsyncedTriggers bounds the trigger times a Feeder keeps while its
// sink fails: beyond, the newer ones are not measured.
const maxUnsyncedTriggers = 10000

// Feeder delivers a source's state to a Sink in rounds, keeping the Sink
// contract: the source says what each service is now (Update, SetAll),
// and what the cluster-level facts are (SetCluster, delivered to a
// ClusterSink), and ends a round with Sync; the Feeder calls the sink only
// for the services that changed since what the sink holds, in key order,
// with their previous value, unchanged parts pointer-equal. When the sink's Sync
// fails, the Feeder calls it again, with the newer changes if any, with
// the source's next Sync or after a backoff, whichever comes first
// (ErrResync: Reset and the whole state).
//
// Each round delivered has a record (Round, to FeederOptions.Observe): its
// size and duration, the sink's result and problems (ProblemReporter),
// and what the source said of its changes (Seen, Triggered), from which
// kpng's metrics and health are computed.
//
// The source's calls may come from any goroutine, one at a time; retries
// run on a timer, serialized with them. Close stops the retries. The
// Feeder holds only pointers to the values it was given, so many Feeders
// over one state cost little.
type Feeder struct {
	sink Sink
	opts FeederOptions

	mu sync.Mutex
	// held is what the sink was given; pending the newer value of the
	// services that differ or may differ from it (nil: gone), from the
	// source's completed rounds; staged those of the source's round in
	// progress, which a retry must not deliver half of.
	held    map[model.ServiceKey]*model.ServiceEndpoints
	pending map[model.ServiceKey]*model.ServiceEndpoints
	staged  map[model.ServiceKey]*model.ServiceEndpoints
	// reset: the next round starts with Reset (first round, asked by the
	// sink through ErrResync); stagedReset: the source asked for one in
	// its round in progress; failed: the sink's last Sync failed, so the
	// next round has a Sync even with no Update.
	reset, stagedReset, failed bool
	// heldCluster are the cluster-level facts as of the last delivery;
	// pendingCluster and stagedCluster the newer ones of the completed
	// rounds and of the round in progress, set when clusterPending and
	// clusterStaged; clusterSink is the sink, when it wants them.
	heldCluster, pendingCluster, stagedCluster *model.Cluster
	clusterPending, clusterStaged              bool
	clusterSink                                ClusterSink
	// timer is the pending retry, backoff the delay of the next one.
	// seen is SetAll's set of the keys given, kept between calls.
	seen    map[model.ServiceKey]struct{}
	timer   *time.Timer
	retryIn time.Duration
	backoff time.Duration
	closed  bool

	// stagedTriggers and pendingTriggers are the trigger times of the
	// services given (Triggered), as staged and pending are; unsynced
	// those of the services delivered and not applied yet (nUnsynced
	// times in all).
	stagedTriggers, pendingTriggers map[model.ServiceKey][]time.Time
	unsynced                        map[model.ServiceKey][]time.Time
	nUnsynced                       int
	// stagedEvents/stagedFirst and events/firstEvent are the source's
	// events (Seen), staged and pending.
	stagedEvents, events    int
	stagedFirst, firstEvent time.Time
	// unapplied counts the service and endpoint changes delivered since
	// the last round applied.
	unappliedServices, unappliedEndpoints int
	// problems are the sink's problems after the last round.
	problems map[model.Problem]struct{}
}

// NewFeeder returns a Feeder delivering to sink. Its first round starts
// with Reset.
func NewFeeder(sink Sink, opts FeederOptions) *Feeder {
	if opts.MinRetry <= 0 {
		opts.MinRetry = DefaultMinRetry
	}
	if opts.MaxRetry < opts.MinRetry {
		opts.MaxRetry = max(DefaultMaxRetry, opts.MinRetry)
	}
	cs, _ := sink.(ClusterSink)
	return &Feeder{
		sink:        sink,
		clusterSink: cs,
		opts:        opts,
		held:        map[model.ServiceKey]*model.ServiceEndpoints{},
		pending:     map[model.ServiceKey]*model.ServiceEndpoints{},
		staged:      map[model.ServiceKey]*model.ServiceEndpoints{},
		reset:       true,
		backoff:     opts.MinRetry,

		stagedTriggers:  map[model.ServiceKey][]time.Time{},
		pendingTriggers: map[model.ServiceKey][]time.Time{},
		problems:        map[model.Problem]struct{}{},
	}
}

// Triggered records that the changes of service key given since the
// source's last Sync were triggered in the cluster at times (the
// EndpointSlice controller's last-change-trigger-time annotation). When
// the round delivering a change of key is applied, its Round.Triggers hold
// them; the sink gets them too when it is a TriggerSink. Times of a
// service whose value does not change for the sink are dropped: nothing
// is programmed for them.
func (f *Feeder) Triggered(key model.ServiceKey, times ...time.Time) {
	if len(times) == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stagedTriggers[key] = append(f.stagedTriggers[key], times...)
}

// Seen records that the changes given since the source's last Sync come
// from n source events, the first received at first: the next round's
// Events and FirstEvent.
func (f *Feeder) Seen(n int, first time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stagedEvents += n
	if f.stagedFirst.IsZero() || (!first.IsZero() && first.Before(f.stagedFirst)) {
		f.stagedFirst = first
	}
}

// Reset makes the next round start with Reset and the whole state: the
// services given since the last Sync, over those held.
func (f *Feeder) Reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stagedReset = true
}

// Update says that service key is now se (nil: gone). It is delivered on
// the next Sync, if it differs from what the sink was given.
func (f *Feeder) Update(key model.ServiceKey, se *model.ServiceEndpoints) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.update(key, se)
}

func (f *Feeder) update(key model.ServiceKey, se *model.ServiceEndpoints) {
	if se != nil && se.Service == nil {
		se = nil // endpoints without a service are no service
	}
	if f.latest(key) == se {
		return // values are immutable: the same pointer is the same value
	}
	f.staged[key] = se
}

// latest returns the newest value given for key: staged, pending or held.
func (f *Feeder) latest(key model.ServiceKey) *model.ServiceEndpoints {
	if se, ok := f.staged[key]; ok {
		return se
	}
	if se, ok := f.pending[key]; ok {
		return se
	}
	return f.held[key]
}

// SetCluster says that the cluster-level facts are now c (nil: none). They
// are delivered on the next Sync to a sink that implements ClusterSink,
// if they differ from what it was given.
func (f *Feeder) SetCluster(c *model.Cluster) {
	f.mu.Lock()
	defer f.mu.Unlock()
	latest := f.heldCluster
	switch {
	case f.clusterStaged:
		latest = f.stagedCluster
	case f.clusterPending:
		latest = f.pendingCluster
	}
	if latest == c || latest.Equal(c) {
		return
	}
	f.stagedCluster, f.clusterStaged = c, true
}

// SetAll says that items is the whole state: the services held and not in
// items are gone. Unchanged services cost a pointer comparison.
func (f *Feeder) SetAll(items []*model.ServiceEndpoints) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.seen == nil {
		f.seen = make(map[model.ServiceKey]struct{}, len(items))
	}
	seen := f.seen
	defer clear(seen)
	for _, se := range items {
		if se == nil || se.Service == nil {
			continue
		}
		key := se.Service.Key()
		if _, dup := seen[key]; dup {
			continue // the first wins
		}
		seen[key] = struct{}{}
		f.update(key, se)
	}
	for _, m := range []map[model.ServiceKey]*model.ServiceEndpoints{f.held, f.pending, f.staged} {
		for key := range m {
			if _, ok := seen[key]; !ok {
				f.staged[key] = nil
			}
		}
	}
}

// Len returns the number of services the sink holds, with those given
// since the last Sync.
func (f *Feeder) Len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := len(f.held)
	for _, m := range []map[model.ServiceKey]*model.ServiceEndpoints{f.pending, f.staged} {
		for key := range m {
			_, held := f.held[key]
			switch se := f.latest(key); {
			case se != nil && !held:
				n++
			case se == nil && held:
				n--
			}
		}
	}
	return n
}

// Sync ends the source's round: it delivers what changed (nothing at all
// when nothing did, but for a first round, a Reset or after a failure) and
// returns the sink's Sync error. After an error, the sink's Sync is called
// again with the next round, or by a retry after a backoff.
func (f *Feeder) Sync() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return errors.New("feeder closed")
	}
	// The source's round is complete: it joins what is pending.
	for key, se := range f.staged {
		f.pending[key] = se
	}
	clear(f.staged)
	if f.clusterStaged {
		f.pendingCluster, f.clusterPending = f.stagedCluster, true
		f.stagedCluster, f.clusterStaged = nil, false
	}
	if f.stagedReset {
		f.reset, f.stagedReset = true, false
	}
	for key, times := range f.stagedTriggers {
		f.pendingTriggers[key] = append(f.pendingTriggers[key], times...)
	}
	clear(f.stagedTriggers)
	f.events += f.stagedEvents
	if f.firstEvent.IsZero() || (!f.stagedFirst.IsZero() && f.stagedFirst.Before(f.firstEvent)) {
		f.firstEvent = f.stagedFirst
	}
	f.stagedEvents, f.stagedFirst = 0, time.Time{}
	if f.opts.Queued != nil && (len(f.pending) > 0 || f.reset || f.clusterPending) {
		f.opts.Queued(time.Now())
	}
	return f.deliver(false)
}

// Close stops the retries and waits for one in progress. The Feeder must
// not be used afterwards.
func (f *Feeder) Close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	if f.timer != nil {
		f.timer.Stop()
		f.timer = nil
	}
}

// Pending returns the number of services given and not yet delivered.
func (f *Feeder) Pending() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := len(f.pending)
	for key := range f.staged {
		if _, ok := f.pending[key]; !ok {
			n++
		}
	}
	return n
}

// Failed reports whether the sink's last Sync failed (a retry is due).
func (f *Feeder) Failed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.failed
}

// deliver sends one round to the sink. f.mu is held.
func (f *Feeder) deliver(retry bool) error {
	reset := f.reset
	keys := make([]model.ServiceKey, 0, len(f.pending))
	if reset {
		for key := range f.held {
			if _, ok := f.pending[key]; !ok {
				keys = append(keys, key)
			}
		}
	}
	for key := range f.pending {
		keys = append(keys, key)
	}
	slices.SortFunc(keys, model.ServiceKey.Compare)

	rec := Round{Start: time.Now(), Reset: reset, Retry: retry, Events: f.events, FirstEvent: f.firstEvent}
	triggerSink, _ := f.sink.(TriggerSink)
	if reset {
		f.sink.Reset()
	}
	if f.clusterPending || reset {
		cur := f.heldCluster
		if f.clusterPending {
			cur = f.pendingCluster
		}
		if f.clusterSink != nil && ((reset && !cur.IsZero()) || (!reset && !cur.Equal(f.heldCluster))) {
			f.clusterSink.SetCluster(cur)
			rec.Cluster = true
		}
		f.heldCluster, f.pendingCluster, f.clusterPending = cur, nil, false
	}
	for _, key := range keys {
		cur, ok := f.pending[key]
		if !ok {
			cur = f.held[key]
		}
		delete(f.pending, key)
		var prev *model.ServiceEndpoints
		if !reset {
			prev = f.held[key]
		}
		cur = share(prev, normalize(cur))
		if cur == nil {
			delete(f.held, key)
		} else {
			f.held[key] = cur
		}
		if cur == prev {
			continue // unchanged after all
		}
		f.sink.Update(key, prev, cur)
		rec.Services++
		rec.Endpoints += countEndpointChanges(prev, cur)
		if f.opts.Observe != nil {
			rec.Changes = append(rec.Changes, Change{Key: key, Cur: cur})
		}
		if times := f.pendingTriggers[key]; len(times) > 0 {
			if triggerSink != nil {
				triggerSink.Triggered(key, times)
			}
			f.keepTriggers(key, times)
		}
	}
	// The trigger times of the services that did not change for the sink
	// measure nothing.
	clear(f.pendingTriggers)
	if len(keys) > 1024 {
		// A Go map keeps its buckets: do not hold a whole state's worth
		// of them for the few services of later rounds.
		f.pending = map[model.ServiceKey]*model.ServiceEndpoints{}
	}
	if !reset && !f.failed && rec.Services == 0 && !rec.Cluster {
		// Nothing changed: no round. Its events count in the next one.
		f.firstEvent = time.Time{}
		return nil
	}
	f.events, f.firstEvent = 0, time.Time{}
	f.reset = false
	rec.Err = f.sink.Sync()
	rec.Duration = time.Since(rec.Start)
	if pr, ok := f.sink.(ProblemReporter); ok {
		rec.Problems = pr.Problems()
		rec.NewProblems = f.newProblems(rec.Problems)
	}
	if rec.Err == nil {
		f.failed = false
		f.backoff = f.opts.MinRetry
		if f.timer != nil {
			f.timer.Stop()
			f.timer = nil
		}
		rec.Triggers, f.unsynced, f.nUnsynced = f.unsynced, nil, 0
		f.unappliedServices, f.unappliedEndpoints = 0, 0
	} else {
		f.unappliedServices += rec.Services
		f.unappliedEndpoints += rec.Endpoints
		rec.PendingServices, rec.PendingEndpoints = f.unappliedServices, f.unappliedEndpoints
		f.failed = true
		f.reset = errors.Is(rec.Err, ErrResync)
		f.scheduleRetry()
		klog.ErrorS(rec.Err, "Backend could not apply a round; it will be synced again",
			"services", rec.Services, "reset", rec.Reset, "retry", rec.Retry, "resync", f.reset, "retryIn", f.nextRetry())
	}
	if f.opts.Observe != nil {
		f.opts.Observe(rec)
	}
	return rec.Err
}

// keepTriggers keeps the trigger times of a change delivered until a round
// is applied. f.mu is held.
func (f *Feeder) keepTriggers(key model.ServiceKey, times []time.Time) {
	if room := maxUnsyncedTriggers - f.nUnsynced; len(times) > room {
		klog.V(2).InfoS("Too many changes waiting for the backend: their network programming latency is not measured", "service", key, "dropped", len(times)-max(room, 0))
		times = times[:max(room, 0)]
	}
	if len(times) == 0 {
		return
	}
	if f.unsynced == nil {
		f.unsynced = map[model.ServiceKey][]time.Time{}
	}
	f.unsynced[key] = append(f.unsynced[key], times...)
	f.nUnsynced += len(times)
}

// newProblems returns the problems of now that were not reported after
// the previous round, logging each of them (and, at verbosity 2, those
// resolved), and remembers now. f.mu is held.
func (f *Feeder) newProblems(now []model.Problem) []model.Problem {
	var fresh []model.Problem
	seen := make(map[model.Problem]struct{}, len(now))
	for _, p := range now {
		seen[p] = struct{}{}
		if _, old := f.problems[p]; old {
			continue
		}
		fresh = append(fresh, p)
		klog.ErrorS(nil, "Part of a service cannot be programmed", "service", klog.KRef(p.Service.Namespace, p.Service.Name),
			"field", p.Field, "reason", p.Reason, "problem", p.Message)
	}
	for p := range f.problems {
		if _, ok := seen[p]; !ok {
			klog.V(2).InfoS("Problem resolved", "service", klog.KRef(p.Service.Namespace, p.Service.Name), "field", p.Field, "reason", p.Reason)
		}
	}
	f.problems = seen
	return fresh
}

// nextRetry returns the delay of the scheduled retry (0 when none).
func (f *Feeder) nextRetry() time.Duration {
	if f.timer == nil {
		return 0
	}
	return f.retryIn
}

// scheduleRetry arms the retry timer, backing off. f.mu is held.
func (f *Feeder) scheduleRetry() {
	if f.opts.NoRetry || f.closed {
		return
	}
	if f.timer != nil {
		f.timer.Stop()
	}
	delay := f.backoff
	f.retryIn = delay
	f.backoff = min(2*f.backoff, f.opts.MaxRetry)
	var t *time.Timer
	t = time.AfterFunc(delay, func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.closed || f.timer != t {
			return
		}
		f.timer = nil
		_ = f.deliver(true)
	})
	f.timer = t
}

// normalize returns se with its endpoints sorted by address and unique (se
// itself when they already are).
func normalize(se *model.ServiceEndpoints) *model.ServiceEndpoints {
	if se == nil {
		return nil
	}
	ordered := true
	for i := 1; i < len(se.Endpoints); i++ {
		if model.CompareEndpoints(se.Endpoints[i-1], se.Endpoints[i]) >= 0 {
			ordered = false
			break
		}
	}
	if ordered {
		return se
	}
	eps := slices.Clone(se.Endpoints)
	slices.SortStableFunc(eps, model.CompareEndpoints)
	eps = slices.CompactFunc(eps, func(a, b *model.Endpoint) bool { return model.CompareEndpoints(a, b) == 0 })
	return &model.ServiceEndpoints{Service: se.Service, Endpoints: eps}
}

// share returns cur with what did not change since prev taken from prev:
// prev itself when nothing changed, else cur with prev's Service and
// endpoints where they are equal (a new value when any is taken; cur is
// never modified).
func share(prev, cur *model.ServiceEndpoints) *model.ServiceEndpoints {
	if prev == nil || cur == nil || prev == cur {
		return cur
	}
	svc := cur.Service
	if svc != prev.Service && reflect.DeepEqual(svc, prev.Service) {
		svc = prev.Service
	}
	var eps []*model.Endpoint // a copy of cur.Endpoints, once one is taken from prev
	same := len(prev.Endpoints) == len(cur.Endpoints)
	i := 0
	for j, ep := range cur.Endpoints {
		c := -1
		for i < len(prev.Endpoints) {
			if c = model.CompareEndpoints(prev.Endpoints[i], ep); c >= 0 {
				break
			}
			i++
		}
		match := c == 0
		switch {
		case match && prev.Endpoints[i] == ep:
		case match && reflect.DeepEqual(prev.Endpoints[i], ep):
			if eps == nil {
				eps = slices.Clone(cur.Endpoints)
			}
			eps[j] = prev.Endpoints[i]
		default:
			same = false
		}
	}
	if same && svc == prev.Service {
		return prev
	}
	if svc == cur.Service && eps == nil {
		return cur
	}
	if eps == nil {
		eps = cur.Endpoints
	}
	return &model.ServiceEndpoints{Service: svc, Endpoints: eps}
}
