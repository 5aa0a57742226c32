//go:build linux

// Command kpng-soak runs `kpng kube … to-local to-nft` against the test
// control plane (a real kube-apiserver and etcd) under continuous churn
// for a long time, and reports whether the process stays flat: it loads
// --services Services of --endpoints endpoints each, starts kpng
// (programming a network namespace of its own, serving its metrics on
// loopback), then for --duration changes the API objects at --rate
// changes a second: EndpointSlices whose endpoints flap between ready,
// serving-terminating and gone, Services deleted and added. Every
// --sample it scrapes kpng's metrics (heap, goroutines, open files, RSS,
// the network programming latency and sync duration histograms) and reads
// its RSS from /proc. At the end it stops the churn, waits for kpng to
// apply the last change, starts a second kpng on the same objects in a
// fresh namespace and compares the two tables with the nft backend's
// kernel-state reader (compareTables of backends/nft's tests, run
// from its compiled test binary, --compare-test).
//
// It writes, in --out: samples.csv (one row a sample), windows.csv (per
// --window: the medians of the gauges, the latency percentiles),
// summary.md (the same as a table, first window against last, and the
// comparison's result) and kpng's logs. It exits non-zero when a gauge
// grew past the limits (--max-growth for the heap goal and RSS,
// --max-extra for goroutines and open files, last window's median against
// the first's; the allocated heap is reported, not judged),
// when kpng failed a round, or when the tables differ.
//
// hack/soak.sh builds kpng, this program and the test binary, and runs it
// as root; docs/reliability.md records the results.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"sigs.k8s.io/kpng/internal/controlplane"
	"sigs.k8s.io/kpng/internal/kubetest"
)

// config is the command line.
type config struct {
	kpng, compareTest string
	out               string
	services          int
	endpoints         int
	duration          time.Duration
	rate              float64
	sample, window    time.Duration
	coldTimeout       time.Duration
	seed              uint64
	maxGrowth         float64
	maxExtra          float64
}

func main() {
	var cfg config
	flag.StringVar(&cfg.kpng, "kpng", "", "the kpng binary")
	flag.StringVar(&cfg.compareTest, "compare-test", "", "the test binary of backends/nft (go test -c): compares the soaked table with a fresh one; empty: not compared")
	flag.StringVar(&cfg.out, "out", "soak-out", "the directory of the results and logs")
	flag.IntVar(&cfg.services, "services", 10000, "services loaded before the churn (the churn keeps their number about even)")
	flag.IntVar(&cfg.endpoints, "endpoints", 10, "endpoints per service")
	flag.DurationVar(&cfg.duration, "duration", time.Hour, "how long the churn runs")
	flag.Float64Var(&cfg.rate, "rate", 15, "API changes a second: 90% EndpointSlice updates, 5% services deleted, 5% added")
	flag.DurationVar(&cfg.sample, "sample", 10*time.Second, "time between two samples")
	flag.DurationVar(&cfg.window, "window", 10*time.Minute, "the windows of the summary (first against last)")
	flag.DurationVar(&cfg.coldTimeout, "cold-timeout", 10*time.Minute, "how long kpng may take to apply the loaded state")
	flag.Uint64Var(&cfg.seed, "seed", 1, "the seed of the churn")
	flag.Float64Var(&cfg.maxGrowth, "max-growth", 0.2, "heap goal and RSS: the last window's median may exceed the first's by this fraction")
	flag.Float64Var(&cfg.maxExtra, "max-extra", 2, "goroutines and open files: the last window's median may exceed the first's by this many")
	flag.Parse()
	if cfg.kpng == "" {
		fmt.Fprintln(os.Stderr, "usage: kpng-soak --kpng=PATH [--compare-test=PATH] [flags]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "kpng-soak:", err)
		os.Exit(1)
	}
}

// logf prints progress on stderr.
func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().UTC().Format("15:04:05")}, args...)...)
}

// ns is the Kubernetes namespace of the soak's objects; nodeName the Node
// kpng runs as.
const (
	ns       = "soak"
	nodeName = "node-a"
)

func run(ctx context.Context, cfg config) error {
	dir := os.Getenv("KPNG_CONTROLPLANE_DIR")
	if dir == "" {
		return errors.New("KPNG_CONTROLPLANE_DIR is not set (hack/soak.sh sets it)")
	}
	if err := os.MkdirAll(cfg.out, 0o755); err != nil {
		return fmt.Errorf("output directory: %w", err)
	}
	logf("starting the control plane")
	cp, err := controlplane.Start(controlplane.WithBinaryDir(dir))
	if err != nil {
		return fmt.Errorf("control plane: %w", err)
	}
	defer cp.Stop()
	c := cp.Client()
	if _, err := c.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("namespace %s: %w", ns, err)
	}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, Labels: map[string]string{"kubernetes.io/hostname": nodeName}}}
	if _, err := c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("node %s: %w", nodeName, err)
	}

	w := newWorld(cfg, c)
	start := time.Now()
	logf("loading %d services × %d endpoints", cfg.services, cfg.endpoints)
	if err := w.populate(ctx); err != nil {
		return err
	}
	logf("loaded in %s", time.Since(start).Round(time.Second))
	// kpng handles every service without a service-proxy-name: the
	// soak's, and the others (default/kubernetes, which the API server
	// creates a moment after it starts).
	others, err := c.CoreV1().Services("").List(ctx, metav1.ListOptions{
		LabelSelector: "!" + kubetest.ProxyNameLabel, FieldSelector: "metadata.namespace!=" + ns})
	if err != nil {
		return fmt.Errorf("list the services: %w", err)
	}
	w.others = len(others.Items)

	soaked, err := startKpng(cfg, cp.KubeconfigPath(), "kpngsoak-soaked")
	if err != nil {
		return err
	}
	defer soaked.stop()
	coldStart := time.Now()
	base, err := soaked.waitSettled(ctx, w.count(), cfg.coldTimeout)
	if err != nil {
		return fmt.Errorf("kpng's first state: %w", err)
	}
	cold := time.Since(coldStart)
	logf("kpng applied %d services in %s", w.count(), cold.Round(time.Millisecond))

	samples, churned, err := soak(ctx, cfg, w, soaked)
	if err != nil {
		return err
	}

	logf("churn stopped after %d changes; waiting for kpng to apply the last", churned)
	last, err := soaked.waitSettled(ctx, w.count(), 5*time.Minute)
	if err != nil {
		return fmt.Errorf("after the churn: %w", err)
	}
	cmp := comparison{skipped: cfg.compareTest == ""}
	if !cmp.skipped {
		cmp, err = compareFresh(ctx, cfg, cp.KubeconfigPath(), soaked, w.count())
		if err != nil {
			return err
		}
	}
	sum := summarize(cfg, samples, churned, cold, base, last, cmp)
	if err := sum.write(cfg.out); err != nil {
		return err
	}
	fmt.Print(sum.markdown)
	if len(sum.failures) > 0 {
		return fmt.Errorf("the soak failed: %s", strings.Join(sum.failures, "; "))
	}
	return nil
}

// world is the soak's API objects: which services exist, and the state
// of each endpoint of each.
type world struct {
	cfg config
	c   kubernetes.Interface
	r   *rand.Rand

	mu    sync.Mutex
	live  []int         // the indices of the services that exist
	state map[int][]int // service index → endpoint states (epReady, ...)
	free  []int         // indices of deleted services, added again first
	next  int           // the next new index
	// others is the number of services kpng handles besides the soak's.
	others int
}

// The states an endpoint cycles through, one step per change.
const (
	epReady       = iota // ready, serving
	epTerminating        // serving, terminating, not ready
	epGone               // not in the slice
	epStates
)

func newWorld(cfg config, c kubernetes.Interface) *world {
	return &world{cfg: cfg, c: c, r: rand.New(rand.NewPCG(cfg.seed, cfg.seed^0x5eed)), state: map[int][]int{}, next: cfg.services}
}

// count returns the number of services kpng should hold.
func (w *world) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.live) + w.others
}

// svcName is the name of service i.
func svcName(i int) string { return fmt.Sprintf("s%05d", i) }

// endpointIP is the address of endpoint e of service i.
func endpointIP(i, e int) string {
	return fmt.Sprintf("10.%d.%d.%d", 1+i/250, i%250, 1+e)
}

// service returns service i: ClusterIP, TCP 80 → 8080; one in twenty has
// internalTrafficPolicy Local.
func service(i int) *v1.Service {
	return kubetest.Service(ns, svcName(i), "", func(s *v1.Service) {
		if i%20 == 0 {
			p := v1.ServiceInternalTrafficPolicyLocal
			s.Spec.InternalTrafficPolicy = &p
		}
	})
}

// slice returns the EndpointSlice of service i with endpoints in states,
// stamped with the trigger time now (as the EndpointSlice controller
// stamps the slices it writes), from which kpng measures the network
// programming latency. Endpoint 0 is on this node, the others elsewhere.
func slice(svc *v1.Service, i int, states []int, now time.Time) *discovery.EndpointSlice {
	var eps []kubetest.EP
	for e, st := range states {
		if st == epGone {
			continue
		}
		ep := kubetest.EP{IP: endpointIP(i, e), Node: fmt.Sprintf("node-%d", e)}
		if e == 0 {
			ep.Node = nodeName
		}
		if st == epTerminating {
			ep.NotReady, ep.Terminating = true, true
		}
		eps = append(eps, ep)
	}
	s := kubetest.Slice(svc, svcName(i)+"-1", eps...)
	s.AddressType = discovery.AddressTypeIPv4
	s.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: now.UTC().Format(time.RFC3339Nano)}
	return s
}

// create creates service i with all its endpoints ready.
func (w *world) create(ctx context.Context, i int) error {
	states := make([]int, w.cfg.endpoints)
	svc := service(i)
	if _, err := w.c.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create service %s: %w", svc.Name, err)
	}
	if _, err := w.c.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice(svc, i, states, time.Now()), metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create the slice of %s: %w", svc.Name, err)
	}
	w.mu.Lock()
	w.state[i] = states
	w.live = append(w.live, i)
	w.mu.Unlock()
	return nil
}

// populate creates services 0..cfg.services-1 with 8 workers.
func (w *world) populate(ctx context.Context) error {
	next := make(chan int)
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range next {
				if err := w.create(ctx, i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	var err error
loop:
	for i := range w.cfg.services {
		select {
		case next <- i:
		case err = <-errs:
			break loop
		case <-ctx.Done():
			err = ctx.Err()
			break loop
		}
	}
	close(next)
	wg.Wait()
	if err != nil {
		return err
	}
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// change makes one random change: nine in ten step one endpoint of a
// service to its next state (ready → terminating → gone → ready), one in
// twenty deletes a service and its slice, one in twenty adds one (a
// deleted one first). The service count stays about even.
func (w *world) change(ctx context.Context) error {
	w.mu.Lock()
	roll := w.r.IntN(20)
	if roll == 0 && len(w.live) > 1 {
		k := w.r.IntN(len(w.live))
		i := w.live[k]
		w.live[k] = w.live[len(w.live)-1]
		w.live = w.live[:len(w.live)-1]
		delete(w.state, i)
		w.free = append(w.free, i)
		w.mu.Unlock()
		if err := w.c.CoreV1().Services(ns).Delete(ctx, svcName(i), metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("delete service %s: %w", svcName(i), err)
		}
		if err := w.c.DiscoveryV1().EndpointSlices(ns).Delete(ctx, svcName(i)+"-1", metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("delete the slice of %s: %w", svcName(i), err)
		}
		return nil
	}
	if roll == 1 {
		var i int
		if len(w.free) > 0 {
			k := w.r.IntN(len(w.free))
			i = w.free[k]
			w.free[k] = w.free[len(w.free)-1]
			w.free = w.free[:len(w.free)-1]
		} else {
			i = w.next
			w.next++
		}
		w.mu.Unlock()
		return w.create(ctx, i)
	}
	i := w.live[w.r.IntN(len(w.live))]
	states := w.state[i]
	e := w.r.IntN(len(states))
	states[e] = (states[e] + 1) % epStates
	s := slice(service(i), i, states, time.Now())
	w.mu.Unlock()
	if _, err := w.c.DiscoveryV1().EndpointSlices(ns).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update the slice of %s: %w", svcName(i), err)
	}
	return nil
}

// kpng is a running kpng process.
type kpng struct {
	cmd     *exec.Cmd
	netns   string
	metrics string
	log     *os.File
	exited  chan struct{}
}

// startKpng creates the network namespace name and starts
// `kpng kube … to-local to-nft` programming it, its metrics on a free
// loopback port, its log in cfg.out.
func startKpng(cfg config, kubeconfig, name string) (*kpng, error) {
	_ = exec.Command("ip", "netns", "del", name).Run()
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ip netns add %s: %w: %s", name, err, out)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	log, err := os.Create(filepath.Join(cfg.out, name+".log"))
	if err != nil {
		return nil, fmt.Errorf("kpng's log: %w", err)
	}
	k := &kpng{netns: "/run/netns/" + name, metrics: "127.0.0.1:" + strconv.Itoa(port), log: log, exited: make(chan struct{})}
	k.cmd = exec.Command(cfg.kpng, "kube", "--kubeconfig="+kubeconfig, "--node-name="+nodeName,
		"--metrics-bind-address="+k.metrics, "to-local", "to-nft", "--netns="+k.netns)
	k.cmd.Stdout, k.cmd.Stderr = log, log
	if err := k.cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("start kpng: %w", err)
	}
	go func() {
		_ = k.cmd.Wait()
		close(k.exited)
	}()
	logf("kpng (pid %d) programs %s, metrics on %s", k.cmd.Process.Pid, k.netns, k.metrics)
	return k, nil
}

// freePort returns a loopback TCP port free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// stop stops kpng (SIGTERM, then SIGKILL after 30 s) and removes its
// namespace.
func (k *kpng) stop() {
	_ = k.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-k.exited:
	case <-time.After(30 * time.Second):
		_ = k.cmd.Process.Kill()
		<-k.exited
	}
	k.log.Close()
	_ = exec.Command("ip", "netns", "del", filepath.Base(k.netns)).Run()
}

// scrape reads kpng's metrics.
func (k *kpng) scrape(ctx context.Context) (scrape, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+k.metrics+"/metrics", nil)
	if err != nil {
		return scrape{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return scrape{}, fmt.Errorf("scrape kpng: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return scrape{}, fmt.Errorf("scrape kpng: %s", resp.Status)
	}
	return parseMetrics(resp.Body)
}

// waitSettled waits until kpng holds want services, has applied a round
// and has no change waiting, and returns that scrape.
func (k *kpng) waitSettled(ctx context.Context, want int, timeout time.Duration) (scrape, error) {
	deadline := time.Now().Add(timeout)
	var last scrape
	var lastErr error
	for time.Now().Before(deadline) {
		select {
		case <-k.exited:
			return scrape{}, fmt.Errorf("kpng exited (its log: %s)", k.log.Name())
		case <-ctx.Done():
			return scrape{}, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
		s, err := k.scrape(ctx)
		if err != nil {
			lastErr = err
			continue
		}
		last, lastErr = s, nil
		v := s.Values
		if int(v["kpng_services"]) == want && v["kpng_sync_proxy_rules_last_timestamp_seconds"] > 0 &&
			v["kpng_sync_proxy_rules_last_queued_timestamp_seconds"] == 0 &&
			v["kpng_sync_proxy_rules_service_changes_pending"] == 0 {
			return s, nil
		}
	}
	if lastErr != nil {
		return scrape{}, fmt.Errorf("not settled within %s: %w", timeout, lastErr)
	}
	return scrape{}, fmt.Errorf("not settled within %s: %v services (want %d), last queued %v, %v service changes pending", timeout,
		last.Values["kpng_services"], want, last.Values["kpng_sync_proxy_rules_last_queued_timestamp_seconds"],
		last.Values["kpng_sync_proxy_rules_service_changes_pending"])
}

// sample is one reading of kpng during the soak.
type sample struct {
	at      time.Duration // since the churn started
	changes int64         // API changes made so far
	s       scrape
	vmRSS   float64 // bytes, from /proc/<pid>/status
}

// soak runs the churn for cfg.duration and samples kpng meanwhile.
func soak(ctx context.Context, cfg config, w *world, k *kpng) ([]sample, int64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var changes atomic.Int64
	churnErr := make(chan error, 1)
	start := time.Now()
	end := start.Add(cfg.duration)
	logf("churn: %.1f changes/s for %s", cfg.rate, cfg.duration)
	go func() {
		tick := time.NewTicker(time.Duration(float64(time.Second) / cfg.rate))
		defer tick.Stop()
		for time.Now().Before(end) {
			select {
			case <-ctx.Done():
				churnErr <- nil
				return
			case <-tick.C:
			}
			if err := w.change(ctx); err != nil {
				churnErr <- err
				return
			}
			changes.Add(1)
		}
		churnErr <- nil
	}()
	var samples []sample
	tick := time.NewTicker(cfg.sample)
	defer tick.Stop()
	for {
		select {
		case err := <-churnErr:
			if err != nil {
				return samples, changes.Load(), fmt.Errorf("churn: %w", err)
			}
			return samples, changes.Load(), nil
		case <-k.exited:
			return samples, changes.Load(), fmt.Errorf("kpng exited during the soak (its log: %s)", k.log.Name())
		case <-ctx.Done():
			return samples, changes.Load(), ctx.Err()
		case <-tick.C:
		}
		s, err := k.scrape(ctx)
		if err != nil {
			logf("sample: %v", err)
			continue
		}
		smp := sample{at: time.Since(start), changes: changes.Load(), s: s, vmRSS: vmRSS(k.cmd.Process.Pid)}
		samples = append(samples, smp)
		if len(samples)%int(max(1, time.Minute/cfg.sample)) == 0 {
			v := s.Values
			logf("%s: %d changes, heap %.1f MiB, RSS %.1f MiB, %v goroutines, %v fds, %v services, %v failures",
				smp.at.Round(time.Second), smp.changes, v["go_memstats_heap_alloc_bytes"]/(1<<20), smp.vmRSS/(1<<20),
				v["go_goroutines"], v["process_open_fds"], v["kpng_services"], v["kpng_sync_proxy_rules_failures_total"])
		}
	}
}

// vmRSS returns the VmRSS of pid in bytes (0 when unknown).
func vmRSS(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kib, _ := strconv.ParseFloat(f[1], 64)
			return kib * 1024
		}
	}
	return 0
}

// comparison is the result of comparing the soaked table with a fresh
// one.
type comparison struct {
	skipped bool
	equal   bool
	fresh   time.Duration // the fresh kpng's cold start
	output  string        // the test's output
}

// compareFresh starts a second kpng on the same objects in a fresh
// namespace, waits for its first state, and runs the nft backend's
// table comparison (its test binary run with KPNG_COMPARE_NETNS) on the
// two namespaces.
func compareFresh(ctx context.Context, cfg config, kubeconfig string, soaked *kpng, want int) (comparison, error) {
	fresh, err := startKpng(cfg, kubeconfig, "kpngsoak-fresh")
	if err != nil {
		return comparison{}, err
	}
	defer fresh.stop()
	start := time.Now()
	if _, err := fresh.waitSettled(ctx, want, cfg.coldTimeout); err != nil {
		return comparison{}, fmt.Errorf("the fresh kpng: %w", err)
	}
	res := comparison{fresh: time.Since(start)}
	// Neither may have moved meanwhile.
	if _, err := soaked.waitSettled(ctx, want, time.Minute); err != nil {
		return comparison{}, fmt.Errorf("the soaked kpng, before the comparison: %w", err)
	}
	// The test binary compares instead of testing when
	// KPNG_COMPARE_NETNS is set (backends/nft compareTables).
	cmd := exec.CommandContext(ctx, cfg.compareTest)
	cmd.Env = append(os.Environ(), "KPNG_COMPARE_NETNS="+fresh.netns+","+soaked.netns)
	out, err := cmd.CombinedOutput()
	res.output = string(out)
	var exit *exec.ExitError
	switch {
	case err == nil:
		res.equal = strings.Contains(res.output, "tables equal")
		if !res.equal {
			return res, fmt.Errorf("%s did not compare the tables:\n%s", cfg.compareTest, out)
		}
	case errors.As(err, &exit):
		res.equal = false
	default:
		return res, fmt.Errorf("run %s: %w", cfg.compareTest, err)
	}
	logf("tables equal: %v", res.equal)
	return res, nil
}
