package localsink_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/localsink/sinktest"
	"sigs.k8s.io/kpng/model"
)

// newChecked returns a Feeder over a contract Checker; the test fails at
// cleanup if the Checker found a broken rule.
func newChecked(t *testing.T, opts localsink.FeederOptions) (*localsink.Feeder, *sinktest.Checker) {
	t.Helper()
	c := sinktest.NewChecker(nil)
	f := localsink.NewFeeder(c, opts)
	t.Cleanup(func() {
		f.Close()
		if err := c.Err(); err != nil {
			t.Errorf("Sink contract broken:\n%v", err)
		}
	})
	return f, c
}

// TestFeederRounds checks the calls of successive full states: Reset and
// everything first, then only the services that changed, in key order;
// nothing for an unchanged state.
func TestFeederRounds(t *testing.T) {
	a1 := svcEps(testService("ns", "a"), endpoints("10.0.0.1", "10.0.0.2")...)
	b1 := svcEps(testService("ns", "b"), endpoints("fd00::1")...)
	c1 := svcEps(testService("ns", "c"))
	// a2 is a1 with 10.0.0.2 not ready and 10.0.0.3 added.
	a2 := deepCopy([]*model.ServiceEndpoints{a1})[0]
	a2.Endpoints[1].Ready = false
	a2.Endpoints = append(a2.Endpoints, testEndpoint("10.0.0.3"))
	// b2 is b1 with a new service type, same endpoints.
	b2 := deepCopy([]*model.ServiceEndpoints{b1})[0]
	b2.Service.Type = "NodePort"
	// unsorted lists a's endpoints backwards, with a duplicate.
	unsorted := svcEps(a1.Service, a1.Endpoints[1], a1.Endpoints[0], a1.Endpoints[1])
	same := func(items ...*model.ServiceEndpoints) []*model.ServiceEndpoints { return deepCopy(items) }

	tests := []struct {
		name   string
		rounds [][]*model.ServiceEndpoints
		want   [][]string // calls of each round
	}{
		{
			name:   "first round: Reset, everything in key order, Sync",
			rounds: [][]*model.ServiceEndpoints{{c1, b1, a1}},
			want: [][]string{{
				"Reset",
				"Update ns/a service +10.0.0.1 +10.0.0.2",
				"Update ns/b service +fd00::1",
				"Update ns/c service",
				"Sync",
			}},
		},
		{
			name:   "first round with an empty state",
			rounds: [][]*model.ServiceEndpoints{nil},
			want:   [][]string{{"Reset", "Sync"}},
		},
		{
			name:   "an equal state (new pointers): nothing",
			rounds: [][]*model.ServiceEndpoints{{a1, b1}, same(a1, b1), {a1, b1}},
			want: [][]string{
				{"Reset", "Update ns/a service +10.0.0.1 +10.0.0.2", "Update ns/b service +fd00::1", "Sync"},
				nil, nil,
			},
		},
		{
			name:   "changes: only what changed",
			rounds: [][]*model.ServiceEndpoints{{a1, b1, c1}, {b2, a2}},
			want: [][]string{
				{"Reset", "Update ns/a service +10.0.0.1 +10.0.0.2", "Update ns/b service +fd00::1", "Update ns/c service", "Sync"},
				{"Update ns/a +10.0.0.2 +10.0.0.3", "Update ns/b service", "Update ns/c deleted", "Sync"},
			},
		},
		{
			name:   "everything removed",
			rounds: [][]*model.ServiceEndpoints{{a1}, nil},
			want: [][]string{
				{"Reset", "Update ns/a service +10.0.0.1 +10.0.0.2", "Sync"},
				{"Update ns/a deleted", "Sync"},
			},
		},
		{
			name:   "endpoints sorted and unique before delivery",
			rounds: [][]*model.ServiceEndpoints{{unsorted}, {a1}},
			want: [][]string{
				{"Reset", "Update ns/a service +10.0.0.1 +10.0.0.2", "Sync"},
				nil,
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, c := newChecked(t, localsink.FeederOptions{NoRetry: true})
			var got [][]string
			for i, items := range tc.rounds {
				f.SetAll(items)
				if err := f.Sync(); err != nil {
					t.Fatalf("round %d: %v", i, err)
				}
				got = append(got, c.TakeCalls())
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("calls per round (-want +got):\n%s", diff)
			}
		})
	}
}

// TestFeederSharesUnchanged checks that what did not change reaches the
// sink as the pointers it already holds, and that the source's values are
// not modified.
func TestFeederSharesUnchanged(t *testing.T) {
	var got []*model.ServiceEndpoints // cur of each Update
	rec := &updateSink{update: func(_ model.ServiceKey, _, cur *model.ServiceEndpoints) { got = append(got, cur) }}
	c := sinktest.NewChecker(rec)
	f := localsink.NewFeeder(c, localsink.FeederOptions{NoRetry: true})
	defer f.Close()
	a1 := svcEps(testService("ns", "a"), endpoints("10.0.0.1", "10.0.0.2")...)
	f.Update(key("ns", "a"), a1)
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	// An equal copy with one endpoint changed.
	a2 := deepCopy([]*model.ServiceEndpoints{a1})[0]
	a2.Endpoints[1].Ready = false
	a2Copy := deepCopy([]*model.ServiceEndpoints{a2})[0]
	f.Update(key("ns", "a"), a2)
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := c.Err(); err != nil {
		t.Errorf("Sink contract broken:\n%v", err)
	}
	if len(got) != 2 {
		t.Fatalf("%d Updates, want 2", len(got))
	}
	if got[1].Service != a1.Service {
		t.Errorf("the service did not change: want the pointer already delivered")
	}
	if got[1].Endpoints[0] != a1.Endpoints[0] {
		t.Errorf("endpoint 10.0.0.1 did not change: want the pointer already delivered")
	}
	if got[1].Endpoints[1] != a2.Endpoints[1] {
		t.Errorf("endpoint 10.0.0.2 changed: want the new value")
	}
	if diff := cmp.Diff(a2Copy, a2); diff != "" {
		t.Errorf("the source's value was modified (-before +after):\n%s", diff)
	}
}

// updateSink is a Sink calling update on each Update.
type updateSink struct {
	update func(key model.ServiceKey, prev, cur *model.ServiceEndpoints)
}

func (u *updateSink) Reset() {}
func (u *updateSink) Update(key model.ServiceKey, prev, cur *model.ServiceEndpoints) {
	u.update(key, prev, cur)
}
func (u *updateSink) Sync() error { return nil }

// TestFeederRetry checks what follows a failed Sync: a retry after a
// backoff (Sync alone: the sink kept the Updates), or, when the source
// has a newer change first, that change with the Sync; and that retries
// stop after a success.
func TestFeederRetry(t *testing.T) {
	var mu sync.Mutex
	var rounds []localsink.Round
	f, c := newChecked(t, localsink.FeederOptions{MinRetry: 20 * time.Millisecond, MaxRetry: 80 * time.Millisecond,
		Observe: func(r localsink.Round) { mu.Lock(); rounds = append(rounds, r); mu.Unlock() }})
	boom := errors.New("boom")
	a := svcEps(testService("ns", "a"), endpoints("10.0.0.1")...)
	b := svcEps(testService("ns", "b"), endpoints("10.0.0.2")...)

	// Three failures, then a success: four rounds, the last three retries.
	c.FailSyncs(boom, boom, boom)
	f.Update(key("ns", "a"), a)
	if err := f.Sync(); !errors.Is(err, boom) {
		t.Fatalf("Sync: %v, want the sink's error", err)
	}
	c.WaitSyncs(t, 4, 5*time.Second)
	if diff := cmp.Diff([]string{"Reset", "Update ns/a service +10.0.0.1", "Sync failed", "Sync failed", "Sync failed", "Sync"}, c.TakeCalls()); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
	mu.Lock()
	if len(rounds) != 4 || rounds[0].Retry || !rounds[1].Retry || !rounds[3].Retry || rounds[3].Err != nil || rounds[0].Services != 1 || rounds[1].Services != 0 {
		t.Errorf("round records: %+v", rounds)
	}
	for i := 1; i < len(rounds); i++ {
		if gap := rounds[i].Start.Sub(rounds[i-1].Start); gap < 20*time.Millisecond {
			t.Errorf("retry %d came %v after the previous round, want at least the minimum backoff", i, gap)
		}
	}
	mu.Unlock()
	if f.Failed() {
		t.Errorf("Failed() after a successful retry")
	}

	// A failure, then a newer change before the retry: the change and the
	// Sync in one round; then no more retries.
	c.FailSyncs(boom)
	f.Update(key("ns", "a"), nil)
	_ = f.Sync()
	f.Update(key("ns", "b"), b)
	if err := f.Sync(); err != nil {
		t.Fatalf("Sync after the failure: %v", err)
	}
	waitRetryDue(t, 80*time.Millisecond) // the longest backoff
	if diff := cmp.Diff([]string{"Update ns/a deleted", "Sync failed", "Update ns/b service +10.0.0.2", "Sync"}, c.TakeCalls()); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]*model.ServiceEndpoints{b}, c.State()); diff != "" {
		t.Errorf("state (-want +got):\n%s", diff)
	}
}

// TestFeederRetryWaitsForTheSourcesRound checks that a retry firing while
// the source is in the middle of a round delivers none of it: the
// source's Updates go with its own Sync.
func TestFeederRetryWaitsForTheSourcesRound(t *testing.T) {
	f, c := newChecked(t, localsink.FeederOptions{MinRetry: 20 * time.Millisecond})
	c.FailSyncs(errors.New("boom"))
	f.Update(key("ns", "a"), svcEps(testService("ns", "a")))
	_ = f.Sync()
	f.Update(key("ns", "b"), svcEps(testService("ns", "b"))) // a round begins
	c.WaitSyncs(t, 2, 5*time.Second)                         // the retry
	time.Sleep(50 * time.Millisecond)
	if diff := cmp.Diff([]string{"Reset", "Update ns/a service", "Sync failed", "Sync"}, c.TakeCalls()); diff != "" {
		t.Errorf("calls up to the retry (-want +got):\n%s", diff)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"Update ns/b service", "Sync"}, c.TakeCalls()); diff != "" {
		t.Errorf("the source's round (-want +got):\n%s", diff)
	}
}

// TestFeederSetAllAfterUpdate checks that a full state drops a service
// given by Update earlier in the same round.
func TestFeederSetAllAfterUpdate(t *testing.T) {
	f, c := newChecked(t, localsink.FeederOptions{NoRetry: true})
	a, b := svcEps(testService("ns", "a")), svcEps(testService("ns", "b"))
	f.Update(key("ns", "b"), b)
	f.SetAll([]*model.ServiceEndpoints{a})
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]*model.ServiceEndpoints{a}, c.State()); diff != "" {
		t.Errorf("state (-want +got):\n%s", diff)
	}
}

// TestFeederResync checks that a Sync failing with ErrResync gets Reset
// and the whole state, newer changes included.
func TestFeederResync(t *testing.T) {
	f, c := newChecked(t, localsink.FeederOptions{NoRetry: true})
	a := svcEps(testService("ns", "a"), endpoints("10.0.0.1")...)
	b := svcEps(testService("ns", "b"), endpoints("10.0.0.2")...)
	f.SetAll([]*model.ServiceEndpoints{a, b})
	_ = f.Sync()
	c.TakeCalls()
	c.FailSyncs(fmt.Errorf("lost the table: %w", localsink.ErrResync))
	f.Update(key("ns", "a"), nil)
	if err := f.Sync(); !errors.Is(err, localsink.ErrResync) {
		t.Fatalf("Sync: %v, want ErrResync", err)
	}
	c2 := svcEps(testService("ns", "c"))
	f.Update(key("ns", "c"), c2)
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	want := []string{"Update ns/a deleted", "Sync failed", "Reset", "Update ns/b service +10.0.0.2", "Update ns/c service", "Sync"}
	if diff := cmp.Diff(want, c.TakeCalls()); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
}

// waitRetryDue waits until a retry due after backoff from now, had one
// been scheduled, would have reached its sink: a control Feeder with
// that backoff fails a Sync now, and its retry is waited for.
func waitRetryDue(t *testing.T, backoff time.Duration) {
	t.Helper()
	c := sinktest.NewChecker(nil)
	f := localsink.NewFeeder(c, localsink.FeederOptions{MinRetry: backoff, MaxRetry: backoff})
	defer f.Close()
	c.FailSyncs(errors.New("control"))
	f.Update(key("ns", "control"), svcEps(testService("ns", "control")))
	_ = f.Sync()
	c.WaitSyncs(t, 2, 10*time.Second)
}

// TestFeederCloseStopsRetries checks that no retry reaches the sink after
// Close.
func TestFeederCloseStopsRetries(t *testing.T) {
	c := sinktest.NewChecker(nil)
	f := localsink.NewFeeder(c, localsink.FeederOptions{MinRetry: 10 * time.Millisecond})
	c.FailSyncs(errors.New("boom"), errors.New("boom"))
	f.Update(key("ns", "a"), svcEps(testService("ns", "a")))
	_ = f.Sync()
	f.Close()
	waitRetryDue(t, 10*time.Millisecond)
	if err := c.Err(); err != nil {
		t.Errorf("Sink contract broken:\n%v", err)
	}
	if syncs, _ := c.Rounds(); syncs != 1 {
		t.Errorf("%d Syncs, want 1: a retry came after Close", syncs)
	}
}

// TestFeederRandom feeds random states, some of them as single Updates,
// with random failures, and checks the contract and that the sink ends up
// with the source's state.
func TestFeederRandom(t *testing.T) {
	for seed := uint64(1); seed <= 8; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 3))
			f, c := newChecked(t, localsink.FeederOptions{NoRetry: true})
			g := &stateGen{r: r, state: map[model.ServiceKey]*model.ServiceEndpoints{}}
			failures := 0
			for round := range 200 {
				if r.IntN(5) == 0 {
					failures++
					err := errors.New("random failure")
					if r.IntN(2) == 0 {
						err = fmt.Errorf("random: %w", localsink.ErrResync)
					}
					c.FailSyncs(err)
				}
				items := g.next()
				if r.IntN(2) == 0 {
					f.SetAll(items)
				} else {
					// Only the services that changed, one by one, and
					// the gone ones as nil.
					seen := map[model.ServiceKey]bool{}
					for _, se := range items {
						seen[se.Service.Key()] = true
						f.Update(se.Service.Key(), se)
					}
					for _, se := range c.State() {
						if !seen[se.Service.Key()] {
							f.Update(se.Service.Key(), nil)
						}
					}
				}
				_ = f.Sync()
				if !f.Failed() {
					if diff := stateDiff(deepCopy(items), c.State()); diff != "" {
						t.Fatalf("round %d: sink state (-want +got):\n%s", round, diff)
					}
				}
			}
			if failures < 20 {
				t.Fatalf("only %d failures injected", failures)
			}
		})
	}
}

// TestFeederQueued: Queued is called when the source ends a round with
// something to deliver (the first round always), before the sink is
// called, and not for a round that changes nothing.
func TestFeederQueued(t *testing.T) {
	var queued []time.Time
	var synced []time.Time
	f, _ := newChecked(t, localsink.FeederOptions{NoRetry: true,
		Queued:  func(at time.Time) { queued = append(queued, at) },
		Observe: func(r localsink.Round) { synced = append(synced, r.Start) }})
	if err := f.Sync(); err != nil { // the first, empty, state
		t.Fatal(err)
	}
	a := svcEps(testService("ns", "a"), endpoints("10.0.0.1")...)
	f.Update(key("ns", "a"), a)
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Update(key("ns", "a"), a) // the same: nothing to deliver
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if len(queued) != 2 || len(synced) != 2 {
		t.Fatalf("queued %d, delivered %d rounds; want 2 and 2", len(queued), len(synced))
	}
	for i := range queued {
		if queued[i].After(synced[i]) {
			t.Errorf("round %d queued at %v, after its delivery began (%v)", i, queued[i], synced[i])
		}
	}
}

// TestFeederCluster checks the delivery of the cluster-level facts: in the
// first round, when they change (a round of their own if nothing else
// changed), again after a Reset asked by the sink, never to a sink that
// does not want them, and not when they are equal.
func TestFeederCluster(t *testing.T) {
	cidrs := func(texts ...string) *model.Cluster {
		c := &model.Cluster{}
		for _, t := range texts {
			c.ServiceCIDRs = append(c.ServiceCIDRs, netip.MustParsePrefix(t))
		}
		return c
	}
	f, c := newChecked(t, localsink.FeederOptions{NoRetry: true})
	a := svcEps(testService("ns", "a"))
	f.SetCluster(cidrs("10.96.0.0/16"))
	f.Update(key("ns", "a"), a)
	_ = f.Sync()
	f.SetCluster(cidrs("10.96.0.0/16")) // equal: nothing
	_ = f.Sync()
	f.SetCluster(cidrs("10.96.0.0/16", "fd00::/108"))
	_ = f.Sync()
	c.FailSyncs(fmt.Errorf("lost: %w", localsink.ErrResync))
	f.SetCluster(nil)
	_ = f.Sync()
	f.SetCluster(cidrs("10.97.0.0/16"))
	_ = f.Sync()
	want := []string{
		"Reset", "SetCluster service CIDRs 10.96.0.0/16", "Update ns/a service", "Sync",
		"SetCluster service CIDRs 10.96.0.0/16,fd00::/108", "Sync",
		"SetCluster none", "Sync failed",
		"Reset", "SetCluster service CIDRs 10.97.0.0/16", "Update ns/a service", "Sync",
	}
	if diff := cmp.Diff(want, c.TakeCalls()); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
	if got := c.Cluster(); !got.Equal(cidrs("10.97.0.0/16")) {
		t.Errorf("facts held: %+v", got)
	}

	// A sink without SetCluster gets no round for the facts alone.
	var plain countSink
	pf := localsink.NewFeeder(&plain, localsink.FeederOptions{NoRetry: true})
	defer pf.Close()
	pf.Update(key("ns", "a"), a)
	_ = pf.Sync()
	pf.SetCluster(cidrs("10.96.0.0/16"))
	_ = pf.Sync()
	if plain.syncs != 1 {
		t.Errorf("a plain sink got %d Syncs, want 1 (none for the facts)", plain.syncs)
	}
}
