package server

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"sigs.k8s.io/kpng/api/kpngv1"
	"sigs.k8s.io/kpng/model"
)

func internalSvc(name, label string) *model.ServiceEndpoints {
	return &model.ServiceEndpoints{
		Service: &model.Service{Namespace: "ns", Name: name, Type: "ClusterIP", Labels: map[string]string{"l": label},
			IPs: model.ServiceIPs{ClusterIPs: model.IPSet{V4: []string{"10.96.0.1"}}}, Ports: []*model.PortMapping{{Protocol: model.TCP, Port: 80, TargetPort: 8080}}},
		Endpoints: []*model.Endpoint{{IPs: model.IPSet{V4: []string{"10.0.0.1"}}, Ready: true, NodeName: "node-a"}},
	}
}

// TestSnapshotsShareTheirUnchangedBatches: a snapshot's batches of
// services are each one piece, and two snapshots of states that differ in
// one service share every batch but the one holding it, so that streams
// still sending older snapshots cost the batches that changed, not copies
// of the state; a service added or removed moves no batch boundary but
// its own batch's.
func TestSnapshotsShareTheirUnchangedBatches(t *testing.T) {
	h := NewHub(true)
	for i := range 2000 {
		name := fmt.Sprintf("s%04d", i)
		h.Update(model.ServiceKey{Namespace: "ns", Name: name}, nil, internalSvc(name, strings.Repeat("x", 200)))
	}
	_ = h.Sync()
	snapshotNow := func() *snapshot {
		h.mu.RLock()
		defer h.mu.RUnlock()
		return h.snapshotLocked()
	}
	s1 := snapshotNow()
	if len(s1.batches) < 5 {
		t.Fatalf("%d batches, want several", len(s1.batches))
	}
	// Each batch of services one piece, the bytes of its references; the
	// sync alone in the last.
	check := func(s *snapshot) {
		t.Helper()
		if len(s.refs) != len(s.batches)-1 {
			t.Fatalf("%d batches of services and %d in all, want the sync after them", len(s.refs), len(s.batches))
		}
		for i, m := range s.batches {
			if len(m) != 1 {
				t.Fatalf("batch %d of %d pieces, want 1", i, len(m))
			}
			if i < len(s.refs) && !bytes.Equal(m[0].ReadOnlyData(), mem.BufferSlice(s.refs[i]).Materialize()) {
				t.Fatalf("batch %d differs from the services' encodings it copies", i)
			}
		}
		var ops kpngv1.Batch
		if err := proto.Unmarshal(s.batches[len(s.batches)-1][0].ReadOnlyData(), &ops); err != nil || len(ops.GetOps()) != 1 || ops.GetOps()[0].GetSync() == nil {
			t.Fatalf("last batch %v (%v), want one sync", &ops, err)
		}
	}
	check(s1)
	// Which batches hold which service, by its name in the bytes.
	holding := func(s *snapshot, name string) int {
		for i, m := range s.batches {
			if strings.Contains(string(m[0].ReadOnlyData()), name) {
				return i
			}
		}
		return -1
	}
	shared := func(a, b *snapshot) (n int) {
		for _, x := range a.batches {
			for _, y := range b.batches {
				if &x[0].ReadOnlyData()[0] == &y[0].ReadOnlyData()[0] {
					n++
				}
			}
		}
		return n
	}
	changed := holding(s1, "s1000")

	h.Update(model.ServiceKey{Namespace: "ns", Name: "s1000"}, nil, internalSvc("s1000", strings.Repeat("y", 300)))
	_ = h.Sync()
	s2 := snapshotNow()
	check(s2)
	if s1 == s2 {
		t.Fatal("one snapshot for two states")
	}
	if n, want := shared(s1, s2), len(s1.batches)-2; n != want { // the changed one and the sync
		t.Errorf("%d batches shared after one service changed, want %d (all but batch %d and the sync)", n, want, changed)
	}
	if i := holding(s2, "s1000"); i < 0 || &s2.batches[i][0].ReadOnlyData()[0] == &s1.batches[changed][0].ReadOnlyData()[0] {
		t.Errorf("the changed service's batch %d shared with the older snapshot", i)
	}

	h.Update(model.ServiceKey{Namespace: "ns", Name: "s0500a"}, nil, internalSvc("s0500a", "z"))
	h.Update(model.ServiceKey{Namespace: "ns", Name: "s1500"}, nil, nil)
	_ = h.Sync()
	s3 := snapshotNow()
	check(s3)
	if n, want := shared(s2, s3), len(s2.batches)-3; n != want { // the two changed and the sync
		t.Errorf("%d batches shared after a service added and one removed, want %d", n, want)
	}
}

// TestNextSharedHandsOutTheLogInParts: a stream behind by more than
// maxSendBytes of rounds is handed them in parts, each ending a round, and
// signaled to come back for the rest; together they are every round, in
// order.
func TestNextSharedHandsOutTheLogInParts(t *testing.T) {
	h := NewHub(true)
	_ = h.Sync()
	sub := h.subscribe("node-a", true, false, nil)
	first := h.nextShared(sub)
	if len(first) == 0 {
		t.Fatal("no first state")
	}
	big := strings.Repeat("x", 500<<10)
	const rounds = 20 // 10 MB: more than twice maxSendBytes
	for i := range rounds {
		h.Update(model.ServiceKey{Namespace: "ns", Name: "a"}, nil, internalSvc("a", fmt.Sprintf("%s%d", big, i)))
		_ = h.Sync()
	}
	<-sub.notify
	var parts, got int
	for sub.cursor < h.gen {
		msgs := h.nextShared(sub)
		size := 0
		for _, m := range msgs {
			size += m.size()
		}
		if size > maxSendBytes+600<<10 {
			t.Errorf("part %d: %d bytes, want at most %d and one round", parts, size, maxSendBytes)
		}
		parts++
		got += len(msgs)
		if sub.cursor < h.gen {
			select {
			case <-sub.notify:
			default:
				t.Fatalf("part %d: the stream is behind (round %d of %d) and was not signaled", parts, sub.cursor, h.gen)
			}
		}
	}
	if parts < 3 {
		t.Errorf("%d parts for %d rounds of 500 KiB, want at least 3", parts, rounds)
	}
	if got < rounds {
		t.Errorf("%d messages for %d rounds", got, rounds)
	}
}
