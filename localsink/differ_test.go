package localsink_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"sigs.k8s.io/kpng/client/model"
	"sigs.k8s.io/kpng/localsink"
)

// countChanges counts the calls that Differ.Update and SetAll report (all
// but Reset and Sync).
func countChanges(calls []string) int {
	n := 0
	for _, c := range calls {
		if c != "Reset" && c != "Sync" {
			n++
		}
	}
	return n
}

func TestDiffer(t *testing.T) {
	a := key("ns", "a")
	// base is service ns/a with two endpoints; every case starts from a
	// Differ holding it (unless setup says otherwise).
	base := func() *model.ServiceEndpoints {
		return svcEps(testService("ns", "a"), endpoints("10.0.0.2", "10.0.0.1")...)
	}
	holdBase := func(d *localsink.Differ) { d.Update(a, base()) }

	tests := []struct {
		name    string
		setup   func(d *localsink.Differ) // calls not recorded
		run     func(d *localsink.Differ) int
		want    []string
		wantLen int // d.Len() afterwards
	}{
		{
			name: "new service: SetService then its endpoints",
			run:  func(d *localsink.Differ) int { return d.Update(a, base()) },
			want: []string{
				"SetService ns/a",
				"SetEndpoint ns/a 10.0.0.1",
				"SetEndpoint ns/a 10.0.0.2",
			},
			wantLen: 1,
		},
		{
			name:    "new service without endpoints",
			run:     func(d *localsink.Differ) int { return d.Update(a, svcEps(testService("ns", "a"))) },
			want:    []string{"SetService ns/a"},
			wantLen: 1,
		},
		{
			name:    "unchanged update (equal copies) emits nothing",
			setup:   holdBase,
			run:     func(d *localsink.Differ) int { return d.Update(a, deepCopy([]*model.ServiceEndpoints{base()})[0]) },
			want:    nil,
			wantLen: 1,
		},
		{
			name:  "endpoint change emits only its SetEndpoint",
			setup: holdBase,
			run: func(d *localsink.Differ) int {
				se := base()
				se.Endpoints[0].Ready = false // 10.0.0.2
				return d.Update(a, se)
			},
			want:    []string{"SetEndpoint ns/a 10.0.0.2"},
			wantLen: 1,
		},
		{
			name:  "added endpoint",
			setup: holdBase,
			run: func(d *localsink.Differ) int {
				return d.Update(a, svcEps(testService("ns", "a"), endpoints("10.0.0.1", "10.0.0.2", "fd00::1")...))
			},
			want:    []string{"SetEndpoint ns/a fd00::1"},
			wantLen: 1,
		},
		{
			name:  "removed endpoint",
			setup: holdBase,
			run: func(d *localsink.Differ) int {
				return d.Update(a, svcEps(testService("ns", "a"), endpoints("10.0.0.1")...))
			},
			want:    []string{"DeleteEndpoint ns/a 10.0.0.2"},
			wantLen: 1,
		},
		{
			name:  "removed and added endpoints: deletions first",
			setup: holdBase,
			run: func(d *localsink.Differ) int {
				return d.Update(a, svcEps(testService("ns", "a"), endpoints("10.0.0.3", "10.0.0.1")...))
			},
			want:    []string{"DeleteEndpoint ns/a 10.0.0.2", "SetEndpoint ns/a 10.0.0.3"},
			wantLen: 1,
		},
		{
			name:  "deleted service: every endpoint then the service",
			setup: holdBase,
			run:   func(d *localsink.Differ) int { return d.Update(a, nil) },
			want: []string{
				"DeleteEndpoint ns/a 10.0.0.1",
				"DeleteEndpoint ns/a 10.0.0.2",
				"DeleteService ns/a",
			},
			wantLen: 0,
		},
		{
			name:    "deleting an unknown service emits nothing",
			setup:   holdBase,
			run:     func(d *localsink.Differ) int { return d.Update(key("ns", "b"), nil) },
			want:    nil,
			wantLen: 1,
		},
		{
			name:  "service-only change emits SetService only",
			setup: holdBase,
			run: func(d *localsink.Differ) int {
				se := base()
				se.Service.Ports[0].TargetPort = 9090
				return d.Update(a, se)
			},
			want:    []string{"SetService ns/a"},
			wantLen: 1,
		},
		{
			name:  "service and endpoint change",
			setup: holdBase,
			run: func(d *localsink.Differ) int {
				se := base()
				se.Service.Type = "NodePort"
				se.Endpoints[1].Serving = false // 10.0.0.1
				return d.Update(a, se)
			},
			want:    []string{"SetService ns/a", "SetEndpoint ns/a 10.0.0.1"},
			wantLen: 1,
		},
		{
			name:  "Reset forgets: the same state is sent again",
			setup: holdBase,
			run: func(d *localsink.Differ) int {
				d.Reset()
				return d.Update(a, base())
			},
			want: []string{
				"Reset",
				"SetService ns/a",
				"SetEndpoint ns/a 10.0.0.1",
				"SetEndpoint ns/a 10.0.0.2",
			},
			wantLen: 1,
		},
		{
			name:  "Reset then nothing: nothing held",
			setup: holdBase,
			run: func(d *localsink.Differ) int {
				d.Reset()
				return d.Update(a, nil) // already forgotten: no deletion
			},
			want:    []string{"Reset"},
			wantLen: 0,
		},
		{
			name: "Sync is passed through",
			run:  func(d *localsink.Differ) int { d.Sync(); return 0 },
			want: []string{"Sync"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recSink{}
			d := localsink.NewDiffer(rec)
			if tc.setup != nil {
				tc.setup(d)
			}
			rec.take()
			n := tc.run(d)
			got := rec.take()
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("calls (-want +got):\n%s", diff)
			}
			if want := countChanges(got); n != want {
				t.Errorf("returned %d, want %d (the number of calls made)", n, want)
			}
			if d.Len() != tc.wantLen {
				t.Errorf("Len() = %d, want %d", d.Len(), tc.wantLen)
			}
		})
	}
}

// TestDifferPassesValues checks that the sink gets the values given to the
// Differ (same pointers) and that the Differ does not modify them.
func TestDifferPassesValues(t *testing.T) {
	var gotSvc *model.Service
	var gotEps []*model.Endpoint
	s := &funcSink{
		setService:  func(svc *model.Service) { gotSvc = svc },
		setEndpoint: func(_ model.ServiceKey, _ string, ep *model.Endpoint) { gotEps = append(gotEps, ep) },
	}
	d := localsink.NewDiffer(s)
	se := svcEps(testService("ns", "a"), endpoints("10.0.0.1", "fd00::1")...)
	before := deepCopy([]*model.ServiceEndpoints{se})[0]
	d.Update(se.Service.Key(), se)
	if gotSvc != se.Service {
		t.Errorf("SetService got %p, want the service passed in %p", gotSvc, se.Service)
	}
	if diff := cmp.Diff(se.Endpoints, gotEps, cmp.Comparer(func(a, b *model.Endpoint) bool { return a == b })); diff != "" {
		t.Errorf("SetEndpoint values are not the endpoints passed in (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(before, se); diff != "" {
		t.Errorf("Update modified its input (-before +after):\n%s", diff)
	}
}

type funcSink struct {
	countSink
	setService  func(*model.Service)
	setEndpoint func(model.ServiceKey, string, *model.Endpoint)
}

func (f *funcSink) SetService(svc *model.Service) { f.setService(svc) }
func (f *funcSink) SetEndpoint(k model.ServiceKey, key string, ep *model.Endpoint) {
	f.setEndpoint(k, key, ep)
}

// TestDifferSetAllDeletesMissing checks that SetAll deletes the services
// missing from the new list, in key order (namespace, then name: "a" sorts
// before "a-b" although "a/..." sorts after "a-b/..." as a string), and
// leaves the others alone.
func TestDifferSetAllDeletesMissing(t *testing.T) {
	rec := &recSink{}
	d := localsink.NewDiffer(rec)
	keep := svcEps(testService("m", "keep"), endpoints("10.0.0.9")...)
	held := []*model.ServiceEndpoints{
		svcEps(testService("z", "a"), endpoints("10.0.0.1")...),
		svcEps(testService("a-b", "x")),
		keep,
		svcEps(testService("a", "y"), endpoints("10.0.0.2", "10.0.0.1")...),
		svcEps(testService("a", "x"), endpoints("10.0.0.3")...),
	}
	if n := d.SetAll(held); n != 5+5 {
		t.Fatalf("first SetAll returned %d, want 10", n)
	}
	rec.take()

	n := d.SetAll([]*model.ServiceEndpoints{deepCopy([]*model.ServiceEndpoints{keep})[0]})
	want := []string{
		"DeleteEndpoint a/x 10.0.0.3",
		"DeleteService a/x",
		"DeleteEndpoint a/y 10.0.0.1",
		"DeleteEndpoint a/y 10.0.0.2",
		"DeleteService a/y",
		"DeleteService a-b/x",
		"DeleteEndpoint z/a 10.0.0.1",
		"DeleteService z/a",
	}
	got := rec.take()
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
	if n != len(want) {
		t.Errorf("SetAll returned %d, want %d", n, len(want))
	}
	if d.Len() != 1 {
		t.Errorf("Len() = %d, want 1", d.Len())
	}

	// An empty list deletes everything; SetAll does not Sync.
	d.SetAll(nil)
	if diff := cmp.Diff([]string{"DeleteEndpoint m/keep 10.0.0.9", "DeleteService m/keep"}, rec.take()); diff != "" {
		t.Errorf("SetAll(nil) calls (-want +got):\n%s", diff)
	}
	if d.Len() != 0 {
		t.Errorf("Len() = %d, want 0", d.Len())
	}
}

// TestDifferSetAllSorts checks that SetAll sends the services of an
// unsorted list in key order, and does not reorder the caller's slice.
func TestDifferSetAllSorts(t *testing.T) {
	rec := &recSink{}
	d := localsink.NewDiffer(rec)
	items := []*model.ServiceEndpoints{
		svcEps(testService("b", "a"), endpoints("10.0.0.1")...),
		svcEps(testService("a-b", "a")),
		svcEps(testService("a", "b")),
		svcEps(testService("a", "a"), endpoints("fd00::1", "10.0.0.1")...),
	}
	orig := append([]*model.ServiceEndpoints(nil), items...)
	n := d.SetAll(items)
	want := []string{
		"SetService a/a",
		"SetEndpoint a/a 10.0.0.1",
		"SetEndpoint a/a fd00::1",
		"SetService a/b",
		"SetService a-b/a",
		"SetService b/a",
		"SetEndpoint b/a 10.0.0.1",
	}
	if diff := cmp.Diff(want, rec.take()); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
	if n != len(want) {
		t.Errorf("SetAll returned %d, want %d", n, len(want))
	}
	for i := range items {
		if items[i] != orig[i] {
			t.Errorf("SetAll reordered its input: items[%d] changed", i)
		}
	}
}

// TestDifferSetAllRoundInKeyOrder checks the Sink guarantee "within a round,
// calls are grouped by service, services in key order" when SetAll both
// deletes and sets services: the deletion of ns/a must come before the
// creation of ns/b, as the watcher (which calls Update in key order) does.
func TestDifferSetAllRoundInKeyOrder(t *testing.T) {
	rec := &recSink{}
	d := localsink.NewDiffer(rec)
	d.SetAll([]*model.ServiceEndpoints{
		svcEps(testService("ns", "a"), endpoints("10.0.0.1")...),
		svcEps(testService("ns", "c"), endpoints("10.0.0.3")...),
	})
	rec.take()
	d.SetAll([]*model.ServiceEndpoints{
		svcEps(testService("ns", "b"), endpoints("10.0.0.2")...),
		svcEps(testService("ns", "c"), endpoints("10.0.0.4")...),
	})
	want := []string{
		"DeleteEndpoint ns/a 10.0.0.1",
		"DeleteService ns/a",
		"SetService ns/b",
		"SetEndpoint ns/b 10.0.0.2",
		"DeleteEndpoint ns/c 10.0.0.3",
		"SetEndpoint ns/c 10.0.0.4",
	}
	if diff := cmp.Diff(want, rec.take()); diff != "" {
		t.Errorf("calls not in service key order (-want +got):\n%s", diff)
	}
}

// TestDifferEndpointOrderAndDuplicates checks what Update documents: new
// and changed endpoints are set in address order (IPv4 before IPv6, not in
// text order), unsorted input is accepted, and of an address listed twice
// the first wins.
func TestDifferEndpointOrderAndDuplicates(t *testing.T) {
	rec := &recSink{}
	var values []*model.Endpoint
	s := &funcSink{
		setService: rec.SetService,
		setEndpoint: func(k model.ServiceKey, key string, ep *model.Endpoint) {
			rec.SetEndpoint(k, key, ep)
			values = append(values, ep)
		},
	}
	d := localsink.NewDiffer(s)
	a := key("ns", "a")
	first := testEndpoint("10.0.0.9")
	dup := testEndpoint("10.0.0.9")
	dup.Ready = false
	se := svcEps(testService("ns", "a"), testEndpoint("fd00::1"), testEndpoint("10.0.0.10"), first, dup, testEndpoint("9.0.0.1"))
	if n := d.Update(a, se); n != 5 {
		t.Errorf("Update returned %d, want 5", n)
	}
	want := []string{
		"SetService ns/a",
		"SetEndpoint ns/a 9.0.0.1",
		"SetEndpoint ns/a 10.0.0.9",
		"SetEndpoint ns/a 10.0.0.10",
		"SetEndpoint ns/a fd00::1",
	}
	if diff := cmp.Diff(want, rec.take()); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
	if len(values) != 4 || values[1] != first {
		t.Errorf("SetEndpoint 10.0.0.9 was not given the first of the duplicates")
	}
	// The same unsorted input again, as the same pointer and as a copy:
	// nothing to send.
	if n := d.Update(a, se); n != 0 {
		t.Errorf("same unsorted input again: returned %d, want 0", n)
	}
	if n := d.Update(a, deepCopy([]*model.ServiceEndpoints{se})[0]); n != 0 {
		t.Errorf("copy of the unsorted input: returned %d, want 0", n)
	}
	if got := rec.take(); got != nil {
		t.Errorf("same state again: calls %q, want none", got)
	}
	// The input was not reordered.
	if se.Endpoints[0].Key() != "fd00::1" || se.Endpoints[3] != dup {
		t.Errorf("Update reordered its input's endpoints")
	}
}

// TestDifferSetAllAfterUpdate checks that SetAll brings the sink to exactly
// the full state given even when Update was called since the previous
// SetAll (SetAll documents that it deletes services held from Update calls
// outside SetAll).
func TestDifferSetAllAfterUpdate(t *testing.T) {
	a, b := key("ns", "a"), key("ns", "b")
	a1 := svcEps(testService("ns", "a"), endpoints("10.0.0.1")...)
	a2 := svcEps(testService("ns", "a"), endpoints("10.0.0.2")...)
	b1 := svcEps(testService("ns", "b"), endpoints("10.0.0.3")...)
	tests := []struct {
		name   string
		update func(d *localsink.Differ)
		want   []string
	}{
		{
			name:   "service deleted by Update is set again",
			update: func(d *localsink.Differ) { d.Update(a, nil) },
			want:   []string{"SetService ns/a", "SetEndpoint ns/a 10.0.0.1"},
		},
		{
			name:   "service changed by Update is set back",
			update: func(d *localsink.Differ) { d.Update(a, a2) },
			want:   []string{"DeleteEndpoint ns/a 10.0.0.2", "SetEndpoint ns/a 10.0.0.1"},
		},
		{
			name:   "service added by Update is deleted",
			update: func(d *localsink.Differ) { d.Update(b, b1) },
			want:   []string{"DeleteEndpoint ns/b 10.0.0.3", "DeleteService ns/b"},
		},
		{
			name: "one replaced by another through Update",
			update: func(d *localsink.Differ) {
				d.Update(a, nil)
				d.Update(b, b1)
			},
			want: []string{
				"SetService ns/a", "SetEndpoint ns/a 10.0.0.1",
				"DeleteEndpoint ns/b 10.0.0.3", "DeleteService ns/b",
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recSink{}
			d := localsink.NewDiffer(rec)
			d.SetAll([]*model.ServiceEndpoints{a1})
			tc.update(d)
			rec.take()
			n := d.SetAll([]*model.ServiceEndpoints{a1})
			got := rec.take()
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("calls of the second SetAll (-want +got):\n%s", diff)
			}
			if n != len(got) {
				t.Errorf("SetAll returned %d, made %d calls", n, len(got))
			}
			if d.Len() != 1 {
				t.Errorf("Len() = %d, want 1", d.Len())
			}
		})
	}
}
