package diffstore

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// ---- helpers ----

type strStore = Store[string, string]
type strChanges = Changes[string, string]
type strItem = Item[string, string]

func hashString(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

// constructors are the three ways of building a store; every table test runs
// against each of them.
var constructors = []struct {
	name string
	new  func() *strStore
}{
	{"New", func() *strStore { return New[string](func(a, b string) bool { return a == b }) }},
	{"NewComparable", func() *strStore { return NewComparable[string, string]() }},
	{"NewHashed", func() *strStore { return NewHashed[string](hashString) }},
}

type op struct {
	del  bool
	k, v string
}

func set(k, v string) op { return op{k: k, v: v} }
func del(k string) op    { return op{del: true, k: k} }

func (o op) apply(s *strStore) {
	if o.del {
		s.Delete(o.k)
	} else {
		s.Set(o.k, o.v)
	}
}

func cr(k, v string) strItem           { return strItem{Key: k, Value: v} }
func up(k, v, prev string) strItem     { return strItem{Key: k, Value: v, Prev: prev} }
func dl(k, last string) strItem        { return strItem{Key: k, Value: last, Prev: last} }
func items(it ...strItem) []strItem    { return it }
func created(it ...strItem) strChanges { return strChanges{Created: it} }
func updated(it ...strItem) strChanges { return strChanges{Updated: it} }
func deleted(it ...strItem) strChanges { return strChanges{Deleted: it} }

// state returns the store content as seen by Each, checking that Each goes in
// key order and that Len agrees.
func state(t *testing.T, s *strStore) map[string]string {
	t.Helper()
	m := map[string]string{}
	var keys []string
	s.Each(func(k, v string) {
		keys = append(keys, k)
		m[k] = v
	})
	if !slices.IsSorted(keys) {
		t.Errorf("Each not in key order: %q", keys)
	}
	if s.Len() != len(m) {
		t.Errorf("Len() = %d, Each saw %d keys", s.Len(), len(m))
	}
	return m
}

type round struct {
	ops     []op
	partial bool // end with DonePartial instead of Done
	want    strChanges
	// wantState is the content after the round (nil: not checked).
	wantState map[string]string
}

// base is a first full round creating a=1, b=2, c=3.
var base = round{
	ops:       []op{set("c", "3"), set("a", "1"), set("b", "2")},
	want:      created(cr("a", "1"), cr("b", "2"), cr("c", "3")),
	wantState: map[string]string{"a": "1", "b": "2", "c": "3"},
}

// full is a full round re-setting a=1, b=2, c=3 followed by ops.
func full(want strChanges, state map[string]string, ops ...op) round {
	return round{
		ops:       append([]op{set("a", "1"), set("b", "2"), set("c", "3")}, ops...),
		want:      want,
		wantState: state,
	}
}

// partial is a partial round made of ops.
func partial(want strChanges, state map[string]string, ops ...op) round {
	return round{ops: ops, partial: true, want: want, wantState: state}
}

var abc = map[string]string{"a": "1", "b": "2", "c": "3"}

func runRounds(t *testing.T, s *strStore, rounds []round) {
	t.Helper()
	for i, r := range rounds {
		for _, o := range r.ops {
			o.apply(s)
		}
		var got strChanges
		if r.partial {
			got = s.DonePartial()
		} else {
			got = s.Done()
		}
		if diff := cmp.Diff(r.want, got); diff != "" {
			t.Errorf("round %d (partial=%v): changes mismatch (-want +got):\n%s", i, r.partial, diff)
		}
		if got.Empty() != (r.want.Len() == 0) || got.Len() != r.want.Len() {
			t.Errorf("round %d: Empty()=%v Len()=%d, want Len %d", i, got.Empty(), got.Len(), r.want.Len())
		}
		if r.wantState != nil {
			if diff := cmp.Diff(r.wantState, state(t, s)); diff != "" {
				t.Errorf("round %d: state mismatch (-want +got):\n%s", i, diff)
			}
		}
	}
}

// ---- table tests ----

func TestDone(t *testing.T) {
	tests := []struct {
		name   string
		rounds []round
	}{
		{"empty round on empty store", []round{
			{want: strChanges{}, wantState: map[string]string{}},
		}},
		{"created, sorted by key", []round{base}},
		{"unchanged round reports nothing", []round{
			base,
			full(strChanges{}, abc),
			full(strChanges{}, abc),
		}},
		{"unchanged round, different Set order", []round{
			base,
			{ops: []op{set("c", "3"), set("b", "2"), set("a", "1")}, want: strChanges{}, wantState: abc},
		}},
		{"updated", []round{
			base,
			{
				ops:       []op{set("a", "1"), set("b", "20"), set("c", "30")},
				want:      updated(up("b", "20", "2"), up("c", "30", "3")),
				wantState: map[string]string{"a": "1", "b": "20", "c": "30"},
			},
		}},
		{"set to equal value not reported", []round{
			base,
			full(strChanges{}, abc, set("b", "2"), set("b", "2")),
		}},
		{"not set is deleted", []round{
			base,
			{
				ops:       []op{set("b", "2")},
				want:      deleted(dl("a", "1"), dl("c", "3")),
				wantState: map[string]string{"b": "2"},
			},
			{want: deleted(dl("b", "2")), wantState: map[string]string{}},
			{want: strChanges{}, wantState: map[string]string{}},
		}},
		{"explicit delete", []round{
			base,
			full(deleted(dl("b", "2")), map[string]string{"a": "1", "c": "3"}, del("b")),
		}},
		{"delete without set", []round{
			base,
			{
				ops:       []op{set("a", "1"), set("c", "3"), del("b")},
				want:      deleted(dl("b", "2")),
				wantState: map[string]string{"a": "1", "c": "3"},
			},
		}},
		{"delete twice", []round{
			base,
			full(deleted(dl("b", "2")), map[string]string{"a": "1", "c": "3"}, del("b"), del("b")),
		}},
		{"delete absent is a no-op", []round{
			base,
			full(strChanges{}, abc, del("zz")),
		}},
		{"set then delete, existed", []round{
			base,
			full(deleted(dl("b", "2")), map[string]string{"a": "1", "c": "3"}, set("b", "22"), del("b")),
		}},
		{"set then delete, new", []round{
			base,
			full(strChanges{}, abc, set("d", "4"), del("d")),
		}},
		{"set then delete then set, new", []round{
			base,
			full(created(cr("d", "5")), map[string]string{"a": "1", "b": "2", "c": "3", "d": "5"},
				set("d", "4"), del("d"), set("d", "5")),
		}},
		{"set twice, last wins (new)", []round{
			base,
			full(created(cr("d", "5")), map[string]string{"a": "1", "b": "2", "c": "3", "d": "5"},
				set("d", "4"), set("d", "5")),
		}},
		{"set twice, last wins (existing)", []round{
			base,
			full(updated(up("b", "22", "2")), map[string]string{"a": "1", "b": "22", "c": "3"},
				set("b", "21"), set("b", "22")),
		}},
		{"set twice, back to previous value", []round{
			base,
			full(strChanges{}, abc, set("b", "21"), set("b", "2")),
		}},
		{"delete then set, different", []round{
			base,
			full(updated(up("b", "22", "2")), map[string]string{"a": "1", "b": "22", "c": "3"},
				del("b"), set("b", "22")),
		}},
		{"delete then set, equal", []round{
			base,
			full(strChanges{}, abc, del("b"), set("b", "2")),
		}},
		{"delete then set, without earlier set", []round{
			base,
			{
				ops:       []op{set("a", "1"), set("c", "3"), del("b"), set("b", "2")},
				want:      strChanges{},
				wantState: abc,
			},
		}},
		{"all kinds at once", []round{
			base,
			{
				ops:       []op{set("e", "5"), set("c", "33"), set("d", "4"), del("a")},
				want:      strChanges{Created: items(cr("d", "4"), cr("e", "5")), Updated: items(up("c", "33", "3")), Deleted: items(dl("a", "1"), dl("b", "2"))},
				wantState: map[string]string{"c": "33", "d": "4", "e": "5"},
			},
		}},
		{"re-created after delete", []round{
			base,
			full(deleted(dl("b", "2")), nil, del("b")),
			full(created(cr("b", "2")), abc),
		}},
		{"Prev is the previous round value after several updates", []round{
			base,
			full(updated(up("a", "10", "1")), nil, set("a", "10")),
			full(updated(up("a", "1", "10")), abc),
		}},
	}
	for _, c := range constructors {
		for _, tt := range tests {
			t.Run(c.name+"/"+tt.name, func(t *testing.T) {
				runRounds(t, c.new(), tt.rounds)
			})
		}
	}
}

func TestDonePartial(t *testing.T) {
	tests := []struct {
		name   string
		rounds []round
	}{
		{"empty partial round on empty store", []round{
			partial(strChanges{}, map[string]string{}),
		}},
		{"created, sorted by key", []round{
			partial(created(cr("a", "1"), cr("b", "2")), map[string]string{"a": "1", "b": "2"}, set("b", "2"), set("a", "1")),
		}},
		{"empty partial round keeps everything", []round{
			base,
			partial(strChanges{}, abc),
			partial(strChanges{}, abc),
		}},
		{"updated, untouched keys stay", []round{
			base,
			partial(updated(up("b", "22", "2")), map[string]string{"a": "1", "b": "22", "c": "3"}, set("b", "22")),
		}},
		{"set to equal value not reported", []round{
			base,
			partial(strChanges{}, abc, set("b", "2"), set("a", "1")),
		}},
		{"explicit delete", []round{
			base,
			partial(deleted(dl("a", "1"), dl("c", "3")), map[string]string{"b": "2"}, del("c"), del("a")),
		}},
		{"delete absent is a no-op", []round{
			base,
			partial(strChanges{}, abc, del("zz")),
		}},
		{"set then delete, existed", []round{
			base,
			partial(deleted(dl("b", "2")), map[string]string{"a": "1", "c": "3"}, set("b", "22"), del("b")),
		}},
		{"set then delete, new", []round{
			base,
			partial(strChanges{}, abc, set("d", "4"), del("d")),
		}},
		{"set twice, last wins (new)", []round{
			base,
			partial(created(cr("d", "5")), map[string]string{"a": "1", "b": "2", "c": "3", "d": "5"}, set("d", "4"), set("d", "5")),
		}},
		{"set twice, last wins (existing)", []round{
			base,
			partial(updated(up("b", "22", "2")), map[string]string{"a": "1", "b": "22", "c": "3"}, set("b", "21"), set("b", "22")),
		}},
		{"set twice, back to previous value", []round{
			base,
			partial(strChanges{}, abc, set("b", "21"), set("b", "2")),
		}},
		{"delete then set, different", []round{
			base,
			partial(updated(up("b", "22", "2")), map[string]string{"a": "1", "b": "22", "c": "3"}, del("b"), set("b", "22")),
		}},
		{"delete then set, equal", []round{
			base,
			partial(strChanges{}, abc, del("b"), set("b", "2")),
		}},
		{"all kinds at once", []round{
			base,
			partial(
				strChanges{Created: items(cr("d", "4"), cr("e", "5")), Updated: items(up("c", "33", "3")), Deleted: items(dl("a", "1"))},
				map[string]string{"b": "2", "c": "33", "d": "4", "e": "5"},
				set("e", "5"), set("c", "33"), set("d", "4"), del("a"),
			),
		}},
		{"partial rounds then full round", []round{
			base,
			partial(created(cr("d", "4")), map[string]string{"a": "1", "b": "2", "c": "3", "d": "4"}, set("d", "4")),
			partial(updated(up("a", "10", "1")), map[string]string{"a": "10", "b": "2", "c": "3", "d": "4"}, set("a", "10")),
			// Full round: b was not Set since the previous Done, neither in
			// this round nor in the partial ones -> deleted. a and d were
			// Set during the partial rounds, hence kept.
			{
				ops:       []op{set("c", "3")},
				want:      deleted(dl("b", "2")),
				wantState: map[string]string{"a": "10", "c": "3", "d": "4"},
			},
			// Next full round: only what is Set now survives.
			{
				ops:       []op{set("c", "3")},
				want:      deleted(dl("a", "10"), dl("d", "4")),
				wantState: map[string]string{"c": "3"},
			},
		}},
		{"partial round set to equal value counts as set for the next Done", []round{
			base,
			partial(strChanges{}, abc, set("a", "1")),
			{want: deleted(dl("b", "2"), dl("c", "3")), wantState: map[string]string{"a": "1"}},
		}},
		{"partial delete then full round", []round{
			base,
			partial(deleted(dl("a", "1")), map[string]string{"b": "2", "c": "3"}, del("a")),
			full(created(cr("a", "1")), abc),
		}},
		{"full round, then partial, then full", []round{
			base,
			full(strChanges{}, abc),
			partial(updated(up("b", "20", "2")), map[string]string{"a": "1", "b": "20", "c": "3"}, set("b", "20")),
			full(updated(up("b", "2", "20")), abc),
		}},
	}
	for _, c := range constructors {
		for _, tt := range tests {
			t.Run(c.name+"/"+tt.name, func(t *testing.T) {
				runRounds(t, c.new(), tt.rounds)
			})
		}
	}
}

func TestGet(t *testing.T) {
	type get struct {
		k    string
		want string
		ok   bool
	}
	type step struct {
		op   *op   // applied first when non-nil
		done *bool // true: Done, false: DonePartial
		get  []get
	}
	opp := func(o op) *op { return &o }
	yes, no := true, false
	steps := []step{
		{get: []get{{"a", "", false}}},
		{op: opp(set("a", "1")), get: []get{{"a", "1", true}}},
		{op: opp(set("a", "2")), get: []get{{"a", "2", true}}},
		{done: &yes, get: []get{{"a", "2", true}}},
		// Within a full round, a key not Set yet still has its value.
		{op: opp(set("b", "1")), get: []get{{"a", "2", true}, {"b", "1", true}}},
		{op: opp(del("a")), get: []get{{"a", "", false}}},
		{op: opp(set("a", "3")), get: []get{{"a", "3", true}}},
		{op: opp(set("a", "2")), get: []get{{"a", "2", true}}},
		{op: opp(del("a")), get: []get{{"a", "", false}}},
		{op: opp(del("b")), get: []get{{"b", "", false}}},
		{done: &no, get: []get{{"a", "", false}, {"b", "", false}}},
		{op: opp(set("c", "1")), get: []get{{"c", "1", true}}},
		{done: &yes, get: []get{{"c", "1", true}}},
		// c not Set in this full round.
		{done: &yes, get: []get{{"c", "", false}}},
	}
	for _, c := range constructors {
		t.Run(c.name, func(t *testing.T) {
			s := c.new()
			for i, st := range steps {
				if st.op != nil {
					st.op.apply(s)
				}
				if st.done != nil {
					if *st.done {
						s.Done()
					} else {
						s.DonePartial()
					}
				}
				for _, g := range st.get {
					v, ok := s.Get(g.k)
					if v != g.want || ok != g.ok {
						t.Errorf("step %d: Get(%q) = %q, %v; want %q, %v", i, g.k, v, ok, g.want, g.ok)
					}
				}
			}
		})
	}
}

// TestComparators checks that New and NewHashed really use the given
// functions to decide whether a value changed.
func TestComparators(t *testing.T) {
	tests := []struct {
		name string
		s    *strStore
	}{
		{"New/EqualFold", New[string](strings.EqualFold)},
		{"NewHashed/lowercase", NewHashed[string](func(v string) uint64 { return hashString(strings.ToLower(v)) })},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := tt.s
			runRounds(t, s, []round{
				{ops: []op{set("a", "x")}, want: created(cr("a", "x"))},
				// Equal according to the comparator: not reported, but the
				// stored value becomes the latest one.
				{ops: []op{set("a", "X")}, want: strChanges{}, wantState: map[string]string{"a": "X"}},
				{ops: []op{set("a", "y")}, partial: true, want: updated(up("a", "y", "X"))},
				{ops: []op{set("a", "Y")}, partial: true, want: strChanges{}, wantState: map[string]string{"a": "Y"}},
			})
			if v, _ := s.Get("a"); v != "Y" {
				t.Errorf("Get(a) = %q, want Y", v)
			}
		})
	}
}

func TestChanges(t *testing.T) {
	var empty strChanges
	if !empty.Empty() || empty.Len() != 0 {
		t.Errorf("zero Changes: Empty()=%v Len()=%d", empty.Empty(), empty.Len())
	}
	c := strChanges{Created: items(cr("a", "1")), Updated: items(up("b", "2", "1"), up("c", "2", "1")), Deleted: items(dl("d", "1"))}
	if c.Empty() || c.Len() != 4 {
		t.Errorf("Changes: Empty()=%v Len()=%d, want false 4", c.Empty(), c.Len())
	}
}

func TestNilFunctionsPanic(t *testing.T) {
	for name, f := range map[string]func(){
		"New":       func() { New[string, string](nil) },
		"NewHashed": func() { NewHashed[string, string](nil) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Error("no panic")
				}
			}()
			f()
		})
	}
}

// TestIntKeysOrder checks ordering with non-string keys (numeric order, not
// lexical).
func TestIntKeysOrder(t *testing.T) {
	s := NewComparable[int, int]()
	for _, k := range []int{10, -3, 2, 100, 0} {
		s.Set(k, k*2)
	}
	got := s.Done()
	want := Changes[int, int]{Created: []Item[int, int]{
		{Key: -3, Value: -6}, {Key: 0, Value: 0}, {Key: 2, Value: 4}, {Key: 10, Value: 20}, {Key: 100, Value: 200},
	}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	var keys []int
	s.Each(func(k, _ int) { keys = append(keys, k) })
	if diff := cmp.Diff([]int{-3, 0, 2, 10, 100}, keys); diff != "" {
		t.Errorf("Each order (-want +got):\n%s", diff)
	}
}

// ---- model-based randomized test ----

// model is a naive reference implementation of the documented semantics.
type model struct {
	prev         map[string]string // as of the previous round
	cur          map[string]string // current values (nil entry: deleted)
	touched      map[string]bool   // Set or Deleted this round
	setSinceDone map[string]bool   // Set since the previous Done
}

func newModel() *model {
	return &model{prev: map[string]string{}, cur: map[string]string{}, touched: map[string]bool{}, setSinceDone: map[string]bool{}}
}

func (m *model) set(k, v string) { m.cur[k] = v; m.touched[k] = true; m.setSinceDone[k] = true }
func (m *model) del(k string)    { delete(m.cur, k); m.touched[k] = true; delete(m.setSinceDone, k) }

func (m *model) done(partial bool) strChanges {
	var ch strChanges
	keys := map[string]bool{}
	for k := range m.prev {
		keys[k] = true
	}
	for k := range m.cur {
		keys[k] = true
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	slices.Sort(sorted)
	next := map[string]string{}
	for _, k := range sorted {
		p, had := m.prev[k]
		v, has := m.cur[k]
		if partial && !m.touched[k] {
			v, has = p, had
		}
		if !partial && !m.setSinceDone[k] {
			has = false
		}
		switch {
		case had && !has:
			ch.Deleted = append(ch.Deleted, dl(k, p))
		case !had && has:
			ch.Created = append(ch.Created, cr(k, v))
		case had && has && p != v:
			ch.Updated = append(ch.Updated, up(k, v, p))
		}
		if has {
			next[k] = v
		}
	}
	m.prev = next
	m.cur = map[string]string{}
	for k, v := range next {
		m.cur[k] = v
	}
	m.touched = map[string]bool{}
	if !partial {
		m.setSinceDone = map[string]bool{}
	}
	return ch
}

func TestRandomAgainstModel(t *testing.T) {
	for _, c := range constructors {
		t.Run(c.name, func(t *testing.T) {
			for seed := uint64(0); seed < 20; seed++ {
				r := rand.New(rand.NewPCG(seed, 42))
				s, m := c.new(), newModel()
				nkeys := 1 + r.IntN(40)
				for round := 0; round < 60; round++ {
					partial := r.IntN(2) == 0
					nops := r.IntN(2 * nkeys)
					if !partial {
						// A full round usually re-sets most keys.
						for k, v := range m.prev {
							if r.IntN(10) != 0 {
								s.Set(k, v)
								m.set(k, v)
							}
						}
					}
					for range nops {
						k := fmt.Sprintf("k%02d", r.IntN(nkeys))
						if r.IntN(4) == 0 {
							s.Delete(k)
							m.del(k)
						} else {
							v := fmt.Sprint(r.IntN(3))
							s.Set(k, v)
							m.set(k, v)
						}
						// Get must always reflect the latest Set/Delete.
						wv, wok := m.cur[k]
						if gv, gok := s.Get(k); gv != wv || gok != wok {
							t.Fatalf("seed %d round %d: Get(%q) = %q, %v; want %q, %v", seed, round, k, gv, gok, wv, wok)
						}
					}
					var got strChanges
					if partial {
						got = s.DonePartial()
					} else {
						got = s.Done()
					}
					want := m.done(partial)
					if diff := cmp.Diff(want, got); diff != "" {
						t.Fatalf("seed %d round %d partial=%v (-want +got):\n%s", seed, round, partial, diff)
					}
					if diff := cmp.Diff(m.prev, state(t, s)); diff != "" {
						t.Fatalf("seed %d round %d: state (-want +got):\n%s", seed, round, diff)
					}
				}
			}
		})
	}
}

// ---- memory retention ----

func TestPendingNotRetained(t *testing.T) {
	s := NewComparable[int, int]()
	for i := range 1000 {
		s.Set(i, i)
	}
	if ch := s.Done(); len(ch.Created) != 1000 {
		t.Fatalf("created %d, want 1000", len(ch.Created))
	}
	if s.pending != nil {
		t.Errorf("pending map kept after a large round (len %d)", len(s.pending))
	}
	s.Set(1, -1)
	s.DonePartial()
	if len(s.pending) != 0 {
		t.Errorf("pending not emptied: len %d", len(s.pending))
	}
}

func TestLiveShrinks(t *testing.T) {
	s := NewComparable[int, int]()
	const n = 10 * shrinkMin
	for i := range n {
		s.Set(i, i)
	}
	s.Done()
	old := s.live
	for i := range 10 {
		s.Set(i, i)
	}
	if ch := s.Done(); len(ch.Deleted) != n-10 {
		t.Fatalf("deleted %d, want %d", len(ch.Deleted), n-10)
	}
	if s.Len() != 10 || s.peak != 10 {
		t.Errorf("Len()=%d peak=%d, want 10 10", s.Len(), s.peak)
	}
	// The map must have been reallocated (Go maps never shrink).
	s.live[-1] = entry[int]{}
	if _, ok := old[-1]; ok {
		t.Error("live map not reallocated after deleting most keys")
	}
	delete(s.live, -1)
	if diff := cmp.Diff(map[int]int{0: 0, 1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 6, 7: 7, 8: 8, 9: 9}, func() map[int]int {
		m := map[int]int{}
		s.Each(func(k, v int) { m[k] = v })
		return m
	}()); diff != "" {
		t.Errorf("content after shrink (-want +got):\n%s", diff)
	}
}
