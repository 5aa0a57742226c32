package server

import (
	"fmt"
	"strings"
	"testing"

	"sigs.k8s.io/kpng/model"
)

func internalSvc(name, label string) *model.ServiceEndpoints {
	return &model.ServiceEndpoints{
		Service: &model.Service{Namespace: "ns", Name: name, Type: "ClusterIP", Labels: map[string]string{"l": label},
			IPs: model.ServiceIPs{ClusterIPs: model.IPSet{V4: []string{"10.96.0.1"}}}, Ports: []*model.PortMapping{{Protocol: model.TCP, Port: 80, TargetPort: 8080}}},
		Endpoints: []*model.Endpoint{{IPs: model.IPSet{V4: []string{"10.0.0.1"}}, Ready: true, NodeName: "node-a"}},
	}
}

// TestSnapshotsReferenceTheServicesEncodings: a snapshot does not copy the
// services' encodings: two snapshots of states that differ in one service
// hold the same bytes for the others, so that streams still sending older
// snapshots cost references, not copies of the state.
func TestSnapshotsReferenceTheServicesEncodings(t *testing.T) {
	h := NewHub(true)
	h.Update(model.ServiceKey{Namespace: "ns", Name: "a"}, nil, internalSvc("a", "1"))
	h.Update(model.ServiceKey{Namespace: "ns", Name: "b"}, nil, internalSvc("b", "1"))
	_ = h.Sync()
	h.mu.RLock()
	s1 := h.snapshotLocked()
	h.mu.RUnlock()
	h.Update(model.ServiceKey{Namespace: "ns", Name: "b"}, nil, internalSvc("b", "2"))
	_ = h.Sync()
	h.mu.RLock()
	s2 := h.snapshotLocked()
	h.mu.RUnlock()
	if s1 == s2 {
		t.Fatal("one snapshot for two states")
	}
	a1, a2 := s1.batches[0][0].ReadOnlyData(), s2.batches[0][0].ReadOnlyData()
	if len(a1) == 0 || &a1[0] != &a2[0] {
		t.Errorf("service a's encoding copied into each snapshot, want it referenced")
	}
	if b1, b2 := s1.batches[0][1].ReadOnlyData(), s2.batches[0][1].ReadOnlyData(); &b1[0] == &b2[0] {
		t.Errorf("service b's changed encoding shared by both snapshots")
	}
}

// TestNextSharedHandsOutTheLogInParts: a stream behind by more than
// maxSendBytes of rounds is handed them in parts, each ending a round, and
// signaled to come back for the rest; together they are every round, in
// order.
func TestNextSharedHandsOutTheLogInParts(t *testing.T) {
	h := NewHub(true)
	_ = h.Sync()
	sub := h.subscribe("node-a", true, nil)
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
