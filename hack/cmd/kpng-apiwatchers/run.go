//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/kubernetes"

	"sigs.k8s.io/kpng/internal/controlplane"
	"sigs.k8s.io/kpng/internal/proc"
)

// config is a run: the objects, then one configuration per count.
type config struct {
	// kpng is the controller's command (the kpng binary, or a test binary
	// that runs kpng), env added to its environment.
	kpng []string
	env  []string

	services, endpoints, nodes, changes int
	// watchers and controllers are the configurations: raw watcher
	// counts and kpng controller counts (the controllers run first).
	watchers, controllers []int
	// proxyName labels the services and is the controllers'
	// --service-proxy-name; contentType is the raw watchers'.
	proxyName, contentType string
	// dir holds the sockets, kubeconfigs and controllers' logs.
	dir string
	// wave is how many raw watchers start at once, each wave once the one
	// before holds the state (0: all at once).
	wave int
	// syncTimeout bounds the initial state, changeTimeout each change.
	syncTimeout, changeTimeout time.Duration
	namespace                  string
	createWorkers              int
	logf                       func(format string, args ...any)
}

// check says what is wrong with cfg's numbers.
func (cfg config) check() error {
	switch {
	case cfg.services < 1 || cfg.services > 62500:
		return fmt.Errorf("--services=%d: want 1…62500", cfg.services)
	case cfg.endpoints < 1 || cfg.endpoints > 254:
		return fmt.Errorf("--endpoints=%d: want 1…254", cfg.endpoints)
	case cfg.nodes < 1:
		return fmt.Errorf("--nodes=%d: want at least 1", cfg.nodes)
	case cfg.changes < 1:
		return fmt.Errorf("--changes=%d: want at least 1", cfg.changes)
	case len(cfg.watchers)+len(cfg.controllers) == 0:
		return errors.New("no configuration: --watchers and --controllers are both empty")
	}
	return nil
}

// result is what one configuration measured.
type result struct {
	kind     string // "raw" or "kpng"
	watchers int
	services int
	// cpuInitial is the API server's CPU seconds from the watchers
	// starting to all holding the initial state; bytesInitial what they
	// received meanwhile, together.
	cpuInitial   float64
	bytesInitial int64
	// cpuPerChange is the API server's CPU milliseconds per change;
	// bytesPerChange what the watchers received per change, together.
	cpuPerChange, bytesPerChange float64
	// initialTime is how long the initial state took (wall time, on a
	// shared machine: context only).
	initialTime time.Duration
	// rssBefore is the API server's RSS before the watchers started,
	// rssHeld with them holding the state after the changes (MiB).
	rssBefore, rssHeld float64
	// idleCPU is the API server's CPU milliseconds a second, before the
	// watchers started (its own background work).
	idleCPU float64
	// clientCPUPerChange is the controllers' CPU milliseconds per change,
	// together (kind kpng only).
	clientCPUPerChange float64
	// restartsInitial and restartsChanges are the raw watchers' watches
	// that ended in an error and were started again, during the initial
	// state and during the changes.
	restartsInitial, restartsChanges int64
	// settle is how long the watchers' bytes took to stop growing after
	// they all held the initial state (a watch restarted meanwhile
	// lists again); extraObjects the objects the raw watchers received
	// during the changes beyond one event a change each (a list again).
	settle       time.Duration
	extraObjects int64
	problems     []string
}

// label names the configuration.
func (r result) label() string { return fmt.Sprintf("watchers=%d kind=%s", r.watchers, r.kind) }

// closing is the configuration's closing line.
func (r result) closing() string {
	return fmt.Sprintf("%s services=%d apiserver_cpu_ms_per_change=%.1f bytes_per_change=%.0f apiserver_cpu_s_initial=%.2f bytes_initial=%d apiserver_rss_mib=%.0f",
		r.label(), r.services, r.cpuPerChange, r.bytesPerChange, r.cpuInitial, r.bytesInitial, r.rssHeld)
}

// details are the other figures.
func (r result) details() string {
	s := fmt.Sprintf("%s: initial state in %.1f s (wall); per watcher %.0f bytes initial, %.0f bytes a change; API server idle %.1f ms CPU a second, RSS %.0f MiB before the watchers, %.0f with them",
		r.label(), r.initialTime.Seconds(), float64(r.bytesInitial)/float64(r.watchers), r.bytesPerChange/float64(r.watchers), r.idleCPU, r.rssBefore, r.rssHeld)
	if r.kind == "raw" {
		s += fmt.Sprintf("; watches restarted after an error: %d during the initial state, %d during the changes; bytes settled %.1f s after the initial state; objects received during the changes beyond one event a change and watcher: %d",
			r.restartsInitial, r.restartsChanges, r.settle.Seconds(), r.extraObjects)
	}
	if r.kind == "kpng" {
		s += fmt.Sprintf("; controllers' CPU %.1f ms a change, together", r.clientCPUPerChange)
	}
	return s
}

// watcherSet is one configuration's watchers.
type watcherSet interface {
	// synced is closed when every watcher holds the initial state.
	synced() <-chan struct{}
	// bytes is what the watchers received so far, together.
	bytes() int64
	// check says what is wrong with the initial state the watchers hold.
	check() []string
	// objects is how many objects (listed, or in watch events) the
	// watchers received so far, together (raw watchers only).
	objects() int64
	// restarts is how many watches ended in an error and were started
	// again so far (raw watchers only).
	restarts() int64
	// clientCPU is the watchers' processes' CPU seconds (0 when they are
	// this process).
	clientCPU() float64
	// failed is closed, with err set, when a watcher can no longer work.
	failed() <-chan struct{}
	err() error
	// stop stops the watchers and waits for them.
	stop()
}

// target is the change the watchers wait for: endpoint ip of service
// (its slice named slice) in namespace ns made ready or not ready.
type target struct {
	ns, service, slice, ip string
	ready                  bool
	want                   int64
	seen                   atomic.Int64
	done                   chan struct{}
}

// tracker is the change in progress, read by every watcher's handler.
type tracker struct{ current atomic.Pointer[target] }

// seer is one watcher's side of the tracker: it counts each change once.
type seer struct {
	tr   *tracker
	last atomic.Pointer[target]
}

// holds counts the watcher as holding change t, once.
func (s *seer) holds(t *target) {
	if s.last.Swap(t) != t && t.seen.Add(1) == t.want {
		close(t.done)
	}
}

// run creates the objects, then measures each configuration against the
// control plane, printing its closing line on out as it ends.
func run(ctx context.Context, cfg config, c kubernetes.Interface, cp *controlplane.ControlPlane, out io.Writer) ([]result, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	w := &world{c: c, ns: cfg.namespace, proxyName: cfg.proxyName, services: cfg.services, endpoints: cfg.endpoints, nodes: cfg.nodes, notReady: map[int]map[int]bool{}}
	start := time.Now()
	cfg.logf("loading %d services × %d endpoints", cfg.services, cfg.endpoints)
	if err := w.create(ctx, cfg.createWorkers, cfg.logf); err != nil {
		return nil, err
	}
	cfg.logf("objects loaded in %.1f s", time.Since(start).Seconds())
	var results []result
	tr := &tracker{}
	k := 0 // the changes go on from one configuration to the next
	configs := make([]struct {
		kind string
		n    int
	}, 0, len(cfg.controllers)+len(cfg.watchers))
	for _, n := range cfg.controllers {
		configs = append(configs, struct {
			kind string
			n    int
		}{"kpng", n})
	}
	for _, n := range cfg.watchers {
		configs = append(configs, struct {
			kind string
			n    int
		}{"raw", n})
	}
	for _, conf := range configs {
		res, err := measureOne(ctx, cfg, w, cp, tr, conf.kind, conf.n, &k)
		if err != nil {
			return results, fmt.Errorf("%s: %w", res.label(), err)
		}
		cfg.logf("%s", res.details())
		fmt.Fprintln(out, res.closing())
		results = append(results, res)
	}
	return results, nil
}

// measureOne starts n watchers of kind, waits for the initial state,
// makes the changes (numbered from *k on) and measures.
func measureOne(ctx context.Context, cfg config, w *world, cp *controlplane.ControlPlane, tr *tracker, kind string, n int, k *int) (result, error) {
	res := result{kind: kind, watchers: n, services: cfg.services}
	pid := cp.APIServerPID()
	if pid == 0 {
		return res, errors.New("the API server is not running")
	}
	cpu := func() float64 {
		s, err := proc.CPUSeconds(pid)
		if err != nil {
			res.problems = append(res.problems, err.Error())
		}
		return s
	}
	rss := func() float64 {
		r, _, err := proc.Memory(pid)
		if err != nil {
			res.problems = append(res.problems, err.Error())
		}
		return r
	}
	// The API server's background work, for the reader to compare with.
	idle0, t0 := cpu(), time.Now()
	select {
	case <-time.After(3 * time.Second):
	case <-ctx.Done():
		return res, ctx.Err()
	}
	res.idleCPU = 1000 * (cpu() - idle0) / time.Since(t0).Seconds()
	res.rssBefore = rss()

	cpu0, start := cpu(), time.Now()
	var set watcherSet
	var err error
	if kind == "kpng" {
		set, err = startControllers(ctx, cfg, cp, tr, n)
	} else {
		set, err = startRaw(ctx, cfg, cp, tr, n)
	}
	if err != nil {
		return res, err
	}
	defer set.stop()
	cfg.logf("%s: started; waiting for the initial state", res.label())
	select {
	case <-set.synced():
	case <-set.failed():
		return res, set.err()
	case <-time.After(cfg.syncTimeout):
		return res, fmt.Errorf("the watchers do not all hold the initial state after %s", cfg.syncTimeout)
	case <-ctx.Done():
		return res, ctx.Err()
	}
	res.initialTime = time.Since(start)
	// A watch that ended as the initial state arrived lists again: that
	// belongs to the initial state, not to the changes.
	synced := time.Now()
	for last, still := set.bytes(), 0; still < 4 && time.Since(synced) < 2*time.Minute; {
		select {
		case <-time.After(500 * time.Millisecond):
		case <-ctx.Done():
			return res, ctx.Err()
		}
		if b := set.bytes(); b != last {
			last, still = b, 0
		} else {
			still++
		}
	}
	res.settle = time.Since(synced)
	res.cpuInitial = cpu() - cpu0
	res.bytesInitial = set.bytes()
	res.restartsInitial = set.restarts()
	res.problems = append(res.problems, set.check()...)
	cfg.logf("%s: the initial state held after %.1f s; %d changes", res.label(), res.initialTime.Seconds(), cfg.changes)

	cpu0, bytes0, client0, objects0 := cpu(), set.bytes(), set.clientCPU(), set.objects()
	for range cfg.changes {
		t, i := w.flip(*k)
		*k++
		t.want, t.done = int64(n), make(chan struct{})
		tr.current.Store(t)
		if err := w.update(ctx, i); err != nil {
			return res, err
		}
		select {
		case <-t.done:
		case <-set.failed():
			return res, set.err()
		case <-time.After(cfg.changeTimeout):
			res.problems = append(res.problems, fmt.Sprintf("change of service %s endpoint %s (ready %t): %d of %d watchers hold it after %s", t.service, t.ip, t.ready, t.seen.Load(), n, cfg.changeTimeout))
		case <-ctx.Done():
			return res, ctx.Err()
		}
	}
	tr.current.Store(nil)
	res.cpuPerChange = 1000 * (cpu() - cpu0) / float64(cfg.changes)
	res.bytesPerChange = float64(set.bytes()-bytes0) / float64(cfg.changes)
	res.clientCPUPerChange = 1000 * (set.clientCPU() - client0) / float64(cfg.changes)
	res.rssHeld = rss()
	res.restartsChanges = set.restarts() - res.restartsInitial
	if kind == "raw" {
		res.extraObjects = set.objects() - objects0 - int64(cfg.changes*n)
	}
	return res, nil
}

// group runs goroutines and keeps the first error.
type group struct {
	wg       sync.WaitGroup
	once     sync.Once
	firstErr error
	failedCh chan struct{}
}

func newGroup() *group { return &group{failedCh: make(chan struct{})} }

// fail records err as the group's error (the first only).
func (g *group) fail(err error) {
	g.once.Do(func() {
		g.firstErr = err
		close(g.failedCh)
	})
}

func (g *group) failed() <-chan struct{} { return g.failedCh }

func (g *group) err() error {
	select {
	case <-g.failedCh:
		return g.firstErr
	default:
		return nil
	}
}
