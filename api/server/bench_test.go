package server_test

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"sigs.k8s.io/kpng/api/kpngv1"
	"sigs.k8s.io/kpng/api/server"
	"sigs.k8s.io/kpng/client/remote"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

// fanoutState is services × 10 endpoints, the endpoints spread over nodes
// node-0 … node-(nodes-1).
func fanoutState(services, nodes int) []*model.ServiceEndpoints {
	state := make([]*model.ServiceEndpoints, services)
	base := netip.MustParseAddr("10.128.0.0").As4()
	n := 0
	for i := range services {
		eps := make([]*model.Endpoint, 10)
		for j := range eps {
			a := base
			a[1] += byte(n >> 16)
			a[2] += byte(n >> 8)
			a[3] += byte(n)
			n++
			eps[j] = ep(netip.AddrFrom4(a).String(), fmt.Sprintf("node-%d", (i*10+j)%nodes))
		}
		slices.SortFunc(eps, model.CompareEndpoints)
		state[i] = svc(fmt.Sprintf("ns-%d", i/100), fmt.Sprintf("svc-%05d", i), eps...)
	}
	return state
}

// backend is one raw watch stream that records when it got its batches.
type backend struct {
	mu      sync.Mutex
	syncs   int
	bytes   int // bytes received since the last take
	lastAt  time.Time
	notify  chan struct{}
	stopped chan struct{}
}

func watchBackend(ctx context.Context, b *testing.B, client kpngv1.ControllerClient, node string, independent bool) *backend {
	stream, err := client.Watch(ctx, &kpngv1.WatchRequest{NodeName: node, NodeIndependent: independent})
	if err != nil {
		b.Fatal(err)
	}
	bk := &backend{notify: make(chan struct{}, 1), stopped: make(chan struct{})}
	go func() {
		defer close(bk.stopped)
		for {
			batch, err := stream.Recv()
			if err != nil {
				return
			}
			now := time.Now()
			bk.mu.Lock()
			bk.bytes += proto.Size(batch)
			if ops := batch.GetOps(); len(ops) > 0 && ops[len(ops)-1].GetSync() != nil {
				bk.syncs++
				bk.lastAt = now
			}
			bk.mu.Unlock()
			select {
			case bk.notify <- struct{}{}:
			default:
			}
		}
	}()
	return bk
}

func (bk *backend) waitSyncs(b *testing.B, n int) time.Time {
	deadline := time.After(10 * time.Minute)
	for {
		bk.mu.Lock()
		s, at := bk.syncs, bk.lastAt
		bk.mu.Unlock()
		if s >= n {
			return at
		}
		select {
		case <-bk.notify:
		case <-deadline:
			b.Fatalf("backend stuck at %d syncs, want %d", s, n)
		}
	}
}

func (bk *backend) takeBytes() int {
	bk.mu.Lock()
	defer bk.mu.Unlock()
	n := bk.bytes
	bk.bytes = 0
	return n
}

func heapMiB() float64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.HeapAlloc) / (1 << 20)
}

// BenchmarkFanout100Backends10k measures one controller serving 100
// backends (distinct nodes, loopback unix socket, in this process) a state
// of 10,000 services × 10 endpoints: the time until all hold the first
// state, then for single endpoint changes the bytes each backend receives
// and the latency until all have it, and the memory of the controller.
// Run with -benchtime=1x: each run does the whole measurement. The
// backends ask for their node's view computed by the controller (the
// protocol before node-independent streams); the Shared variants are the
// same with node-independent streams.
func BenchmarkFanout100Backends10k(b *testing.B) {
	for range b.N {
		fanout(b, 10000, 100, 50, false)
	}
}

// BenchmarkFanout100Backends10kShared is BenchmarkFanout100Backends10k with
// node-independent streams: the controller encodes the state and each
// change once for all the backends.
func BenchmarkFanout100Backends10kShared(b *testing.B) {
	for range b.N {
		fanout(b, 10000, 100, 50, true)
	}
}

// serveHub serves hub on a unix socket until stop is called and returns
// how to dial it.
func serveHub(b *testing.B, hub *server.Hub, opts server.Options) (target string, dopts []grpc.DialOption, stop func()) {
	addr := "unix://" + b.TempDir() + "/kpng.sock"
	lis, sopts, err := server.ListenConfig{Address: addr}.Listen()
	if err != nil {
		b.Fatal(err)
	}
	g := grpc.NewServer(sopts...)
	server.New(hub, opts).Register(g)
	go func() { _ = g.Serve(lis) }()
	target, dopts, err = remote.Config{Address: addr}.DialOptions()
	if err != nil {
		g.Stop()
		b.Fatal(err)
	}
	return target, dopts, g.Stop
}

func fanout(b *testing.B, services, backends, changes int, independent bool) {
	state := fanoutState(services, backends)
	heap0 := heapMiB()
	hub := server.NewHub(true)
	localsink.FromFullState(hub)(state)
	heapHub := heapMiB()

	target, dopts, stop := serveHub(b, hub, server.Options{})
	defer stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var bks []*backend
	start := time.Now()
	for i := range backends {
		conn, err := grpc.NewClient(target, dopts...)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		bks = append(bks, watchBackend(ctx, b, kpngv1.NewControllerClient(conn), fmt.Sprintf("node-%d", i), independent))
	}
	var firstBytes int
	for _, bk := range bks {
		bk.waitSyncs(b, 1)
		firstBytes += bk.takeBytes()
	}
	firstState := time.Since(start)
	heapAll := heapMiB()

	// Single endpoint changes: each flips the readiness of one endpoint of
	// one service, which every backend sees.
	var lat []time.Duration
	var bytesPer []int
	for c := range changes {
		i := (c * 7919) % len(state)
		se := state[i]
		changed := *se.Endpoints[c%10]
		changed.Ready = !changed.Ready
		next := &model.ServiceEndpoints{Service: se.Service, Endpoints: slices.Clone(se.Endpoints)}
		next.Endpoints[c%10] = &changed
		state[i] = next
		// What the watcher's Feeder does for one endpoint change.
		t0 := time.Now()
		hub.Update(se.Service.Key(), se, next)
		_ = hub.Sync()
		var last time.Time
		for _, bk := range bks {
			if at := bk.waitSyncs(b, 2+c); at.After(last) {
				last = at
			}
		}
		lat = append(lat, last.Sub(t0))
		for _, bk := range bks {
			bytesPer = append(bytesPer, bk.takeBytes())
		}
	}
	slices.Sort(lat)
	slices.Sort(bytesPer)
	b.ReportMetric(firstState.Seconds(), "first-state-all-s")
	b.ReportMetric(float64(firstBytes)/float64(backends)/(1<<20), "first-state-MiB/backend")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "change-all-median-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "change-all-p99-ms")
	b.ReportMetric(float64(bytesPer[len(bytesPer)/2]), "change-bytes/backend")
	b.ReportMetric(float64(bytesPer[len(bytesPer)-1]), "change-max-bytes/backend")
	b.ReportMetric(heapHub-heap0, "hub-heap-MiB")
	b.ReportMetric((heapAll-heapHub)/float64(backends), "heap-MiB/backend")
	runtime.KeepAlive(bks)
}

// BenchmarkFanout10Backends10k is the same with 10 backends.
func BenchmarkFanout10Backends10k(b *testing.B) {
	for range b.N {
		fanout(b, 10000, 10, 50, false)
	}
}

// BenchmarkFanout10Backends10kShared is the same with node-independent
// streams.
func BenchmarkFanout10Backends10kShared(b *testing.B) {
	for range b.N {
		fanout(b, 10000, 10, 50, true)
	}
}
