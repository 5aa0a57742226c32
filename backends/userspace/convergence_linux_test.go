//go:build linux

package userspace

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/internal/churn"
	"sigs.k8s.io/kpng/localsink"
)

// churnPools draw loopback addresses (a proxier on the fake platform
// listens in the test's own namespace, where all of 127.0.0.0/8 is
// local) and a few ports, so that services contend.
var churnPools = churn.Pools{
	ClusterV4:   []netip.Addr{netip.MustParseAddr("127.77.0.1"), netip.MustParseAddr("127.77.0.2"), netip.MustParseAddr("127.77.0.3")},
	External:    []netip.Addr{netip.MustParseAddr("127.77.1.1"), fakeNodeIP},
	EndpointsV4: []netip.Addr{netip.MustParseAddr("127.78.0.1"), netip.MustParseAddr("127.78.0.2"), netip.MustParseAddr("127.78.0.3")},
	EndpointsV6: []netip.Addr{netip.MustParseAddr("1100::1")},
	// Below the ephemeral range (32768–60999), where other tests'
	// connections take their local ports.
	Ports:     []int32{22001, 22002, 22003},
	NodePorts: []int32{22101, 22102},
}

// snapshot is what a proxier does, in a form that does not depend on how
// it got there: each frontend's owner and route, whether it listens, and
// the addresses it holds.
type snapshot struct {
	Frontends map[string]string
	Addresses []string
}

func takeSnapshot(p *Sink, fp *fakePlatform) snapshot {
	s := snapshot{Frontends: map[string]string{}}
	for k, f := range p.frontends {
		r := f.route.Load()
		s.Frontends[k.String()] = fmt.Sprintf("%s %+v", p.owners[k], *r)
	}
	for a := range fp.held {
		s.Addresses = append(s.Addresses, a.String())
	}
	slices.Sort(s.Addresses)
	return s
}

// TestConvergence applies seeded random churn round by round to a
// proxier and checks after every round that it is what a fresh proxier
// makes of the whole state, and that every frontend that must listen
// does (and no other). KPNG_CHURN_ROUNDS and KPNG_CHURN_SEED change the
// length and the seed (a failure prints its seed).
func TestConvergence(t *testing.T) {
	rounds, seeds := churn.FromEnv(300, 1, 2, 3)
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			gen := churn.New(seed, churnPools)
			p, fp := fakeProxier(t)
			feeder := localsink.NewFeeder(p, localsink.FeederOptions{NoRetry: true})
			defer feeder.Close()
			for round := range rounds {
				for _, c := range gen.Round() {
					feeder.Update(c.Key, c.Value)
				}
				if err := feeder.Sync(); err != nil {
					t.Fatalf("seed %d round %d: Sync: %v", seed, round, err)
				}
				fresh, ffp := newFreshProxier(t)
				ff := localsink.NewFeeder(fresh, localsink.FeederOptions{NoRetry: true})
				ff.SetAll(gen.State())
				// It cannot listen (the incremental one holds the sockets):
				// that, once per frontend that listens, is the only failure
				// allowed.
				err := ff.Sync()
				ff.Close()
				if err := onlyListenFailures(err, fresh); err != nil {
					t.Fatalf("seed %d round %d: the fresh proxier's Sync: %v", seed, round, err)
				}
				want, got := takeSnapshot(fresh, ffp), takeSnapshot(p, fp)
				fresh.Close()
				if diff := cmp.Diff(want, got); diff != "" {
					t.Fatalf("seed %d round %d: the incremental proxier differs from a fresh one (-fresh +incremental):\n%s", seed, round, diff)
				}
				for k, f := range p.frontends {
					f.mu.Lock()
					open := f.ln != nil || f.pc != nil
					f.mu.Unlock()
					if open != f.route.Load().listens() || p.unbound[k] {
						t.Fatalf("seed %d round %d: frontend %v: socket open %v, route listens %v, unbound %v", seed, round, k, open, f.route.Load().listens(), p.unbound[k])
					}
				}
			}
		})
	}
}

// onlyListenFailures returns nil when err (a Sync's) is made of the
// failures to listen of the fake platform without sockets, and the
// frontends of p left unbound are exactly those that listen; an error
// saying what differs otherwise.
func onlyListenFailures(err error, p *Sink) error {
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	} else if err != nil {
		errs = []error{err}
	}
	for _, e := range errs {
		if !errors.Is(e, errNoSockets) {
			return fmt.Errorf("a failure other than the sockets it cannot open: %w", e)
		}
	}
	for k, f := range p.frontends {
		if listens := f.route.Load().listens(); listens != p.unbound[k] {
			return fmt.Errorf("frontend %v: route listens %v, but unbound %v (Sync: %v)", k, listens, p.unbound[k], err)
		}
	}
	return nil
}

// newFreshProxier is a proxier on a fake platform that opens no socket
// (the incremental proxier under test holds them).
func newFreshProxier(t *testing.T) (*Sink, *fakePlatform) {
	t.Helper()
	fp := &fakePlatform{held: map[netip.Addr]bool{}, noSockets: true}
	p, err := newProxier(klog.Background(), Config{ServiceProxyName: "fresh"}, Options{NodeIPs: []netip.Addr{fakeNodeIP}}.withDefaults("fresh"), fp)
	if err != nil {
		t.Fatal(err)
	}
	return p, fp
}
