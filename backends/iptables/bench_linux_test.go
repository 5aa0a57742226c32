//go:build linux

package iptables

import (
	"context"
	"fmt"
	"testing"

	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/model"
)

// benchState returns n single-stack services with one TCP port and eps
// endpoints each, as the side-by-side with kube-proxy loads them
// (hack/bench-iptables.sh): the sink's CPU work without the binaries.
func benchState(n, eps int) []*model.ServiceEndpoints {
	out := make([]*model.ServiceEndpoints, n)
	for i := range n {
		s := svc(fmt.Sprintf("s%05d", i), ipset(fmt.Sprintf("10.96.%d.%d", i/250, 1+i%250)), port(model.TCP, 80, 8080))
		se := &model.ServiceEndpoints{Service: s}
		for e := range eps {
			se.Endpoints = append(se.Endpoints, ep(fmt.Sprintf("10.%d.%d.%d", 1+i/250, i%250, 1+e), false))
		}
		out[i] = se
	}
	return out
}

// countingRunner counts the bytes handed to each binary, and runs
// nothing.
type countingRunner struct{ bytes int }

// Run implements Runner.
func (r *countingRunner) Run(_ context.Context, _ string, _ []string, stdin []byte) ([]byte, error) {
	r.bytes += len(stdin)
	return nil, nil
}

// BenchmarkSinkCPU measures the sink's own work at 10,000 services × 10
// endpoints, the binaries left out (a runner that only counts bytes):
// the first, full, Sync, and a Sync after one endpoint change (re-plans
// one service, writes one chain). bytes/op is the restore input.
func BenchmarkSinkCPU(b *testing.B) {
	state := benchState(10000, 10)
	newFilled := func() (*Sink, *countingRunner) {
		r := &countingRunner{}
		s := newSink(context.Background(), Config{ServiceProxyName: "bench", Runner: r}, VariantLegacy, &fakeJumper{})
		for _, se := range state {
			s.Update(se.Service.Key(), nil, se)
		}
		return s, r
	}
	b.Run("full", func(b *testing.B) {
		var bytes int
		for b.Loop() {
			s, r := newFilled()
			if err := s.Sync(); err != nil {
				b.Fatal(err)
			}
			bytes = r.bytes
		}
		b.ReportMetric(float64(bytes), "restore-bytes/op")
	})
	b.Run("one-endpoint", func(b *testing.B) {
		s, r := newFilled()
		if err := s.Sync(); err != nil {
			b.Fatal(err)
		}
		se := state[5000]
		moved := &model.ServiceEndpoints{Service: se.Service, Endpoints: append([]*model.Endpoint{}, se.Endpoints...)}
		alt := ep("10.200.0.1", false)
		cur := se
		r.bytes = 0
		n := 0
		for b.Loop() {
			next := moved
			if n%2 == 1 {
				next = se
			} else {
				moved.Endpoints[0] = alt
			}
			s.Update(se.Service.Key(), cur, next)
			if err := s.Sync(); err != nil {
				b.Fatal(err)
			}
			cur = next
			n++
		}
		b.ReportMetric(float64(r.bytes)/float64(n), "restore-bytes/op")
	})
}

// BenchmarkKernelSync measures, with each variant, the first Sync of
// 10,000 services × 10 endpoints into a fresh network namespace (listing,
// restores and jumps) and a Sync after one endpoint change: the real
// binaries and kernel, without the watcher (the side by side with
// kube-proxy, hack/bench-iptables.sh, adds it).
func BenchmarkKernelSync(b *testing.B) {
	netns.RequirePrivileged(b)
	state := benchState(10000, 10)
	for _, variant := range []string{VariantLegacy, VariantNFT} {
		b.Run(variant+"/full", func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				ns := netns.New(b, "ipt-bench")
				s, err := New(context.Background(), Config{ServiceProxyName: "bench", NetNS: ns.Path(), Variant: variant})
				if err != nil {
					b.Fatal(err)
				}
				for _, se := range state {
					s.Update(se.Service.Key(), nil, se)
				}
				b.StartTimer()
				if err := s.Sync(); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(variant+"/one-endpoint", func(b *testing.B) {
			ns := netns.New(b, "ipt-bench")
			s, err := New(context.Background(), Config{ServiceProxyName: "bench", NetNS: ns.Path(), Variant: variant})
			if err != nil {
				b.Fatal(err)
			}
			for _, se := range state {
				s.Update(se.Service.Key(), nil, se)
			}
			if err := s.Sync(); err != nil {
				b.Fatal(err)
			}
			se := state[5000]
			moved := &model.ServiceEndpoints{Service: se.Service, Endpoints: append([]*model.Endpoint{ep("10.200.0.1", false)}, se.Endpoints[1:]...)}
			cur, next := se, moved
			for b.Loop() {
				s.Update(se.Service.Key(), cur, next)
				if err := s.Sync(); err != nil {
					b.Fatal(err)
				}
				cur, next = next, cur
			}
		})
	}
}
