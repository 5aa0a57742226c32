package watcher

import (
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"

	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

// These benchmarks drive the watcher through its informer event handlers
// (onService, onSlice) and deliver, exactly what Run does once the informers
// have synced, without an API server. See docs/benchmarks.md.

const (
	benchEndpointsPerService = 10
	benchNamespaces          = 100
	benchNodeName            = "node-a"
	benchProxyName           = "bench"
)

// benchSizes are the numbers of services the benchmarks run with.
var benchSizes = []int{1_000, 10_000}

func benchPtr[T any](v T) *T { return &v }

// benchService returns service i: a ClusterIP service with a cluster IP and
// one TCP port, as the API server stores it.
func benchService(i int) *v1.Service {
	ip := netip.AddrFrom4([4]byte{10, 96, byte((i + 1) >> 8), byte(i + 1)}).String()
	name := fmt.Sprintf("svc-%05d", i)
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:       fmt.Sprintf("ns-%02d", i%benchNamespaces),
			Name:            name,
			UID:             types.UID(fmt.Sprintf("00000000-0000-0000-0000-%012d", i)),
			ResourceVersion: strconv.Itoa(1000 + 2*i),
			Labels:          map[string]string{ServiceProxyNameLabel: benchProxyName, "app": name},
		},
		Spec: v1.ServiceSpec{
			Type:                  v1.ServiceTypeClusterIP,
			ClusterIP:             ip,
			ClusterIPs:            []string{ip},
			IPFamilies:            []v1.IPFamily{v1.IPv4Protocol},
			IPFamilyPolicy:        benchPtr(v1.IPFamilyPolicySingleStack),
			Selector:              map[string]string{"app": name},
			SessionAffinity:       v1.ServiceAffinityNone,
			InternalTrafficPolicy: benchPtr(v1.ServiceInternalTrafficPolicyCluster),
			Ports: []v1.ServicePort{{
				Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080),
			}},
		},
	}
}

// benchSlice returns the EndpointSlice of service i, as the EndpointSlice
// controller writes it: one IPv4 slice of benchEndpointsPerService ready
// endpoints, one in five on this node.
func benchSlice(svc *v1.Service, i int) *discovery.EndpointSlice {
	s := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:       svc.Namespace,
			Name:            fmt.Sprintf("%s-%05x", svc.Name, i),
			ResourceVersion: strconv.Itoa(1001 + 2*i),
			Labels: map[string]string{
				ServiceProxyNameLabel:      benchProxyName,
				"app":                      svc.Name,
				discovery.LabelServiceName: svc.Name,
				discovery.LabelManagedBy:   "endpointslice-controller.k8s.io",
			},
		},
		AddressType: discovery.AddressTypeIPv4,
		Ports: []discovery.EndpointPort{{
			Name: benchPtr("http"), Protocol: benchPtr(v1.ProtocolTCP), Port: benchPtr(int32(8080)),
		}},
	}
	for j := range benchEndpointsPerService {
		idx := i*benchEndpointsPerService + j + 1
		node := benchNodeName
		if j%5 != 0 {
			node = fmt.Sprintf("node-%c", 'b'+j%5)
		}
		s.Endpoints = append(s.Endpoints, discovery.Endpoint{
			Addresses: []string{netip.AddrFrom4([4]byte{10, byte(idx >> 16), byte(idx >> 8), byte(idx)}).String()},
			Conditions: discovery.EndpointConditions{
				Ready: benchPtr(true), Serving: benchPtr(true), Terminating: benchPtr(false),
			},
			NodeName:  benchPtr(node),
			Zone:      benchPtr("zone-a"),
			TargetRef: &v1.ObjectReference{Kind: "Pod", Namespace: svc.Namespace, Name: fmt.Sprintf("%s-pod-%d", svc.Name, j)},
		})
	}
	return s
}

// benchWatcher returns a watcher whose caches hold n services and their
// slices, fed through the informer event handlers, with every service dirty
// (as after the informers' initial list), and the slices it holds.
func benchWatcher(b *testing.B, n int) (*Watcher, []*discovery.EndpointSlice) {
	b.Helper()
	w, err := New(Config{Client: fake.NewSimpleClientset(), ServiceProxyName: benchProxyName, NodeName: benchNodeName})
	if err != nil {
		b.Fatal(err)
	}
	sl := make([]*discovery.EndpointSlice, n)
	for i := range n {
		svc := benchService(i)
		sl[i] = benchSlice(svc, i)
		w.onService(svc, false)
		w.onSlice(sl[i], false)
	}
	return w, sl
}

// benchMarkAllDirty makes the next deliver rebuild every service, as the
// first delivery after the informers synced does.
func benchMarkAllDirty(w *Watcher) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for key := range w.services {
		w.dirty[key] = struct{}{}
	}
}

// benchToggledSlice returns a copy of s with the Ready condition of endpoint j
// flipped and a new resource version: the object of an informer update event.
func benchToggledSlice(s *discovery.EndpointSlice, j, rv int) *discovery.EndpointSlice {
	next := s.DeepCopy()
	c := &next.Endpoints[j].Conditions
	c.Ready = benchPtr(!*c.Ready)
	next.ResourceVersion = strconv.Itoa(rv)
	return next
}

// benchCountingSink counts the calls of the current round and what they
// change (services set or deleted, endpoints set or deleted, as
// localsink.EndpointChanges tells), and records when Sync was called.
type benchCountingSink struct {
	resets, setServices, deleteServices, setEndpoints, deleteEndpoints, syncs int
	lastEndpoint                                                              string
	syncedAt                                                                  time.Time
}

func (c *benchCountingSink) Reset() { c.resets++ }
func (c *benchCountingSink) Update(key model.ServiceKey, prev, cur *model.ServiceEndpoints) {
	switch {
	case cur == nil:
		c.deleteServices++
	case prev == nil || prev.Service != cur.Service:
		c.setServices++
	}
	removed, set := localsink.EndpointChanges(prev, cur)
	c.deleteEndpoints += len(removed)
	c.setEndpoints += len(set)
	if len(set) > 0 {
		c.lastEndpoint = key.String() + " " + set[len(set)-1].Key()
	}
}
func (c *benchCountingSink) Sync() error {
	c.syncedAt = time.Now()
	c.syncs++
	return nil
}

func (c *benchCountingSink) String() string {
	return fmt.Sprintf("Reset×%d SetService×%d DeleteService×%d SetEndpoint×%d DeleteEndpoint×%d Sync×%d",
		c.resets, c.setServices, c.deleteServices, c.setEndpoints, c.deleteEndpoints, c.syncs)
}

// benchFullStateCounter is a full-state handler that walks the whole state, as
// any full-state backend must at least do, and counts it.
type benchFullStateCounter struct {
	calls, items, endpoints int
	calledAt                time.Time
}

func (f *benchFullStateCounter) handle(items []*model.ServiceEndpoints) {
	f.calledAt = time.Now()
	f.calls++
	f.items = len(items)
	f.endpoints = 0
	for _, se := range items {
		f.endpoints += len(se.Endpoints)
	}
}

// benchReportLatencies reports the median and 99th percentile of lat.
func benchReportLatencies(b *testing.B, lat []time.Duration) {
	b.Helper()
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(benchPercentile(lat, 50)), "median-ns")
	b.ReportMetric(float64(benchPercentile(lat, 99)), "p99-ns")
}

// benchPercentile returns the p-th percentile of sorted (nearest rank).
func benchPercentile(sorted []time.Duration, p int) time.Duration {
	rank := (p*len(sorted) + 99) / 100 // ceil(p/100 × n)
	return sorted[max(rank, 1)-1]
}

// benchHeapInUse returns the live heap after a collection.
func benchHeapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkEventToIncrementalSink measures one endpoint change, from the
// informer's update event (onSlice) to the incremental sink's Sync, with n
// services of 10 endpoints held: the work of one round of Run, without the
// MinSyncInterval coalescing wait. Each round must be exactly one Update
// setting one endpoint, and Sync.
func BenchmarkEventToIncrementalSink(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			base := benchHeapInUse()
			w, sl := benchWatcher(b, n)
			sink := &benchCountingSink{}
			d := localsink.NewFeeder(sink, localsink.FeederOptions{NoRetry: true})
			defer d.Close()
			w.deliver(d)
			if sink.setServices != n || sink.setEndpoints != n*benchEndpointsPerService || sink.syncs != 1 {
				b.Fatalf("initial delivery: %s, want %d services and %d endpoints", sink, n, n*benchEndpointsPerService)
			}
			// Reported after the loop: b.Loop's first call clears metrics.
			heap := float64(benchHeapInUse()-base) / (1 << 20)

			lat := make([]time.Duration, 0, max(b.N, 1000))
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				b.StopTimer()
				k, j := (i*7919)%n, i%benchEndpointsPerService
				next := benchToggledSlice(sl[k], j, 2_000_000+i)
				*sink = benchCountingSink{}
				b.StartTimer()

				start := time.Now()
				w.onSlice(next, false)
				w.deliver(d)
				lat = append(lat, sink.syncedAt.Sub(start))

				want := fmt.Sprintf("%s/%s %s", next.Namespace, next.Labels[discovery.LabelServiceName], next.Endpoints[j].Addresses[0])
				if sink.setEndpoints != 1 || sink.syncs != 1 || sink.resets+sink.setServices+sink.deleteServices+sink.deleteEndpoints != 0 || sink.lastEndpoint != want {
					b.Fatalf("change %d: got %s (last SetEndpoint %q), want exactly one endpoint set, %q, and Sync", i, sink, sink.lastEndpoint, want)
				}
				sl[k] = next
			}
			benchReportLatencies(b, lat)
			b.ReportMetric(heap, "heap-MiB")
		})
	}
}

// BenchmarkEventToFullStateCallback is BenchmarkEventToIncrementalSink with
// a localsink.FullState sink: the latency is up to the full-state handler's
// call, which receives all n services; ns/op includes the handler walking
// them. This is the full-state callback's per-change cost.
func BenchmarkEventToFullStateCallback(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			base := benchHeapInUse()
			w, sl := benchWatcher(b, n)
			h := &benchFullStateCounter{}
			d := localsink.NewFeeder(localsink.NewFullState(h.handle), localsink.FeederOptions{NoRetry: true})
			defer d.Close()
			w.deliver(d)
			if h.calls != 1 || h.items != n || h.endpoints != n*benchEndpointsPerService {
				b.Fatalf("initial delivery: %d calls, %d items, %d endpoints; want 1, %d, %d", h.calls, h.items, h.endpoints, n, n*benchEndpointsPerService)
			}
			// Reported after the loop: b.Loop's first call clears metrics.
			heap := float64(benchHeapInUse()-base) / (1 << 20)

			lat := make([]time.Duration, 0, max(b.N, 1000))
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				b.StopTimer()
				k, j := (i*7919)%n, i%benchEndpointsPerService
				next := benchToggledSlice(sl[k], j, 2_000_000+i)
				h.calls = 0
				b.StartTimer()

				start := time.Now()
				w.onSlice(next, false)
				w.deliver(d)
				lat = append(lat, h.calledAt.Sub(start))

				if h.calls != 1 || h.items != n || h.endpoints != n*benchEndpointsPerService {
					b.Fatalf("change %d: %d handler calls with %d items and %d endpoints; want 1 call with %d and %d",
						i, h.calls, h.items, h.endpoints, n, n*benchEndpointsPerService)
				}
				sl[k] = next
			}
			benchReportLatencies(b, lat)
			b.ReportMetric(heap, "heap-MiB")
		})
	}
}

// BenchmarkInitialDeliver measures the first delivery after the informers
// synced: Reset, then the whole state of n services × 10 endpoints built and
// sent to a new sink, then Sync; for the full-state sink, up to the return
// of the handler's call.
func BenchmarkInitialDeliver(b *testing.B) {
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			w, _ := benchWatcher(b, n)
			b.Run("sink=incremental", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					b.StopTimer()
					benchMarkAllDirty(w)
					sink := &benchCountingSink{}
					d := localsink.NewFeeder(sink, localsink.FeederOptions{NoRetry: true})
					b.StartTimer()

					w.deliver(d)
					d.Close()

					if sink.resets != 1 || sink.setServices != n || sink.setEndpoints != n*benchEndpointsPerService ||
						sink.syncs != 1 || sink.deleteServices+sink.deleteEndpoints != 0 {
						b.Fatalf("got %s, want Reset, %d services and %d endpoints set, Sync", sink, n, n*benchEndpointsPerService)
					}
				}
			})
			b.Run("sink=fullstate", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					b.StopTimer()
					benchMarkAllDirty(w)
					h := &benchFullStateCounter{}
					d := localsink.NewFeeder(localsink.NewFullState(h.handle), localsink.FeederOptions{NoRetry: true})
					b.StartTimer()

					w.deliver(d)
					d.Close()

					if h.calls != 1 || h.items != n || h.endpoints != n*benchEndpointsPerService {
						b.Fatalf("%d handler calls with %d items and %d endpoints; want 1 call with %d and %d",
							h.calls, h.items, h.endpoints, n, n*benchEndpointsPerService)
					}
				}
			})
		})
	}
}
