package localsink_test

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/localsink/sinktest"
	"sigs.k8s.io/kpng/model"
)

// stateGen produces successive full states by random changes to the
// previous one, never modifying an object it has already returned.
type stateGen struct {
	r     *rand.Rand
	state map[model.ServiceKey]*model.ServiceEndpoints
}

var (
	genNamespaces = []string{"a", "a-b", "b"}
	genNames      = []string{"x", "y", "z"}
	genAddrs      = []string{"10.0.0.1", "10.0.0.2", "10.0.0.10", "9.1.1.1", "fd00::1", "fd00::a", "::1"}
)

func (g *stateGen) randomService(k model.ServiceKey) *model.Service {
	s := testService(k.Namespace, k.Name)
	s.Type = []string{"ClusterIP", "NodePort"}[g.r.IntN(2)]
	s.Ports[0].TargetPort = []int32{8080, 9090}[g.r.IntN(2)]
	if g.r.IntN(2) == 0 {
		s.Labels = map[string]string{"app": k.Name}
	}
	return s
}

func (g *stateGen) randomEndpoint(addr string) *model.Endpoint {
	ep := testEndpoint(addr)
	ep.Ready = g.r.IntN(2) == 0
	ep.Zone = []string{"", "z1"}[g.r.IntN(2)]
	return ep
}

// mutate applies one random change: add or remove a service, replace a
// service's Service, or add, remove or change one endpoint.
func (g *stateGen) mutate() {
	k := key(genNamespaces[g.r.IntN(len(genNamespaces))], genNames[g.r.IntN(len(genNames))])
	old := g.state[k]
	if old == nil {
		se := svcEps(g.randomService(k))
		for _, a := range genAddrs {
			if g.r.IntN(3) == 0 {
				se.Endpoints = append(se.Endpoints, g.randomEndpoint(a))
			}
		}
		slices.SortFunc(se.Endpoints, model.CompareEndpoints)
		g.state[k] = se
		return
	}
	switch g.r.IntN(4) {
	case 0:
		delete(g.state, k)
	case 1:
		g.state[k] = &model.ServiceEndpoints{Service: g.randomService(k), Endpoints: old.Endpoints}
	default:
		addr := genAddrs[g.r.IntN(len(genAddrs))]
		eps := make([]*model.Endpoint, 0, len(old.Endpoints)+1)
		for _, ep := range old.Endpoints {
			if ep.Key() != addr {
				eps = append(eps, ep)
			}
		}
		if g.r.IntN(3) != 0 {
			eps = append(eps, g.randomEndpoint(addr))
		}
		slices.SortFunc(eps, model.CompareEndpoints)
		g.state[k] = &model.ServiceEndpoints{Service: old.Service, Endpoints: eps}
	}
}

// items returns the state as a sorted full state.
func (g *stateGen) items() []*model.ServiceEndpoints {
	items := make([]*model.ServiceEndpoints, 0, len(g.state))
	for _, se := range g.state {
		items = append(items, se)
	}
	slices.SortFunc(items, func(a, b *model.ServiceEndpoints) int { return a.Service.Key().Compare(b.Service.Key()) })
	return items
}

// next returns the next full state: often the same (as the same objects or
// as equal copies), otherwise with a few changes.
func (g *stateGen) next() []*model.ServiceEndpoints {
	switch g.r.IntN(6) {
	case 0:
		return g.items()
	case 1:
		return deepCopy(g.items())
	}
	for range 1 + g.r.IntN(3) {
		g.mutate()
	}
	return g.items()
}

// TestFullStateRoundTrip feeds random full states through FromFullState
// into a FullState and checks that the FullState's Handler gets exactly the
// same states back, once per round that changed something and not at all
// for a round without changes, except the first (empty) one.
func TestFullStateRoundTrip(t *testing.T) {
	for seed := uint64(1); seed <= 8; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			var got [][]*model.ServiceEndpoints
			fs := localsink.NewFullState(func(items []*model.ServiceEndpoints) { got = append(got, items) })
			// The checker between them checks the contract of FromFullState.
			checker := sinktest.NewChecker(fs)
			h := localsink.FromFullState(checker)
			defer func() {
				if err := checker.Err(); err != nil {
					t.Errorf("FromFullState broke the Sink contract:\n%v", err)
				}
			}()
			g := &stateGen{r: rand.New(rand.NewPCG(seed, 7)), state: map[model.ServiceKey]*model.ServiceEndpoints{}}

			// The first round is empty: the handler must still be called.
			h([]*model.ServiceEndpoints{})
			if diff := cmp.Diff([][]*model.ServiceEndpoints{{}}, got); diff != "" {
				t.Fatalf("first (empty) round: handler calls (-want +got):\n%s", diff)
			}
			prev := []*model.ServiceEndpoints{}
			changed, unchanged := 0, 0
			for round := 1; round <= 150; round++ {
				got = nil
				items := g.next()
				want := deepCopy(items)
				h(items)
				if reflect.DeepEqual(prev, want) {
					unchanged++
					if len(got) != 0 {
						t.Fatalf("round %d: no change, but the handler was called %d times", round, len(got))
					}
				} else {
					changed++
					if len(got) != 1 {
						t.Fatalf("round %d: state changed, handler called %d times, want once", round, len(got))
					}
					if diff := stateDiff(want, got[0]); diff != "" {
						t.Fatalf("round %d: full state (-want +got):\n%s", round, diff)
					}
				}
				if diff := stateDiff(want, fs.State()); diff != "" {
					t.Fatalf("round %d: State() (-want +got):\n%s", round, diff)
				}
				prev = want
			}
			if changed < 50 || unchanged < 20 {
				t.Fatalf("generator too one-sided: %d changed and %d unchanged rounds", changed, unchanged)
			}
		})
	}
}

// TestFullStatePointers checks that the handler gets unchanged services
// back as the same pointers, sorted by key, and a call for an empty first
// state.
func TestFullStatePointers(t *testing.T) {
	var got [][]*model.ServiceEndpoints
	h := localsink.FromFullState(localsink.NewFullState(func(items []*model.ServiceEndpoints) { got = append(got, items) }))
	h(nil)
	a := svcEps(testService("ns", "a"), endpoints("10.0.0.1")...)
	b := svcEps(testService("a-b", "x"))
	c := svcEps(testService("b", "x"))
	h([]*model.ServiceEndpoints{c, a, b})
	a2 := svcEps(a.Service, endpoints("10.0.0.2")...)
	h([]*model.ServiceEndpoints{a2, b, c})
	want := [][]*model.ServiceEndpoints{{}, {b, c, a}, {b, c, a2}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("handler calls (-want +got):\n%s", diff)
	}
	if got[2][0] != got[1][0] || got[2][1] != got[1][1] {
		t.Errorf("unchanged services handed over as new pointers")
	}
}

// TestFullStateCluster checks that a handler can read the cluster-level
// facts of the state it is handed, and that Reset forgets them.
func TestFullStateCluster(t *testing.T) {
	var seen []*model.Cluster
	var fs *localsink.FullState
	fs = localsink.NewFullState(func([]*model.ServiceEndpoints) { seen = append(seen, fs.Cluster()) })
	f := localsink.NewFeeder(fs, localsink.FeederOptions{NoRetry: true})
	defer f.Close()
	c := &model.Cluster{ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}}
	f.SetCluster(c)
	_ = f.Sync()
	f.SetCluster(nil)
	_ = f.Sync()
	if len(seen) != 2 || seen[0] != c || seen[1] != nil {
		t.Errorf("facts seen by the handler: %v, want %v then none", seen, c)
	}
	fs.SetCluster(c)
	fs.Reset()
	if fs.Cluster() != nil {
		t.Errorf("after Reset: %v, want none", fs.Cluster())
	}
}
