package remote

import (
	"context"
	"errors"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/resolver"
)

// fakeConn is the ClientConn side of a resolver: it records the addresses
// and errors it is given.
type fakeConn struct {
	resolver.ClientConn // not called: the methods below are
	mu                  sync.Mutex
	states              [][]string
	errs                []error
	updates             chan []string
}

func newFakeConn() *fakeConn { return &fakeConn{updates: make(chan []string, 100)} }

func (c *fakeConn) UpdateState(s resolver.State) error {
	var addrs []string
	for _, a := range s.Addresses {
		addrs = append(addrs, a.Addr)
	}
	c.mu.Lock()
	c.states = append(c.states, addrs)
	c.mu.Unlock()
	c.updates <- addrs
	return nil
}

func (c *fakeConn) ReportError(err error) {
	c.mu.Lock()
	c.errs = append(c.errs, err)
	c.mu.Unlock()
}

func (c *fakeConn) got() ([][]string, []error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([][]string(nil), c.states...), append([]error(nil), c.errs...)
}

// next waits for the next addresses given.
func (c *fakeConn) next(t *testing.T) []string {
	t.Helper()
	select {
	case a := <-c.updates:
		return a
	case <-time.After(30 * time.Second):
		t.Fatal("no addresses given within 30 s")
		return nil
	}
}

// answer is one lookup's answer.
type answer struct {
	ips []string
	err error
}

// script is a lookup answering its answers in turn, the last one again
// and again, each call recorded (its time, and on calls).
type script struct {
	mu      sync.Mutex
	answers []answer
	times   []time.Time
	calls   chan int
}

func newScript(answers ...answer) *script {
	return &script{answers: answers, calls: make(chan int, 1000)}
}

func (s *script) lookup(_ context.Context, host string) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if host != "kpng-controller" {
		return nil, errors.New("unexpected host " + host)
	}
	s.times = append(s.times, time.Now())
	a := s.answers[0]
	if len(s.answers) > 1 {
		s.answers = s.answers[1:]
	}
	select {
	case s.calls <- len(s.times):
	default:
	}
	return a.ips, a.err
}

// wait waits for the n-th lookup to start.
func (s *script) wait(t *testing.T, n int) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case got := <-s.calls:
			if got >= n {
				return
			}
		case <-deadline:
			t.Fatalf("lookup %d not made within 30 s", n)
		}
	}
}

func build(t *testing.T, cfg resolveConfig, cc resolver.ClientConn) resolver.Resolver {
	t.Helper()
	r, err := (&resolverBuilder{cfg: cfg}).Build(resolver.Target{URL: *mustURL(t, ResolveScheme+":///kpng-controller:7443")}, cc, resolver.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

// TestResolverResolveNow: with a period of an hour, ResolveNow makes the
// resolver look the name up again, and give the new addresses (without
// it, the second lookup never comes and the test fails after 30 s).
func TestResolverResolveNow(t *testing.T) {
	s := newScript(answer{ips: []string{"10.0.0.1"}}, answer{ips: []string{"10.0.0.2", "10.0.0.1"}})
	cc := newFakeConn()
	r := build(t, resolveConfig{lookup: s.lookup, period: time.Hour, gap: time.Millisecond}, cc)
	if diff := cmp.Diff([]string{"10.0.0.1:7443"}, cc.next(t)); diff != "" {
		t.Errorf("first addresses (-want +got):\n%s", diff)
	}
	r.ResolveNow(resolver.ResolveNowOptions{})
	if diff := cmp.Diff([]string{"10.0.0.1:7443", "10.0.0.2:7443"}, cc.next(t)); diff != "" {
		t.Errorf("addresses after ResolveNow (-want +got):\n%s", diff)
	}
}

// TestResolverResolveNowGap asks for a resolution again and again: the
// lookups must be at least the gap apart (a timer never fires early, so
// this bound cannot flake; without the gap, lookups follow each other
// within microseconds and the test fails).
func TestResolverResolveNowGap(t *testing.T) {
	const gap = 100 * time.Millisecond
	s := newScript(answer{ips: []string{"10.0.0.1"}})
	cc := newFakeConn()
	r := build(t, resolveConfig{lookup: s.lookup, period: time.Hour, gap: gap}, cc)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			r.ResolveNow(resolver.ResolveNowOptions{})
			time.Sleep(time.Millisecond)
		}
	}()
	s.wait(t, 4)
	cancel()
	<-done
	s.mu.Lock()
	times := s.times
	s.mu.Unlock()
	for i := 1; i < len(times); i++ {
		if d := times[i].Sub(times[i-1]); d < gap {
			t.Errorf("lookup %d came %v after the one before, want at least %v", i+1, d, gap)
		}
	}
	if states, _ := cc.got(); len(states) != 1 {
		t.Errorf("the same addresses given %d times, want once: %q", len(states), states)
	}
}

// TestResolverPeriodic: without any ResolveNow, the resolver looks the
// name up every period and gives the ClientConn the addresses only when
// they change, whatever their order (without the period, the test waits
// for the second lookup and fails after 30 s).
func TestResolverPeriodic(t *testing.T) {
	s := newScript(
		answer{ips: []string{"10.0.0.1"}},
		answer{ips: []string{"10.0.0.1"}},
		answer{ips: []string{"fd00::2", "10.0.0.1", "10.0.0.1"}},
		answer{ips: []string{"10.0.0.1", "fd00::2"}},
		answer{ips: []string{"fd00::2"}},
	)
	cc := newFakeConn()
	build(t, resolveConfig{lookup: s.lookup, period: time.Millisecond}, cc)
	s.wait(t, 7)
	states, errs := cc.got()
	want := [][]string{{"10.0.0.1:7443"}, {"10.0.0.1:7443", "[fd00::2]:7443"}, {"[fd00::2]:7443"}}
	if diff := cmp.Diff(want, states); diff != "" {
		t.Errorf("addresses given (-want +got):\n%s", diff)
	}
	if len(errs) != 0 {
		t.Errorf("errors reported: %v", errs)
	}
}

// TestResolverErrorKeepsAddresses: a lookup that fails, or finds nothing,
// is reported to the ClientConn with ReportError, and never given as
// addresses: the ClientConn keeps the ones it has (an empty state would
// close the connection the backend streams on). A first lookup that fails
// is reported too, and the name resolved again the next period.
func TestResolverErrorKeepsAddresses(t *testing.T) {
	s := newScript(
		answer{err: errors.New("server misbehaving")},
		answer{ips: []string{"10.0.0.1", "10.0.0.2"}},
		answer{err: errors.New("i/o timeout")},
		answer{ips: nil},
		answer{ips: []string{"10.0.0.2", "10.0.0.1"}},
	)
	cc := newFakeConn()
	build(t, resolveConfig{lookup: s.lookup, period: time.Millisecond}, cc)
	s.wait(t, 7)
	states, errs := cc.got()
	if diff := cmp.Diff([][]string{{"10.0.0.1:7443", "10.0.0.2:7443"}}, states); diff != "" {
		t.Errorf("addresses given (-want +got):\n%s", diff)
	}
	var msgs []string
	for _, err := range errs {
		msgs = append(msgs, err.Error())
	}
	want := []string{
		"resolve controller name kpng-controller: server misbehaving",
		"resolve controller name kpng-controller: i/o timeout",
		"resolve controller name kpng-controller: no addresses",
	}
	if diff := cmp.Diff(want, msgs); diff != "" {
		t.Errorf("errors reported (-want +got):\n%s", diff)
	}
}

// TestResolverCloseStops: Close ends a lookup under way (its context) and
// returns once the resolver's goroutine is gone; no lookup after it.
// Without the context, Close waits for the lookup forever and the test
// times out; without the wait, the goroutine is still there.
func TestResolverCloseStops(t *testing.T) {
	started := make(chan struct{})
	var mu sync.Mutex
	calls := 0
	lookup := func(ctx context.Context, _ string) ([]string, error) {
		mu.Lock()
		calls++
		n := calls
		mu.Unlock()
		if n == 1 {
			return []string{"10.0.0.1"}, nil
		}
		if n == 2 {
			close(started)
		}
		<-ctx.Done()
		return nil, ctx.Err()
	}
	cc := newFakeConn()
	r, err := (&resolverBuilder{cfg: resolveConfig{lookup: lookup, period: time.Millisecond}}).Build(
		resolver.Target{URL: *mustURL(t, ResolveScheme+":///kpng-controller:7443")}, cc, resolver.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	<-started
	closed := make(chan struct{})
	go func() { r.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not return within 30 s of a lookup under way")
	}
	r.Close() // again: nothing
	if n := resolverGoroutines(); n != 0 {
		t.Errorf("%d resolver goroutines after Close", n)
	}
	r.ResolveNow(resolver.ResolveNowOptions{}) // after Close: nothing
	mu.Lock()
	defer mu.Unlock()
	if calls != 2 {
		t.Errorf("%d lookups, want 2 (none after Close)", calls)
	}
	if states, errs := cc.got(); len(states) != 1 || len(errs) != 0 {
		t.Errorf("after Close: addresses %q, errors %v; want the first addresses only", states, errs)
	}
}

// resolverGoroutines counts the goroutines running nameResolver.run,
// waiting (up to 30 s) for any that is returning.
func resolverGoroutines() int {
	deadline := time.Now().Add(30 * time.Second)
	for {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		n := strings.Count(string(buf), "remote.(*nameResolver).run(")
		if n == 0 || time.Now().After(deadline) {
			return n
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestResolverBuildErrors: a target without a port or a host is refused.
func TestResolverBuildErrors(t *testing.T) {
	for _, target := range []string{"kpng-controller", ":7443"} {
		_, err := (&resolverBuilder{}).Build(resolver.Target{URL: *mustURL(t, ResolveScheme+":///"+target)}, newFakeConn(), resolver.BuildOptions{})
		if err == nil || !strings.Contains(err.Error(), target) {
			t.Errorf("Build(%q): %v, want an error naming it", target, err)
		}
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
