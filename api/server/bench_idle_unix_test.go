//go:build unix

package server_test

import (
	"context"
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"

	"sigs.k8s.io/kpng/api/kpngv1"
	"sigs.k8s.io/kpng/api/server"
	"sigs.k8s.io/kpng/localsink"
)

// BenchmarkIdleBackends5000 measures what 5,000 connected backends cost
// the controller when nothing changes: the CPU of this process (the
// controller and the backends, which do nothing while no batch comes)
// over 10 s, starting 2 s after all hold their first state, a state of 100 services.
// It needs 10,000 open files (ulimit -n).
func BenchmarkIdleBackends5000(b *testing.B) {
	for range b.N {
		idle(b, 100, 5000, 10*time.Second)
	}
}

func idle(b *testing.B, services, backends int, window time.Duration) {
	hub := server.NewHub(true)
	localsink.FromFullState(hub)(fanoutState(services, backends))
	target, dopts, stop := serveHub(b, hub, server.Options{MaxStreamsPerNode: -1})
	defer stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	bks := make([]*backend, backends)
	for i := range bks {
		conn, err := grpc.NewClient(target, dopts...)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		bks[i] = watchBackend(ctx, b, kpngv1.NewControllerClient(conn), fmt.Sprintf("node-%d", i), true)
	}
	for _, bk := range bks {
		bk.waitSyncs(b, 1)
	}
	// The first states' garbage collected, then a quiet moment.
	runtime.GC()
	time.Sleep(2 * time.Second)
	cpu0 := processCPU(b)
	time.Sleep(window)
	b.ReportMetric(1000*(processCPU(b)-cpu0).Seconds()/window.Seconds(), "idle-cpu-ms/s")
}

// processCPU is this process's CPU time (user and system).
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
