package localsink_test

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"sigs.k8s.io/kpng/client/model"
	"sigs.k8s.io/kpng/localsink"
)

func TestFromFullState(t *testing.T) {
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
	same := func(items ...*model.ServiceEndpoints) []*model.ServiceEndpoints { return deepCopy(items) }

	tests := []struct {
		name   string
		rounds [][]*model.ServiceEndpoints
		want   [][]string // calls of each round
	}{
		{
			name:   "first call: Reset, everything in key order, Sync",
			rounds: [][]*model.ServiceEndpoints{{c1, b1, a1}},
			want: [][]string{{
				"Reset",
				"SetService ns/a", "SetEndpoint ns/a 10.0.0.1", "SetEndpoint ns/a 10.0.0.2",
				"SetService ns/b", "SetEndpoint ns/b fd00::1",
				"SetService ns/c",
				"Sync",
			}},
		},
		{
			name:   "first call with an empty state",
			rounds: [][]*model.ServiceEndpoints{nil},
			want:   [][]string{{"Reset", "Sync"}},
		},
		{
			// Observed: an identical state still produces a Sync (and
			// nothing else); there is no Reset after the first call.
			name:   "identical second call: only Sync",
			rounds: [][]*model.ServiceEndpoints{{a1, b1}, same(a1, b1)},
			want: [][]string{
				{"Reset", "SetService ns/a", "SetEndpoint ns/a 10.0.0.1", "SetEndpoint ns/a 10.0.0.2", "SetService ns/b", "SetEndpoint ns/b fd00::1", "Sync"},
				{"Sync"},
			},
		},
		{
			name:   "identical empty states",
			rounds: [][]*model.ServiceEndpoints{nil, {}},
			want:   [][]string{{"Reset", "Sync"}, {"Sync"}},
		},
		{
			name:   "changes: minimal calls",
			rounds: [][]*model.ServiceEndpoints{{a1, b1, c1}, {b2, a2}},
			want: [][]string{
				{"Reset", "SetService ns/a", "SetEndpoint ns/a 10.0.0.1", "SetEndpoint ns/a 10.0.0.2", "SetService ns/b", "SetEndpoint ns/b fd00::1", "SetService ns/c", "Sync"},
				{
					"SetEndpoint ns/a 10.0.0.2", "SetEndpoint ns/a 10.0.0.3",
					"SetService ns/b",
					"DeleteService ns/c",
					"Sync",
				},
			},
		},
		{
			name:   "everything removed",
			rounds: [][]*model.ServiceEndpoints{{a1}, nil},
			want: [][]string{
				{"Reset", "SetService ns/a", "SetEndpoint ns/a 10.0.0.1", "SetEndpoint ns/a 10.0.0.2", "Sync"},
				{"DeleteEndpoint ns/a 10.0.0.1", "DeleteEndpoint ns/a 10.0.0.2", "DeleteService ns/a", "Sync"},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recSink{}
			h := localsink.FromFullState(rec)
			var got [][]string
			for _, items := range tc.rounds {
				h(items)
				got = append(got, rec.take())
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("calls per round (-want +got):\n%s", diff)
			}
		})
	}
}

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
			h := localsink.FromFullState(fs)
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

// contractSink checks the Sink ordering guarantees documented in sink.go on
// the calls it receives.
type contractSink struct {
	t      *testing.T
	round  int
	calls  []string // calls of the current round, for error messages
	reset  bool     // Reset was called at least once
	held   map[model.ServiceKey]*heldState
	cur    *model.ServiceKey // service of the previous call in the round
	done   map[model.ServiceKey]bool
	setEps map[model.ServiceKey]bool // SetEndpoint seen this round
}

type heldState struct {
	svc *model.Service
	eps map[string]*model.Endpoint
}

func newContractSink(t *testing.T) *contractSink {
	return &contractSink{t: t, held: map[model.ServiceKey]*heldState{}, done: map[model.ServiceKey]bool{}, setEps: map[model.ServiceKey]bool{}}
}

func (c *contractSink) fail(format string, args ...any) {
	c.t.Helper()
	c.t.Fatalf("round %d: %s\ncalls of the round so far:\n%q", c.round, fmt.Sprintf(format, args...), c.calls)
}

func (c *contractSink) call(k model.ServiceKey, s string) {
	c.t.Helper()
	c.calls = append(c.calls, s)
	if !c.reset {
		c.fail("first call is %q, not Reset", s)
	}
	if c.cur != nil && *c.cur != k {
		if c.done[k] {
			c.fail("calls for %v are not grouped", k)
		}
		if k.Compare(*c.cur) < 0 {
			c.fail("service %v comes after %v: not in key order", k, *c.cur)
		}
		c.done[*c.cur] = true
	}
	c.cur = &k
}

func (c *contractSink) Reset() {
	c.calls = append(c.calls, "Reset")
	c.reset = true
	clear(c.held)
}

func (c *contractSink) SetService(svc *model.Service) {
	c.t.Helper()
	k := svc.Key()
	c.call(k, "SetService "+k.String())
	h := c.held[k]
	if h == nil {
		h = &heldState{eps: map[string]*model.Endpoint{}}
		c.held[k] = h
	} else if h.svc != nil && reflect.DeepEqual(h.svc, svc) {
		c.fail("SetService %v with an unchanged value", k)
	}
	h.svc = svc
}

func (c *contractSink) DeleteService(k model.ServiceKey) {
	c.t.Helper()
	c.call(k, "DeleteService "+k.String())
	h := c.held[k]
	if h == nil {
		c.fail("DeleteService of unknown service %v", k)
	}
	if len(h.eps) != 0 {
		c.fail("DeleteService %v with %d endpoints left", k, len(h.eps))
	}
	delete(c.held, k)
}

func (c *contractSink) SetEndpoint(k model.ServiceKey, epKey string, ep *model.Endpoint) {
	c.t.Helper()
	c.call(k, "SetEndpoint "+k.String()+" "+epKey)
	h := c.held[k]
	if h == nil || h.svc == nil {
		c.fail("SetEndpoint %v %s before SetService", k, epKey)
	}
	if old, ok := h.eps[epKey]; ok && reflect.DeepEqual(old, ep) {
		c.fail("SetEndpoint %v %s with an unchanged value", k, epKey)
	}
	if ep.Key() != epKey {
		c.fail("SetEndpoint %v %s of an endpoint whose key is %q", k, epKey, ep.Key())
	}
	h.eps[epKey] = ep
	c.setEps[k] = true
}

func (c *contractSink) DeleteEndpoint(k model.ServiceKey, epKey string) {
	c.t.Helper()
	c.call(k, "DeleteEndpoint "+k.String()+" "+epKey)
	h := c.held[k]
	if h == nil {
		c.fail("DeleteEndpoint %v %s of an unknown service", k, epKey)
	}
	if _, ok := h.eps[epKey]; !ok {
		c.fail("DeleteEndpoint %v %s of an unknown endpoint", k, epKey)
	}
	if c.setEps[k] {
		c.fail("DeleteEndpoint %v %s after a SetEndpoint of the same service", k, epKey)
	}
	delete(h.eps, epKey)
}

func (c *contractSink) Sync() {
	c.round++
	c.calls = nil
	c.cur = nil
	clear(c.done)
	clear(c.setEps)
}

// state returns what the sink holds, as a sorted full state.
func (c *contractSink) state() []*model.ServiceEndpoints {
	items := []*model.ServiceEndpoints{}
	for _, h := range c.held {
		se := svcEps(h.svc)
		for _, ep := range h.eps {
			se.Endpoints = append(se.Endpoints, ep)
		}
		slices.SortFunc(se.Endpoints, model.CompareEndpoints)
		items = append(items, se)
	}
	slices.SortFunc(items, func(a, b *model.ServiceEndpoints) int { return a.Service.Key().Compare(b.Service.Key()) })
	return items
}

// TestFromFullStateKeepsSinkGuarantees feeds random full states through
// FromFullState into a sink checking the guarantees documented on Sink.
func TestFromFullStateKeepsSinkGuarantees(t *testing.T) {
	for seed := uint64(1); seed <= 8; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			c := newContractSink(t)
			h := localsink.FromFullState(c)
			g := &stateGen{r: rand.New(rand.NewPCG(seed, 11)), state: map[model.ServiceKey]*model.ServiceEndpoints{}}
			for round := 0; round < 150; round++ {
				items := g.next()
				want := deepCopy(items)
				h(items)
				if diff := stateDiff(want, c.state()); diff != "" {
					t.Fatalf("round %d: sink state (-want +got):\n%s", round, diff)
				}
			}
		})
	}
}

// TestFullStateSorted checks the order of the full state: services by
// namespace then name, endpoints by address with IPv4 before IPv6; and that
// endpoints of a service never set are not part of it.
func TestFullStateSorted(t *testing.T) {
	var got [][]*model.ServiceEndpoints
	fs := localsink.NewFullState(func(items []*model.ServiceEndpoints) { got = append(got, items) })
	svcs := map[string]*model.Service{}
	for _, k := range []model.ServiceKey{key("b", "x"), key("a-b", "x"), key("a", "y"), key("a", "x"), key("a", "a-b")} {
		svcs[k.String()] = testService(k.Namespace, k.Name)
	}
	eps := map[string]*model.Endpoint{}
	for _, a := range []string{"10.0.0.10", "::1", "10.0.0.9", "2001:db8::1", "9.0.0.1", "fd00::1", "10.0.0.1"} {
		eps[a] = testEndpoint(a)
	}

	fs.Reset()
	for _, k := range []string{"b/x", "a-b/x", "a/y", "a/x", "a/a-b"} {
		fs.SetService(svcs[k])
	}
	for _, a := range []string{"10.0.0.10", "::1", "10.0.0.9", "2001:db8::1", "9.0.0.1"} {
		fs.SetEndpoint(key("a", "x"), a, eps[a])
	}
	fs.SetEndpoint(key("b", "x"), "fd00::1", eps["fd00::1"])
	fs.SetEndpoint(key("b", "x"), "10.0.0.1", eps["10.0.0.1"])
	fs.SetEndpoint(key("c", "orphan"), "10.0.0.1", eps["10.0.0.1"]) // no SetService
	fs.Sync()

	want := [][]*model.ServiceEndpoints{{
		svcEps(svcs["a/a-b"]),
		svcEps(svcs["a/x"], eps["9.0.0.1"], eps["10.0.0.9"], eps["10.0.0.10"], eps["::1"], eps["2001:db8::1"]),
		svcEps(svcs["a/y"]),
		svcEps(svcs["a-b/x"]),
		svcEps(svcs["b/x"], eps["10.0.0.1"], eps["fd00::1"]),
	}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("full state (-want +got):\n%s", diff)
	}
}

// TestFullStateHandlerCalls checks when the Handler is called: on a Sync
// that changed something, and on the first Sync after a Reset even when the
// state is empty.
func TestFullStateHandlerCalls(t *testing.T) {
	var got [][]*model.ServiceEndpoints
	fs := localsink.NewFullState(func(items []*model.ServiceEndpoints) { got = append(got, items) })
	a := svcEps(testService("ns", "a"), endpoints("10.0.0.1")...)
	none := []*model.ServiceEndpoints{}
	steps := []struct {
		name string
		do   func()
		want [][]*model.ServiceEndpoints
	}{
		{"Reset, Sync: empty state", func() { fs.Reset(); fs.Sync() }, [][]*model.ServiceEndpoints{none}},
		{"Sync alone: no call", func() { fs.Sync() }, nil},
		{"Reset again, Sync: called again", func() { fs.Reset(); fs.Sync() }, [][]*model.ServiceEndpoints{none}},
		{"SetService, SetEndpoint, Sync", func() {
			fs.SetService(a.Service)
			fs.SetEndpoint(a.Service.Key(), "10.0.0.1", a.Endpoints[0])
			fs.Sync()
		}, [][]*model.ServiceEndpoints{{a}}},
		{"Sync alone: no call", func() { fs.Sync() }, nil},
		{"Reset and the same state again: called", func() {
			fs.Reset()
			fs.SetService(a.Service)
			fs.SetEndpoint(a.Service.Key(), "10.0.0.1", a.Endpoints[0])
			fs.Sync()
		}, [][]*model.ServiceEndpoints{{a}}},
		{"DeleteEndpoint", func() { fs.DeleteEndpoint(a.Service.Key(), "10.0.0.1"); fs.Sync() },
			[][]*model.ServiceEndpoints{{svcEps(a.Service)}}},
		{"DeleteService", func() { fs.DeleteService(a.Service.Key()); fs.Sync() }, [][]*model.ServiceEndpoints{none}},
		{"Sync alone: no call", func() { fs.Sync() }, nil},
		{"Reset of a non-empty state: empty", func() {
			fs.SetService(a.Service)
			fs.Sync()
			fs.Reset()
			fs.Sync()
		}, [][]*model.ServiceEndpoints{{svcEps(a.Service)}, none}},
	}
	for _, st := range steps {
		got = nil
		st.do()
		if diff := cmp.Diff(st.want, got); diff != "" {
			t.Errorf("%s: handler calls (-want +got):\n%s", st.name, diff)
		}
	}
}

// TestFullStatePointers checks that unchanged services are handed back as
// the same pointers across Syncs, changed ones as new objects, and that
// objects handed out earlier are never modified.
func TestFullStatePointers(t *testing.T) {
	var last []*model.ServiceEndpoints
	calls := 0
	fs := localsink.NewFullState(func(items []*model.ServiceEndpoints) { last = items; calls++ })
	a, b, c, d := key("ns", "a"), key("ns", "b"), key("ns", "c"), key("ns", "d")

	fs.Reset()
	for _, k := range []model.ServiceKey{a, b, c} {
		fs.SetService(testService(k.Namespace, k.Name))
		for _, ep := range endpoints("10.0.0.1", "10.0.0.2") {
			fs.SetEndpoint(k, ep.Key(), ep)
		}
	}
	fs.Sync()
	first := last
	firstCopy := deepCopy(first)

	// Round 2: one endpoint of b changes, d appears.
	bEp := testEndpoint("10.0.0.2")
	bEp.Ready = false
	fs.SetEndpoint(b, "10.0.0.2", bEp)
	fs.SetService(testService("ns", "d"))
	fs.Sync()
	second := last
	secondCopy := deepCopy(second)
	if calls != 2 || len(second) != 4 {
		t.Fatalf("after round 2: %d handler calls and %d services, want 2 and 4", calls, len(second))
	}
	checkSame := func(round string, got, want *model.ServiceEndpoints, same bool) {
		t.Helper()
		if (got == want) != same {
			t.Errorf("%s: %v handed back as the same pointer: %v, want %v", round, got.Service.Key(), got == want, same)
		}
	}
	checkSame("round 2", second[0], first[0], true)  // a
	checkSame("round 2", second[1], first[1], false) // b
	checkSame("round 2", second[2], first[2], true)  // c
	if second[1].Service != first[1].Service {
		t.Errorf("round 2: b's Service pointer changed although only an endpoint did")
	}
	if second[1].Endpoints[0] != first[1].Endpoints[0] || second[1].Endpoints[1] != bEp {
		t.Errorf("round 2: b's endpoints are not the endpoints set")
	}
	if second[3].Service.Key() != d {
		t.Errorf("round 2: last service is %v, want %v", second[3].Service.Key(), d)
	}

	// Round 3: a is deleted, c's service changes, b's endpoint is deleted.
	fs.DeleteEndpoint(a, "10.0.0.1")
	fs.DeleteEndpoint(a, "10.0.0.2")
	fs.DeleteService(a)
	cSvc := testService("ns", "c")
	cSvc.Type = "NodePort"
	fs.SetService(cSvc)
	fs.DeleteEndpoint(b, "10.0.0.1")
	fs.Sync()
	third := last
	if calls != 3 || len(third) != 3 {
		t.Fatalf("after round 3: %d handler calls and %d services, want 3 and 3", calls, len(third))
	}
	checkSame("round 3", third[0], second[1], false) // b
	checkSame("round 3", third[1], second[2], false) // c
	checkSame("round 3", third[2], second[3], true)  // d
	if third[1].Service != cSvc {
		t.Errorf("round 3: c's Service is not the one set")
	}
	if diff := cmp.Diff([]*model.Endpoint{bEp}, third[0].Endpoints); diff != "" {
		t.Errorf("round 3: b's endpoints (-want +got):\n%s", diff)
	}

	// Round 4: a Reset empties the state.
	thirdCopy := deepCopy(third)
	fs.Reset()
	fs.Sync()
	if calls != 4 || len(last) != 0 {
		t.Fatalf("after Reset: %d handler calls and %d services, want 4 and 0", calls, len(last))
	}

	if diff := cmp.Diff(firstCopy, first); diff != "" {
		t.Errorf("state of round 1 was modified later (-then +now):\n%s", diff)
	}
	if diff := cmp.Diff(secondCopy, second); diff != "" {
		t.Errorf("state of round 2 was modified later (-then +now):\n%s", diff)
	}
	if diff := cmp.Diff(thirdCopy, third); diff != "" {
		t.Errorf("state of round 3 was modified later (-then +now):\n%s", diff)
	}
}
