//go:build linux

package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	discovery "k8s.io/api/discovery/v1"

	"sigs.k8s.io/kpng/client/remote"
	"sigs.k8s.io/kpng/internal/e2e"
	"sigs.k8s.io/kpng/internal/kubetest"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/localsink/sinktest"
	"sigs.k8s.io/kpng/model"
)

// TestControllerFailover runs three `kpng kube … to-api` controllers
// against the API server, connects $KPNG_FAILOVER_BACKENDS remote
// backends (default 20; 1,000 for the figures of docs/benchmarks.md), each
// given the three addresses, changes services and endpoints every 20 ms,
// and in the middle kills (SIGKILL) the controller most backends watch.
// Every backend must then watch another controller, end with the API
// server's state, and never have seen a Reset after its first state, an
// empty state, a change of a service nobody changed (a flap), or a
// service vanish that the API server still had (the services created by
// the churn aside: see below). It logs the time from the kill to each
// moved backend's first whole state from its new controller (median, p99,
// max), never asserted. $KPNG_FAILOVER_TO_API_FLAGS adds flags to the
// controllers' to-api (space-separated), $KPNG_FAILOVER_CHURN_INTERVAL sets
// the time between two changes (20ms).
//
// With the rotation removed (the same address retried) no backend leaves
// the killed controller and it fails; with the mirror's difference
// bypassed (the new stream's Reset reaching the sink) it fails on the
// Reset and the stable services given again. (A backoff before the next
// address would only slow it: client/remote's TestNextAddressAtOnce
// catches that.)
//
// The services the churn creates are checked less strictly: the
// controllers watch the API server each on its own, and the one a backend
// moves to may not have seen a service created a few milliseconds before
// the kill (its informer, its --min-sync-interval): the backend then sees
// it go and come back. Those are counted and logged.
func TestControllerFailover(t *testing.T) {
	cp.Require(t)
	backends := 20
	if s := os.Getenv("KPNG_FAILOVER_BACKENDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("$KPNG_FAILOVER_BACKENDS=%q: want a positive number", s)
		}
		backends = n
	}
	const stable, churned, rounds = 10, 10, 60
	interval := 20 * time.Millisecond
	if s := os.Getenv("KPNG_FAILOVER_CHURN_INTERVAL"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 {
			t.Fatalf("$KPNG_FAILOVER_CHURN_INTERVAL=%q: want a duration", s)
		}
		interval = d
	}
	kc := kubetest.Client{T: t, C: cp.Client()}
	ns := kubetest.Namespace(t, cp.Client())
	name := kubetest.UniqueName("failover")

	// want is the API server's state as the test wrote it: service name →
	// endpoint addresses (every endpoint on a node that is no backend's,
	// so that every backend's view is the same).
	want := map[string][]string{}
	slicesOf := map[string]*discovery.EndpointSlice{}
	create := func(svcName string, ips ...string) {
		svc := kc.CreateService(kubetest.Service(ns, svcName, name))
		var eps []kubetest.EP
		for _, ip := range ips {
			eps = append(eps, kubetest.EP{IP: ip, Node: "elsewhere"})
		}
		slicesOf[svcName] = kc.CreateSlice(kubetest.Slice(svc, svcName+"-1", eps...))
		want[svcName] = slices.Sorted(slices.Values(ips))
	}
	isStable := map[model.ServiceKey]bool{}
	keep := map[model.ServiceKey]bool{} // never deleted
	for i := range stable {
		create(fmt.Sprintf("stable-%02d", i), fmt.Sprintf("10.71.%d.1", i), fmt.Sprintf("10.71.%d.2", i))
		isStable[model.ServiceKey{Namespace: ns, Name: fmt.Sprintf("stable-%02d", i)}] = true
	}
	for i := range churned {
		create(fmt.Sprintf("churn-%02d", i), fmt.Sprintf("10.72.%d.1", i))
		keep[model.ServiceKey{Namespace: ns, Name: fmt.Sprintf("churn-%02d", i)}] = true
	}
	for k := range isStable {
		keep[k] = true
	}

	bin := e2e.Build(t, "cmd/kpng")
	dir := t.TempDir()
	var addrs []string
	controllers := map[string]*e2e.Proc{}
	for i := range 3 {
		addr := "unix://" + filepath.Join(dir, fmt.Sprintf("kpng-%d.sock", i))
		addrs = append(addrs, addr)
		args := []string{"kube", "--kubeconfig=" + cp.KubeconfigPath(), "--service-proxy-name=" + name, "to-api", "--listen=" + addr}
		args = append(args, strings.Fields(os.Getenv("KPNG_FAILOVER_TO_API_FLAGS"))...)
		controllers[addr] = e2e.Start(t, bin, args...)
	}

	// The backends start once the controllers listen, so that each
	// starts on the address its node name hashes to.
	for _, addr := range addrs {
		path := strings.TrimPrefix(addr, "unix://")
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
			if _, err := os.Stat(path); err == nil {
				break
			} else if time.Now().After(deadline) {
				t.Fatalf("controller %s: %v", addr, err)
			}
		}
	}

	type watch struct {
		at   time.Time
		addr string
	}
	var mu sync.Mutex
	watches := make([][]watch, backends)
	recorders := make([]*recorder, backends)
	checkers := make([]*sinktest.Checker, backends)
	for i := range backends {
		recorders[i] = &recorder{stable: isStable, keep: keep}
		checkers[i] = sinktest.NewChecker(recorders[i])
		cfg := remote.Config{Address: strings.Join(addrs, ","), NodeName: fmt.Sprintf("node-%04d", i), Watching: func(addr string) {
			mu.Lock()
			watches[i] = append(watches[i], watch{time.Now(), addr})
			mu.Unlock()
		}}
		sinktest.RunSource(t, cfg.NodeName, checkers[i], func(ctx context.Context, sink localsink.Sink) error {
			return remote.Run(ctx, cfg, sink)
		})
	}
	waitAll(t, checkers, 1)
	checkStates(t, checkers, ns, want, time.Minute)
	on := func(i int) string {
		mu.Lock()
		defer mu.Unlock()
		return watches[i][len(watches[i])-1].addr
	}
	perController := map[string]int{}
	for i := range backends {
		perController[on(i)]++
	}
	t.Logf("backends per controller: %v", perController)

	// Churn, with the kill in the middle: endpoints moved, services
	// created and deleted.
	var killed string
	var killedAt time.Time
	created := 0
	for r := range rounds {
		switch r % 3 {
		case 0, 1:
			i := r % churned
			svcName := fmt.Sprintf("churn-%02d", i)
			s := slicesOf[svcName]
			ip := fmt.Sprintf("10.72.%d.%d", i, r+2)
			s.Endpoints[0].Addresses = []string{ip}
			slicesOf[svcName] = kc.UpdateSlice(s)
			want[svcName] = []string{ip}
		case 2:
			if created >= 2 {
				old := fmt.Sprintf("new-%02d", created-2)
				kc.DeleteService(ns, old)
				kc.DeleteSlice(ns, old+"-1")
				delete(want, old)
			}
			create(fmt.Sprintf("new-%02d", created), fmt.Sprintf("10.73.%d.1", created))
			created++
		}
		if r == rounds/2 {
			for addr, n := range perController {
				if killed == "" || n > perController[killed] {
					killed = addr
				}
			}
			killedAt = time.Now()
			controllers[killed].Kill(t)
			t.Logf("killed %s (%d backends): its process exited %v after SIGKILL", killed, perController[killed], time.Since(killedAt).Round(time.Millisecond))
		}
		time.Sleep(interval)
	}

	// Every backend watches another controller, and holds the API
	// server's state.
	var moved []time.Duration
	deadline := time.Now().Add(time.Minute)
	for i := range backends {
		for on(i) == killed && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if on(i) == killed {
			t.Fatalf("backend %d still watches the killed controller %s a minute later", i, killed)
		}
		mu.Lock()
		for _, w := range watches[i] {
			if w.at.After(killedAt) && w.addr != killed {
				moved = append(moved, w.at.Sub(killedAt))
				break
			}
		}
		mu.Unlock()
	}
	checkStates(t, checkers, ns, want, time.Minute)
	reverted := 0
	for i, r := range recorders {
		if err := r.err(); err != nil {
			t.Errorf("backend %d: %v", i, err)
		}
		reverted += r.reverted()
	}
	slices.Sort(moved)
	if len(moved) == 0 {
		t.Fatalf("no backend of the %d on %s moved", perController[killed], killed)
	}
	pct := func(p float64) time.Duration { return moved[min(len(moved)-1, int(p*float64(len(moved))))] }
	t.Logf("%d backends (%d on the killed controller) under churn: kill → first whole state from another controller: median %v, p99 %v, max %v; %d churn-created services seen to go and come back",
		backends, len(moved), pct(0.5).Round(100*time.Microsecond), pct(0.99).Round(100*time.Microsecond), moved[len(moved)-1].Round(100*time.Microsecond), reverted)
}

// checkStates waits until every checker holds want (service → endpoint
// addresses, in ns), and fails naming the first backend that does not.
func checkStates(t *testing.T, checkers []*sinktest.Checker, ns string, want map[string][]string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for i, c := range checkers {
		for {
			got := map[string][]string{}
			for _, se := range c.State() {
				if se.Service.Namespace != ns {
					continue
				}
				var ips []string
				for _, ep := range se.Endpoints {
					ips = append(ips, ep.IPs.V4...)
				}
				slices.Sort(ips)
				got[se.Service.Name] = ips
			}
			diff := describeDiff(want, got)
			if diff == "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("backend %d's state differs from the API server's: %s", i, diff)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// describeDiff returns the services whose endpoints differ, "" when none.
func describeDiff(want, got map[string][]string) string {
	var out []string
	for k, w := range want {
		if g, ok := got[k]; !ok || !slices.Equal(w, g) {
			out = append(out, fmt.Sprintf("%s: want %v, got %v (held %v)", k, w, g, ok))
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			out = append(out, fmt.Sprintf("%s: want none, got %v", k, g))
		}
	}
	slices.Sort(out)
	return strings.Join(out, "; ")
}

// recorder is a backend's sink: it records what a backend must never see
// after its first state (a Reset, an empty state, a stable service
// changed, a service the test never deletes deleted) and counts the
// churn-created services seen deleted and back.
type recorder struct {
	stable, keep map[model.ServiceKey]bool
	mu           sync.Mutex
	syncs        int
	held         map[model.ServiceKey]bool
	gone         map[model.ServiceKey]bool // deleted in a round, maybe back later
	back         int
	problems     []string
}

func (r *recorder) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.syncs > 0 {
		r.problems = append(r.problems, fmt.Sprintf("Reset after %d rounds", r.syncs))
	}
	r.held, r.gone = map[model.ServiceKey]bool{}, map[model.ServiceKey]bool{}
}

func (r *recorder) Update(key model.ServiceKey, prev, cur *model.ServiceEndpoints) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.held == nil {
		r.held, r.gone = map[model.ServiceKey]bool{}, map[model.ServiceKey]bool{}
	}
	switch {
	case r.syncs > 0 && r.stable[key]:
		r.problems = append(r.problems, fmt.Sprintf("round %d: stable service %s changed: %s", r.syncs+1, key, sinktest.DescribeUpdate(key, prev, cur)))
	case cur == nil && r.keep[key]:
		r.problems = append(r.problems, fmt.Sprintf("round %d: service %s vanished", r.syncs+1, key))
	}
	if cur == nil {
		delete(r.held, key)
		r.gone[key] = true
		return
	}
	if r.gone[key] {
		r.back++
		delete(r.gone, key)
	}
	r.held[key] = true
}

func (r *recorder) Sync() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.syncs++
	if len(r.held) == 0 {
		r.problems = append(r.problems, fmt.Sprintf("round %d: an empty state", r.syncs))
	}
	return nil
}

func (r *recorder) err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.problems) == 0 {
		return nil
	}
	return fmt.Errorf("%d problems: %s", len(r.problems), strings.Join(r.problems[:min(5, len(r.problems))], "; "))
}

func (r *recorder) reverted() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.back
}
