package watcher_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"sigs.k8s.io/kpng/client/watcher"
	"sigs.k8s.io/kpng/internal/controlplane"
	"sigs.k8s.io/kpng/internal/kubetest"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

const (
	realServices             = 10_000
	realEndpointsPerService  = 10
	realPopulateWorkers      = 8
	realChanges              = 50
	realNodeName             = "node-a"
	realFirstStateTimeout    = 5 * time.Minute
	realChangeTimeout        = 30 * time.Second
	realQuietBetweenChanges  = 2 * watcher.DefaultMinSyncInterval
	realWatcherStopTimeout   = 30 * time.Second
	realKpngJSONTimeoutLimit = 5 * time.Minute
)

// realPopulation is the API server's content for BenchmarkWatcherRealAPIServer10k,
// created once per test process.
var realPopulation struct {
	once      sync.Once
	err       error
	took      time.Duration
	ns        string
	proxyName string
	client    kubernetes.Interface // not rate-limited
	slices    []*discovery.EndpointSlice
}

// populateReal creates, once, realServices labelled ClusterIP services in a
// fresh namespace, each with one slice of realEndpointsPerService endpoints,
// one in five on realNodeName.
func populateReal(b *testing.B) {
	b.Helper()
	p := &realPopulation
	p.once.Do(func() {
		start := time.Now()
		cfg := cp.RESTConfig()
		cfg.QPS = -1 // no client-side rate limiting
		c, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			p.err = err
			return
		}
		p.client = c
		p.ns, p.proxyName = kubetest.UniqueName("bench10k"), kubetest.UniqueName("bench10k")
		if _, err := c.CoreV1().Namespaces().Create(context.Background(),
			&v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: p.ns}}, metav1.CreateOptions{}); err != nil {
			p.err = err
			return
		}
		p.slices = make([]*discovery.EndpointSlice, realServices)

		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		jobs := make(chan int)
		errs := make(chan error, realPopulateWorkers)
		var wg sync.WaitGroup
		for range realPopulateWorkers {
			wg.Go(func() {
				for i := range jobs {
					if err := createReal(ctx, c, p.ns, p.proxyName, i); err != nil {
						errs <- err
						cancel()
						return
					}
				}
			})
		}
	feed:
		for i := range realServices {
			select {
			case jobs <- i:
			case <-ctx.Done():
				break feed
			}
		}
		close(jobs)
		wg.Wait()
		close(errs)
		p.err = <-errs
		p.took = time.Since(start)
	})
	if p.err != nil {
		b.Fatalf("populating the API server: %v", p.err)
	}
}

func createReal(ctx context.Context, c kubernetes.Interface, ns, proxyName string, i int) error {
	svc, err := c.CoreV1().Services(ns).Create(ctx, kubetest.Service(ns, fmt.Sprintf("svc-%05d", i), proxyName), metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create service %d: %w", i, err)
	}
	eps := make([]kubetest.EP, realEndpointsPerService)
	for j := range eps {
		idx := i*realEndpointsPerService + j + 1
		eps[j] = kubetest.EP{
			IP:   fmt.Sprintf("10.%d.%d.%d", byte(idx>>16), byte(idx>>8), byte(idx)),
			Node: fmt.Sprintf("node-%c", 'a'+j%5),
			Zone: "zone-a",
		}
	}
	sl, err := c.DiscoveryV1().EndpointSlices(ns).Create(ctx, kubetest.Slice(svc, svc.Name+"-1", eps...), metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create endpointslice %d: %w", i, err)
	}
	realPopulation.slices[i] = sl
	return nil
}

// realRound is what the sink received between two Syncs.
type realRound struct {
	syncAt, fullAt time.Time
	setEndpoints   int
	others         int // every other call but Sync
	lastEndpoint   string
}

// realSink is an incremental sink that records the timing of the first
// state and of each later round, with a localsink.FullState inside it whose
// handler walks the whole state (as kpng's full-state Run does).
type realSink struct {
	full *localsink.FullState

	resetAt, firstSyncAt, firstFullAt time.Time
	firstServices, firstEndpoints     int
	firstState                        chan struct{} // closed after the first full state
	completeAt                        time.Time
	complete                          chan struct{} // closed after the first full state holding everything
	lastFullAt                        time.Time

	cur    realRound
	rounds chan realRound // rounds after the first
}

func newRealSink() *realSink {
	s := &realSink{firstState: make(chan struct{}), complete: make(chan struct{}), rounds: make(chan realRound, 10_000)}
	s.full = localsink.NewFullState(func(items []*model.ServiceEndpoints) {
		now := time.Now()
		s.lastFullAt = now
		endpoints := 0
		for _, se := range items {
			endpoints += len(se.Endpoints)
		}
		if s.firstFullAt.IsZero() {
			s.firstFullAt, s.firstServices, s.firstEndpoints = now, len(items), endpoints
		}
		if s.completeAt.IsZero() && len(items) == realServices && endpoints == realServices*realEndpointsPerService {
			s.completeAt = now
			close(s.complete)
		}
	})
	return s
}

func (s *realSink) Reset() {
	if s.resetAt.IsZero() {
		s.resetAt = time.Now()
	}
	s.cur.others++
	s.full.Reset()
}

func (s *realSink) Update(key model.ServiceKey, prev, cur *model.ServiceEndpoints) {
	removed, set := localsink.EndpointChanges(prev, cur)
	s.cur.setEndpoints += len(set)
	s.cur.others += len(removed)
	if cur == nil || prev == nil || prev.Service != cur.Service {
		s.cur.others++
	}
	if len(set) > 0 {
		s.cur.lastEndpoint = key.String() + " " + set[len(set)-1].Key()
	}
	s.full.Update(key, prev, cur)
}

func (s *realSink) Sync() error {
	now := time.Now()
	first := s.firstSyncAt.IsZero()
	if first {
		s.firstSyncAt = now
	}
	_ = s.full.Sync()
	r := s.cur
	r.syncAt, r.fullAt = now, s.lastFullAt
	s.cur = realRound{}
	if first {
		close(s.firstState)
		return nil
	}
	select {
	case s.rounds <- r:
	default: // nobody waits for that many rounds; drop
	}
	return nil
}

// BenchmarkWatcherRealAPIServer10k measures the watcher against the real
// kube-apiserver holding 10,000 selected services × 10 endpoints: the time
// to the first state, the memory holding it, the latency of one endpoint
// change, and the peak RSS of kpng-json delivering that state. The whole
// measurement runs once per call, whatever b.N: run it with -benchtime=1x.
func BenchmarkWatcherRealAPIServer10k(b *testing.B) {
	cp.Require(b)
	populateReal(b)
	b.ResetTimer() // before any ReportMetric: it clears them
	b.StopTimer()
	p := &realPopulation
	b.ReportMetric(p.took.Seconds(), "populate-s")

	client, err := kubernetes.NewForConfig(cp.RESTConfig())
	if err != nil {
		b.Fatal(err)
	}
	w, err := watcher.New(watcher.Config{Client: client, ServiceProxyName: p.proxyName, NodeName: realNodeName})
	if err != nil {
		b.Fatal(err)
	}
	heapBase := realHeap()
	rssBase := procStatusKiB(b, "VmRSS")
	b.ReportMetric(float64(rssBase)/1024, "rss-before-MiB")

	sink := newRealSink()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	b.StartTimer() // ns/op: from Run to the first complete state
	start := time.Now()
	go func() { done <- w.Run(ctx, sink) }()
	stop := func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				b.Errorf("watcher.Run: %v", err)
			}
		case <-time.After(realWatcherStopTimeout):
			b.Errorf("watcher.Run did not return %v after its context was cancelled", realWatcherStopTimeout)
		}
	}

	for _, ch := range []chan struct{}{sink.firstState, sink.complete} {
		select {
		case <-ch:
		case err := <-done:
			b.Fatalf("watcher.Run returned before the first complete state: %v", err)
		case <-time.After(realFirstStateTimeout):
			stop()
			b.Fatalf("no complete state after %v (first state: %d services, %d endpoints)",
				realFirstStateTimeout, sink.firstServices, sink.firstEndpoints)
		}
	}
	b.StopTimer()
	// The first state must be the whole state (see Run). Report what it
	// held, and the time until the state was complete.
	b.ReportMetric(float64(sink.firstServices), "first-state-services")
	b.ReportMetric(float64(sink.firstEndpoints), "first-state-endpoints")
	if sink.firstServices != realServices || sink.firstEndpoints != realServices*realEndpointsPerService {
		b.Logf("BUG: the first state after the informers synced held %d services and %d endpoints, not %d and %d; complete %v later",
			sink.firstServices, sink.firstEndpoints, realServices, realServices*realEndpointsPerService,
			sink.completeAt.Sub(sink.firstFullAt).Round(time.Millisecond))
	}
	b.ReportMetric(realMillis(sink.resetAt.Sub(start)), "start-to-synced-ms")
	b.ReportMetric(realMillis(sink.firstSyncAt.Sub(sink.resetAt)), "synced-to-first-sync-ms")
	b.ReportMetric(realMillis(sink.firstFullAt.Sub(sink.resetAt)), "synced-to-first-fullstate-ms")
	b.ReportMetric(realMillis(sink.completeAt.Sub(sink.resetAt)), "synced-to-complete-state-ms")
	b.ReportMetric(realMillis(sink.firstFullAt.Sub(start)), "start-to-first-state-ms")
	b.ReportMetric(realMillis(sink.completeAt.Sub(start)), "start-to-complete-state-ms")

	// Memory holding the state: the informer caches, the watcher's maps,
	// the Feeder and the FullState (with its built state), plus the
	// watcher's client. RSS is the whole test process, after returning
	// freed memory to the OS.
	b.ReportMetric(float64(realHeap()-heapBase)/(1<<20), "heap-MiB")
	debug.FreeOSMemory()
	b.ReportMetric(float64(procStatusKiB(b, "VmRSS"))/1024, "rss-MiB")

	// Let the rounds that completed the state pass.
	time.Sleep(realQuietBetweenChanges)
	for len(sink.rounds) > 0 {
		<-sink.rounds
	}

	// One endpoint change at a time, each after a quiet period so that
	// MinSyncInterval does not delay it.
	var fromReturn, fromStart, fullFromReturn []time.Duration
	for c := range realChanges {
		k, j := (c*197)%realServices, c%realEndpointsPerService
		next := p.slices[k].DeepCopy()
		cond := &next.Endpoints[j].Conditions
		ready := !*cond.Ready
		cond.Ready = &ready
		want := fmt.Sprintf("%s/%s %s", next.Namespace, next.Labels[discovery.LabelServiceName], next.Endpoints[j].Addresses[0])
		time.Sleep(realQuietBetweenChanges)
	drain:
		for {
			select {
			case r := <-sink.rounds:
				if r.setEndpoints+r.others != 0 {
					stop()
					b.Fatalf("before change %d: unexpected round with %d SetEndpoint and %d other calls", c, r.setEndpoints, r.others)
				}
			default:
				break drain
			}
		}

		t0 := time.Now()
		updated, err := p.client.DiscoveryV1().EndpointSlices(next.Namespace).Update(context.Background(), next, metav1.UpdateOptions{})
		t1 := time.Now()
		if err != nil {
			stop()
			b.Fatalf("change %d: update endpointslice: %v", c, err)
		}
		p.slices[k] = updated

		var r realRound
	wait:
		for {
			select {
			case r = <-sink.rounds:
				if r.setEndpoints+r.others != 0 {
					break wait
				}
			case <-time.After(realChangeTimeout):
				stop()
				b.Fatalf("change %d: no round within %v", c, realChangeTimeout)
			}
		}
		if r.setEndpoints != 1 || r.others != 0 || r.lastEndpoint != want {
			stop()
			b.Fatalf("change %d: round had %d SetEndpoint (last %q) and %d other calls; want exactly SetEndpoint %q",
				c, r.setEndpoints, r.lastEndpoint, r.others, want)
		}
		fromReturn = append(fromReturn, r.syncAt.Sub(t1))
		fromStart = append(fromStart, r.syncAt.Sub(t0))
		fullFromReturn = append(fullFromReturn, r.fullAt.Sub(t1))
	}
	stop()
	for _, m := range []struct {
		name string
		lat  []time.Duration
	}{
		{"change-from-write-return", fromReturn},
		{"change-from-write-start", fromStart},
		{"change-fullstate", fullFromReturn},
	} {
		slices.Sort(m.lat)
		b.ReportMetric(realMillis(realPercentile(m.lat, 50)), m.name+"-median-ms")
		b.ReportMetric(realMillis(realPercentile(m.lat, 99)), m.name+"-p99-ms")
	}

	kpngJSON(b, p.proxyName)
}

// kpngJSON builds examples/json and runs it against the populated API
// server twice: with --once, as documented, then without it, stopped with
// SIGTERM once it has printed a complete state of all the services (which
// --once should already do). It reports each run's peak RSS and wall time.
func kpngJSON(b *testing.B, proxyName string) {
	b.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		b.Fatal(err)
	}
	bin := filepath.Join(b.TempDir(), "kpng-json")
	build := exec.Command("go", "build", "-o", bin, "./examples/json")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("go build ./examples/json: %v\n%s", err, out)
	}
	args := []string{"--kubeconfig=" + cp.KubeconfigPath(), "--service-proxy-name=" + proxyName, "--node-name=" + realNodeName}

	once := runKpngJSON(b, bin, append(args, "--once"), false)
	b.ReportMetric(float64(once.firstServices), "kpng-json-once-services")
	b.ReportMetric(float64(once.firstEndpoints), "kpng-json-once-endpoints")
	b.ReportMetric(once.peakRSSMiB, "kpng-json-once-peak-rss-MiB")
	b.ReportMetric(realMillis(once.wall), "kpng-json-once-wall-ms")
	if once.firstServices != realServices || once.firstEndpoints != realServices*realEndpointsPerService {
		b.Logf("BUG: kpng-json --once printed %d services and %d endpoints, not %d and %d",
			once.firstServices, once.firstEndpoints, realServices, realServices*realEndpointsPerService)
	}

	full := runKpngJSON(b, bin, args, true)
	b.ReportMetric(full.peakRSSMiB, "kpng-json-peak-rss-MiB")
	b.ReportMetric(realMillis(full.complete), "kpng-json-complete-ms")
}

func realMillis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// kpngJSONRun is the outcome of one run of kpng-json.
type kpngJSONRun struct {
	firstServices, firstEndpoints int           // in the first state printed
	complete                      time.Duration // from the start to the end of the first complete state
	wall                          time.Duration // from the start to the exit
	peakRSSMiB                    float64
}

// runKpngJSON runs kpng-json with args and reads the states it prints: each
// starts with service svc-00000, and each endpoint has a NodeName. With
// stopWhenComplete, it sends SIGTERM once a state of all the services and
// endpoints has been printed.
//
// The peak RSS is the child's VmHWM, polled from /proc/<pid>/status: the
// Maxrss of its rusage is useless here, because Go starts children with
// CLONE_VM|CLONE_VFORK and Linux then folds the parent's (this test
// process's) RSS high-water mark into the child's maxrss at exec.
func runKpngJSON(b *testing.B, bin string, args []string, stopWhenComplete bool) kpngJSONRun {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), realKpngJSONTimeoutLimit)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	var run kpngJSONRun
	start := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}

	hwm := pollPeakRSS(cmd.Process.Pid)

	const first, last = `"Name":"svc-00000"`, `"Name":"svc-09999"`
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	states, services, endpoints := 0, 0, 0
	for sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, first) {
			if states == 1 {
				run.firstServices, run.firstEndpoints = services, endpoints
			}
			states++
			services, endpoints = 0, 0
		}
		services++
		endpoints += strings.Count(line, `"NodeName":`)
		if strings.Contains(line, last) && run.complete == 0 &&
			services == realServices && endpoints == realServices*realEndpointsPerService {
			run.complete = time.Since(start)
			if stopWhenComplete {
				hwm.poll()
				if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	if states == 1 {
		run.firstServices, run.firstEndpoints = services, endpoints
	}
	err = cmd.Wait()
	run.wall = time.Since(start)
	peak := hwm.stop()
	if err != nil {
		b.Fatalf("kpng-json %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	if stopWhenComplete && run.complete == 0 {
		b.Fatalf("kpng-json %s exited without printing a complete state", strings.Join(args, " "))
	}
	run.peakRSSMiB = float64(peak) / 1024
	return run
}

// peakRSS polls the VmHWM of a process every 2 ms, from
// /proc/<pid>/status, keeping the largest value read.
type peakRSS struct {
	status  string
	kib     atomic.Int64
	done    chan struct{}
	polling sync.WaitGroup
}

// pollPeakRSS starts polling the VmHWM of process pid.
func pollPeakRSS(pid int) *peakRSS {
	p := &peakRSS{status: fmt.Sprintf("/proc/%d/status", pid), done: make(chan struct{})}
	p.polling.Go(func() {
		t := time.NewTicker(2 * time.Millisecond)
		defer t.Stop()
		for {
			p.poll()
			select {
			case <-p.done:
				return
			case <-t.C:
			}
		}
	})
	return p
}

// poll reads the VmHWM once.
func (p *peakRSS) poll() {
	if n, err := statusKiB(p.status, "VmHWM"); err == nil && n > p.kib.Load() {
		p.kib.Store(n)
	}
}

// stop stops polling and returns the largest VmHWM read, in KiB.
func (p *peakRSS) stop() int64 {
	close(p.done)
	p.polling.Wait()
	return p.kib.Load()
}

// realHeap returns the live heap after a collection.
func realHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// procStatusKiB returns a "<field>: <n> kB" line of /proc/self/status.
func procStatusKiB(b *testing.B, field string) int64 {
	b.Helper()
	n, err := statusKiB("/proc/self/status", field)
	if err != nil {
		b.Fatalf("reading this process's memory: %v", err)
	}
	return n
}

// statusKiB returns a "<field>: <n> kB" line of a /proc/<pid>/status file.
func statusKiB(path, field string) (int64, error) {
	data, err := readProcFile(path)
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(data) {
		name, rest, ok := strings.Cut(line, ":")
		if !ok || name != field {
			continue
		}
		return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
	}
	return 0, fmt.Errorf("no %s in %s", field, path)
}

// readProcFile returns the content of a /proc file.
func readProcFile(path string) (string, error) {
	data, err := os.ReadFile(path)
	return string(data), err
}

// realPercentile returns the p-th percentile of sorted (nearest rank).
func realPercentile(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := (p*len(sorted) + 99) / 100
	return sorted[max(rank, 1)-1]
}
