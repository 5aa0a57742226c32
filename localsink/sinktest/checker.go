// Package sinktest checks that a source of localsink.Sink calls keeps the
// Sink contract (see package localsink), for the tests of kpng's own
// sources and of anyone else's: put a Checker where the backend would be,
// run the source, then look at Err and State.
package sinktest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

// Checker is a localsink.Sink that checks every call it receives against
// the contract and records the state a sink would hold. It is a
// localsink.ClusterSink, and checks the rules of SetCluster too. It
// forwards the calls to Next, when set (SetCluster when Next is a
// ClusterSink), and can make Syncs fail (FailSyncs) to check a
// source's retries. It is safe to read (Err, State, Rounds) from another
// goroutine than the one calling it. It passes on Next's problems
// (localsink.ProblemReporter) and trigger times to Next
// (localsink.TriggerSink), checking when they come.
type Checker struct {
	// Next, if set, receives every call after it is checked; its Sync
	// error is returned.
	Next localsink.Sink

	busy atomic.Bool

	mu sync.Mutex
	// held is the state the sink was given as of the last Sync, frozen
	// the JSON of each value when it was delivered (to find values
	// modified after delivery).
	held   map[model.ServiceKey]*model.ServiceEndpoints
	frozen map[model.ServiceKey][]byte
	// cluster are the cluster-level facts as of the last Sync, frozen
	// their JSON; roundCluster those given in the round in progress (when
	// clusterSet).
	cluster       *model.Cluster
	frozenCluster []byte
	roundCluster  *model.Cluster
	clusterSet    bool
	// round is the round in progress: its Updates (key → cur), whether it
	// started with Reset, the last key updated.
	round      map[model.ServiceKey]*model.ServiceEndpoints
	inRound    bool
	reset      bool
	lastKey    *model.ServiceKey
	needsRes   bool // a Sync failed with ErrResync: the next round must Reset
	failedLast bool // the last Sync failed: a Sync alone may come
	started    bool // the first Reset came
	rounds     int
	failed     int
	fail       []error
	syncs      chan struct{}
	calls      []string

	errMu sync.Mutex
	errs  []error
}

var (
	_ localsink.ClusterSink     = (*Checker)(nil)
	_ localsink.ProblemReporter = (*Checker)(nil)
	_ localsink.TriggerSink     = (*Checker)(nil)
)

// NewChecker returns a Checker forwarding to next (nil: none).
func NewChecker(next localsink.Sink) *Checker {
	return &Checker{
		Next:   next,
		held:   map[model.ServiceKey]*model.ServiceEndpoints{},
		frozen: map[model.ServiceKey][]byte{},
		syncs:  make(chan struct{}, 1),
	}
}

// FailSyncs makes the next len(errs) Syncs return errs, in order (nil
// entries succeed), without calling Next's Sync.
func (c *Checker) FailSyncs(errs ...error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fail = append(c.fail, errs...)
}

func (c *Checker) enter(call string) func() {
	if !c.busy.CompareAndSwap(false, true) {
		c.violation("%s called while another call is in progress", call)
	}
	c.mu.Lock()
	return func() {
		c.mu.Unlock()
		c.busy.Store(false)
	}
}

// violation records a broken rule (c.mu may or may not be held).
func (c *Checker) violation(format string, args ...any) {
	c.errMu.Lock()
	defer c.errMu.Unlock()
	c.errs = append(c.errs, fmt.Errorf(format, args...))
}

// Reset implements localsink.Sink.
func (c *Checker) Reset() {
	defer c.enter("Reset")()
	if c.inRound {
		c.violation("Reset in the middle of a round (after %d Updates)", len(c.round))
	}
	c.calls = append(c.calls, "Reset")
	c.started, c.inRound, c.reset, c.lastKey = true, true, true, nil
	c.round = map[model.ServiceKey]*model.ServiceEndpoints{}
	if c.Next != nil {
		c.Next.Reset()
	}
}

// Update implements localsink.Sink.
func (c *Checker) Update(key model.ServiceKey, prev, cur *model.ServiceEndpoints) {
	defer c.enter("Update")()
	if !c.started {
		c.violation("Update of %s before the first Reset", key)
	}
	if c.needsRes && !c.reset {
		c.violation("Update of %s: a Sync asked for ErrResync, but the round did not start with Reset", key)
	}
	if !c.inRound {
		c.inRound = true
		c.round = map[model.ServiceKey]*model.ServiceEndpoints{}
	}
	if c.lastKey != nil && c.lastKey.Compare(key) >= 0 {
		c.violation("Update of %s after %s in the same round: want each service once, in key order", key, *c.lastKey)
	}
	k := key
	c.lastKey = &k
	want := c.held[key]
	if c.reset {
		want = nil
	}
	switch {
	case prev != want:
		c.violation("Update of %s: prev is %s, want what the sink holds, %s", key, describe(prev), describe(want))
	case prev == nil && cur == nil:
		c.violation("Update of %s with both prev and cur nil", key)
	case prev == cur:
		c.violation("Update of %s with prev == cur: an unchanged service must not be delivered", key)
	}
	for _, v := range []*model.ServiceEndpoints{prev, cur} {
		if v != nil && (v.Service == nil || v.Service.Key() != key) {
			c.violation("Update of %s carries %s", key, describe(v))
		}
	}
	if cur != nil {
		c.checkValue(key, prev, cur)
	}
	c.round[key] = cur
	c.calls = append(c.calls, DescribeUpdate(key, prev, cur))
	if c.Next != nil {
		c.Next.Update(key, prev, cur)
	}
}

// SetCluster implements localsink.ClusterSink.
func (c *Checker) SetCluster(cl *model.Cluster) {
	defer c.enter("SetCluster")()
	if !c.started {
		c.violation("SetCluster before the first Reset")
	}
	if c.lastKey != nil {
		c.violation("SetCluster after the Update of %s: want it before the round's Updates", *c.lastKey)
	}
	if c.clusterSet {
		c.violation("SetCluster twice in a round")
	}
	switch {
	case c.reset && cl.IsZero():
		c.violation("SetCluster(%s) after Reset: Reset already forgot the facts", describeCluster(cl))
	case !c.reset && cl.Equal(c.cluster):
		c.violation("SetCluster(%s): the sink holds these facts already", describeCluster(cl))
	}
	if !c.inRound {
		c.inRound = true
		c.round = map[model.ServiceKey]*model.ServiceEndpoints{}
	}
	c.roundCluster, c.clusterSet = cl, true
	c.calls = append(c.calls, "SetCluster "+describeCluster(cl))
	if cs, ok := c.Next.(localsink.ClusterSink); ok {
		cs.SetCluster(cl)
	}
}

// describeCluster returns a short text of cluster-level facts:
// "service CIDRs 10.96.0.0/16,fd00::/108", or "none".
func describeCluster(cl *model.Cluster) string {
	if cl.IsZero() {
		return "none"
	}
	var cidrs []string
	for _, p := range cl.ServiceCIDRs {
		cidrs = append(cidrs, p.String())
	}
	return "service CIDRs " + strings.Join(cidrs, ",")
}

// Cluster returns the cluster-level facts the sink was given as of the
// last Sync (nil: none).
func (c *Checker) Cluster() *model.Cluster {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cluster
}

// checkValue checks the endpoints order and the sharing of unchanged
// parts.
func (c *Checker) checkValue(key model.ServiceKey, prev, cur *model.ServiceEndpoints) {
	for i := 1; i < len(cur.Endpoints); i++ {
		if model.CompareEndpoints(cur.Endpoints[i-1], cur.Endpoints[i]) >= 0 {
			c.violation("Update of %s: endpoints %s and %s are not sorted and unique", key, cur.Endpoints[i-1].Key(), cur.Endpoints[i].Key())
		}
	}
	if prev == nil {
		return
	}
	if prev.Service != cur.Service && reflect.DeepEqual(prev.Service, cur.Service) {
		c.violation("Update of %s: the service did not change but is a new pointer", key)
	}
	old := map[string]*model.Endpoint{}
	for _, ep := range prev.Endpoints {
		old[ep.Key()] = ep
	}
	for _, ep := range cur.Endpoints {
		if o := old[ep.Key()]; o != nil && o != ep && reflect.DeepEqual(o, ep) {
			c.violation("Update of %s: endpoint %s did not change but is a new pointer", key, ep.Key())
		}
	}
}

// Sync implements localsink.Sink.
func (c *Checker) Sync() error {
	defer c.enter("Sync")()
	if !c.started {
		c.violation("Sync before the first Reset")
	}
	if !c.inRound && c.rounds > 0 && !c.failedLast {
		c.violation("Sync of a round that changes nothing (no Reset, no Update), after a successful Sync")
	}
	if c.needsRes && !c.reset {
		c.violation("Sync: a Sync asked for ErrResync, but the round did not start with Reset")
	}
	var err error
	if len(c.fail) > 0 {
		err, c.fail = c.fail[0], c.fail[1:]
	} else if c.Next != nil {
		err = c.Next.Sync()
	}
	c.checkFrozen()
	if err != nil {
		c.calls = append(c.calls, "Sync failed")
	} else {
		c.calls = append(c.calls, "Sync")
	}
	if c.reset {
		clear(c.held)
		clear(c.frozen)
		c.cluster, c.frozenCluster = nil, nil
	}
	if c.clusterSet {
		c.cluster, c.frozenCluster = c.roundCluster, freezeCluster(c.roundCluster)
	}
	for key, se := range c.round {
		if se == nil {
			delete(c.held, key)
			delete(c.frozen, key)
			continue
		}
		c.held[key] = se
		c.frozen[key] = freeze(se)
	}
	c.needsRes = err != nil && errors.Is(err, localsink.ErrResync)
	c.failedLast = err != nil
	if err != nil {
		c.failed++
	}
	c.rounds++
	c.inRound, c.reset, c.lastKey, c.round = false, false, nil, nil
	c.roundCluster, c.clusterSet = nil, false
	select {
	case c.syncs <- struct{}{}:
	default:
	}
	return err
}

// Problems implements localsink.ProblemReporter: Next's problems, when it
// reports some.
func (c *Checker) Problems() []model.Problem {
	defer c.enter("Problems")()
	if pr, ok := c.Next.(localsink.ProblemReporter); ok {
		return pr.Problems()
	}
	return nil
}

// Triggered implements localsink.TriggerSink: it checks that the times come
// in a round, right after the Update of their service, with at least one
// time, and passes them to Next when it takes them.
func (c *Checker) Triggered(key model.ServiceKey, times []time.Time) {
	defer c.enter("Triggered")()
	switch {
	case !c.inRound || c.lastKey == nil || *c.lastKey != key:
		c.violation("Triggered for %s not right after its Update", key)
	case len(times) == 0:
		c.violation("Triggered for %s without a time", key)
	}
	if ts, ok := c.Next.(localsink.TriggerSink); ok {
		ts.Triggered(key, times)
	}
}

// checkFrozen checks that the values held were not modified since they
// were delivered.
func (c *Checker) checkFrozen() {
	for key, se := range c.held {
		if !bytes.Equal(freeze(se), c.frozen[key]) {
			c.violation("the value of %s was modified after it was delivered", key)
			c.frozen[key] = freeze(se)
		}
	}
	if f := freezeCluster(c.cluster); !bytes.Equal(f, c.frozenCluster) {
		c.violation("the cluster-level facts were modified after they were delivered")
		c.frozenCluster = f
	}
}

func freezeCluster(cl *model.Cluster) []byte {
	if cl == nil {
		return nil
	}
	b, err := json.Marshal(cl)
	if err != nil {
		return []byte(err.Error())
	}
	return b
}

func freeze(se *model.ServiceEndpoints) []byte {
	b, err := json.Marshal(se)
	if err != nil {
		return []byte(err.Error())
	}
	return b
}

func describe(se *model.ServiceEndpoints) string {
	if se == nil {
		return "nil"
	}
	if se.Service == nil {
		return fmt.Sprintf("%p (no service)", se)
	}
	return fmt.Sprintf("%p (%s, %d endpoints)", se, se.Service.Key(), len(se.Endpoints))
}

// Err returns the broken rules found so far (nil: none), and checks that
// the values held were not modified since delivery.
func (c *Checker) Err() error {
	c.mu.Lock()
	c.checkFrozen()
	c.mu.Unlock()
	c.errMu.Lock()
	defer c.errMu.Unlock()
	return errors.Join(c.errs...)
}

// State returns the state the sink was given as of the last Sync, in key
// order.
func (c *Checker) State() []*model.ServiceEndpoints {
	c.mu.Lock()
	defer c.mu.Unlock()
	keys := make([]model.ServiceKey, 0, len(c.held))
	for k := range c.held {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, model.ServiceKey.Compare)
	out := make([]*model.ServiceEndpoints, len(keys))
	for i, k := range keys {
		out[i] = c.held[k]
	}
	return out
}

// Rounds returns the number of Syncs received, and how many of them
// failed.
func (c *Checker) Rounds() (syncs, failed int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rounds, c.failed
}

// TakeCalls returns the calls received since the previous TakeCalls, as
// "Reset", "SetCluster" and the facts ("SetCluster service CIDRs
// 10.96.0.0/16", "SetCluster none"), DescribeUpdate's text, "Sync" or
// "Sync failed".
func (c *Checker) TakeCalls() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	calls := c.calls
	c.calls = nil
	return calls
}

// WaitSyncs waits until the checker has received n Syncs in all, failing
// the test (t.Fatal) after timeout: call it from the test's goroutine
// only; other goroutines call AwaitSyncs.
func (c *Checker) WaitSyncs(t testing.TB, n int, timeout time.Duration) {
	t.Helper()
	if err := c.AwaitSyncs(n, timeout); err != nil {
		t.Fatal(err)
	}
}

// AwaitSyncs waits until the checker has received n Syncs in all, and
// returns an error after timeout. It is safe to call from any goroutine.
func (c *Checker) AwaitSyncs(n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		syncs, _ := c.Rounds()
		if syncs >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v waiting for %d Syncs, got %d; calls since the last take: %q", timeout, n, syncs, c.TakeCalls())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// DescribeUpdate returns a short text of an Update: "Update ns/name", then
// " deleted" for a deletion, else " service" when the Service is new or
// changed, " -addr" for each endpoint removed and " +addr" for each one
// added or changed (localsink.EndpointChanges).
func DescribeUpdate(key model.ServiceKey, prev, cur *model.ServiceEndpoints) string {
	var b strings.Builder
	b.WriteString("Update " + key.String())
	if cur == nil {
		b.WriteString(" deleted")
		return b.String()
	}
	if prev == nil || prev.Service != cur.Service {
		b.WriteString(" service")
	}
	removed, set := localsink.EndpointChanges(prev, cur)
	for _, ep := range removed {
		b.WriteString(" -" + ep.Key())
	}
	for _, ep := range set {
		b.WriteString(" +" + ep.Key())
	}
	return b.String()
}

// Synced returns a channel that receives after a Sync (at most one
// pending notification).
func (c *Checker) Synced() <-chan struct{} { return c.syncs }
