package server

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"sigs.k8s.io/kpng/api/kpngv1"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

// snapshotHub is a hub holding services × 10 endpoints over 5,000 nodes,
// as make scale-controller loads them, with its snapshot built.
func snapshotHub(b *testing.B, services int) (*Hub, *snapshot) {
	b.Helper()
	state := make([]*model.ServiceEndpoints, services)
	for i := range state {
		se := &model.ServiceEndpoints{Service: &model.Service{Namespace: "scale", Name: fmt.Sprintf("s%05d", i), Type: "ClusterIP",
			IPs:   model.ServiceIPs{ClusterIPs: model.IPSet{V4: []string{netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}).String()}}},
			Ports: []*model.PortMapping{{Name: "http", Protocol: model.TCP, Port: 80, TargetPort: 8080}}}}
		for e := range 10 {
			n := i*10 + e
			se.Endpoints = append(se.Endpoints, &model.Endpoint{IPs: model.IPSet{V4: []string{netip.AddrFrom4([4]byte{10, byte(n >> 16), byte(n >> 8), byte(n)}).String()}},
				NodeName: fmt.Sprintf("node-%05d", n%5000), Ready: true, Serving: true})
		}
		slices.SortFunc(se.Endpoints, model.CompareEndpoints)
		state[i] = se
	}
	h := NewHub(true)
	localsink.FromFullState(h)(state)
	h.mu.RLock()
	defer h.mu.RUnlock()
	return h, h.snapshotLocked()
}

// BenchmarkDeflateSnapshot10k is the controller's part: compressing the
// batches of a snapshot of 10,000 services × 10 endpoints, once for every
// stream that takes deflated operations.
func BenchmarkDeflateSnapshot10k(b *testing.B) {
	h, snap := snapshotHub(b, 10000)
	var plain, deflated int
	for b.Loop() {
		h.snapMu.Lock()
		h.deflatedCopies, snap.deflated = nil, nil
		h.snapMu.Unlock()
		out := h.deflated(snap)
		plain, deflated = 0, 0
		for _, m := range snap.batches {
			plain += m.size()
		}
		for _, m := range out {
			deflated += m.size()
		}
	}
	b.ReportMetric(float64(plain), "bytes")
	b.ReportMetric(float64(deflated), "deflated-bytes")
}

// BenchmarkInflateFirstState10k is a backend's part: decoding the
// deflated batches of that first state (Batch.Inflate) against decoding
// the same batches sent as they are.
func BenchmarkInflateFirstState10k(b *testing.B) {
	h, snap := snapshotHub(b, 10000)
	deflated := h.deflated(snap)
	for _, bc := range []struct {
		name    string
		batches []message
	}{{"plain", snap.batches}, {"deflated", deflated}} {
		encoded := make([][]byte, len(bc.batches))
		for i, m := range bc.batches {
			encoded[i] = mem.BufferSlice(m).Materialize()
		}
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				ops := 0
				for _, data := range encoded {
					var batch kpngv1.Batch
					if err := proto.Unmarshal(data, &batch); err != nil {
						b.Fatal(err)
					}
					if err := batch.Inflate(); err != nil {
						b.Fatal(err)
					}
					ops += len(batch.Ops)
				}
				if ops != 10000*11+1 {
					b.Fatalf("%d operations, want %d", ops, 10000*11+1)
				}
			}
		})
	}
}
