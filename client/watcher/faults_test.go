package watcher_test

import (
	"context"
	"fmt"
	"maps"
	"sort"
	"sync"
	"testing"
	"time"

	discovery "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"sigs.k8s.io/kpng/client/watcher"
	"sigs.k8s.io/kpng/internal/kubetest"
	"sigs.k8s.io/kpng/model"
)

// TestFaultsWhileChangesFlow kills kube-apiserver, then etcd, and starts
// each again a second later, while a writer keeps adding services and
// endpoints (retrying each write until the API server takes it). The
// changes only add, so every state the watcher delivers must hold all of
// the one before: a state that lost a service or an endpoint is an empty
// or partial state. Each state must also hold only what was written, and
// once the writer stops the watcher's state must come to hold every write
// the API server confirmed (within a minute: client-go's reflectors back
// off up to 30 s between lists while the API server is away) and equal a
// fresh watcher's.
func TestFaultsWhileChangesFlow(t *testing.T) {
	cp.Require(t)
	ns := kubetest.Namespace(t, cp.Client())
	cfg := watcher.Config{ServiceProxyName: kubetest.UniqueName("faults")}
	r := startWatcher(t, cfg)
	r.waitFor(t, "the first state", func([]*model.ServiceEndpoints) bool { return true })

	w := &addingWriter{c: cp.Client(), ns: ns, proxyName: cfg.ServiceProxyName, attempted: map[string]bool{}, confirmed: map[string]bool{}}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.run(ctx) }()
	defer func() { stop(); <-done }()

	pause := func(d time.Duration) { time.Sleep(d) }
	// The control plane is the package's: whatever happens, it is left
	// running for the next tests.
	t.Cleanup(func() { _ = cp.StartEtcd(); _ = cp.StartAPIServer() })
	faults := []struct {
		what       string
		kill, heal []func() error
	}{
		{"kube-apiserver killed", []func() error{cp.KillAPIServer}, []func() error{cp.StartAPIServer}},
		{"etcd killed", []func() error{cp.KillEtcd}, []func() error{cp.StartEtcd}},
	}
	pause(time.Second)
	for _, f := range faults {
		before := w.confirmedCount()
		for _, kill := range f.kill {
			if err := kill(); err != nil {
				t.Fatalf("%s: %v", f.what, err)
			}
		}
		pause(time.Second)
		for _, heal := range f.heal {
			if err := heal(); err != nil {
				t.Fatalf("%s, restart: %v", f.what, err)
			}
		}
		// Changes flow again before the next fault.
		deadline := time.Now().Add(30 * time.Second)
		for w.confirmedCount() < before+5 && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if w.confirmedCount() < before+5 {
			t.Fatalf("%s: the writer got no write through within 30 s of the restart", f.what)
		}
		t.Logf("%s: %d writes confirmed so far, %d states delivered", f.what, w.confirmedCount(), len(r.allStates()))
	}
	pause(500 * time.Millisecond)
	stop()
	<-done

	// client-go's reflectors back off while the API server is away (up
	// to 30 s between lists): the watcher catches up once they list again.
	stopped := time.Now()
	for !containsKeys(r.latestKeys(), w.confirmedKeys()) {
		if time.Since(stopped) > time.Minute {
			t.Fatalf("the watcher's state lacks confirmed writes a minute after the writer stopped")
		}
		time.Sleep(100 * time.Millisecond)
	}
	caughtUp := time.Since(stopped)
	checkConverged(t, r, cfg, "after the faults")
	states := r.allStates()
	final := stateKeys(states[len(states)-1])
	w.mu.Lock()
	for k := range w.confirmed {
		if !final[k] {
			t.Errorf("%s: written (the API server confirmed it) but not in the final state", k)
		}
	}
	attempted := w.attempted
	w.mu.Unlock()
	var prev map[string]bool
	for i, st := range states {
		keys := stateKeys(st)
		var lost, unknown []string
		for k := range prev {
			if !keys[k] {
				lost = append(lost, k)
			}
		}
		for k := range keys {
			if !attempted[k] {
				unknown = append(unknown, k)
			}
		}
		if len(lost) > 0 {
			sort.Strings(lost)
			t.Errorf("state %d of %d lost what the state before held (an empty or partial state): %v", i, len(states), lost)
		}
		if len(unknown) > 0 {
			sort.Strings(unknown)
			t.Errorf("state %d holds what was never written: %v", i, unknown)
		}
		prev = keys
	}
	t.Logf("%d writes confirmed, %d states delivered and compared; caught up %v after the last write", len(w.confirmed), len(states), caughtUp.Round(100*time.Millisecond))
}

// latestKeys returns the keys of the latest state delivered.
func (r *recorder) latestKeys() map[string]bool {
	st := r.allStates()
	return stateKeys(st[len(st)-1])
}

// containsKeys reports whether have holds every key of want.
func containsKeys(have, want map[string]bool) bool {
	for k := range want {
		if !have[k] {
			return false
		}
	}
	return true
}

// stateKeys returns the services ("svc") and endpoints ("svc/ip") of a
// state.
func stateKeys(st []*model.ServiceEndpoints) map[string]bool {
	keys := map[string]bool{}
	for _, se := range st {
		keys[se.Service.Name] = true
		for _, ep := range se.Endpoints {
			keys[se.Service.Name+"/"+ep.Key()] = true
		}
	}
	return keys
}

// addingWriter adds services (each with one slice of one endpoint) and
// endpoints to their slices, one write after the other, retrying each
// until the API server takes it. attempted holds every service and
// endpoint it tried to write (a write that failed may still have been
// applied), confirmed those the API server acknowledged.
type addingWriter struct {
	c             kubernetes.Interface
	ns, proxyName string

	mu        sync.Mutex
	attempted map[string]bool
	confirmed map[string]bool
	services  []string
	ips       int
}

// confirmedKeys returns a copy of the confirmed writes.
func (w *addingWriter) confirmedKeys() map[string]bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.confirmed)
}

func (w *addingWriter) confirmedCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.confirmed)
}

func (w *addingWriter) mark(m map[string]bool, keys ...string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, k := range keys {
		m[k] = true
	}
}

// run writes until ctx ends.
func (w *addingWriter) run(ctx context.Context) {
	for step := 0; ctx.Err() == nil; step++ {
		if step%4 == 0 || len(w.services) == 0 {
			w.addService(ctx, fmt.Sprintf("f%03d", len(w.services)))
		} else {
			w.addEndpoint(ctx, w.services[step%len(w.services)])
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// nextIP returns a new endpoint address.
func (w *addingWriter) nextIP() string {
	w.ips++
	return fmt.Sprintf("10.60.%d.%d", w.ips/250, 1+w.ips%250)
}

// retry calls write until it succeeds or ctx ends, with a short timeout
// per call (requests hang while etcd is down).
func retry(ctx context.Context, write func(ctx context.Context) error) bool {
	for ctx.Err() == nil {
		callCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := write(callCtx)
		cancel()
		if err == nil {
			return true
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	return false
}

// addService creates service name and its slice with one endpoint.
func (w *addingWriter) addService(ctx context.Context, name string) {
	svc := kubetest.Service(w.ns, name, w.proxyName)
	ip := w.nextIP()
	w.mark(w.attempted, name, name+"/"+ip)
	ok := retry(ctx, func(ctx context.Context) error {
		_, err := w.c.CoreV1().Services(w.ns).Create(ctx, svc, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil // an earlier try went through
		}
		return err
	})
	if !ok {
		return
	}
	w.mark(w.confirmed, name)
	w.services = append(w.services, name)
	slice := kubetest.Slice(svc, name, kubetest.EP{IP: ip})
	if retry(ctx, func(ctx context.Context) error {
		_, err := w.c.DiscoveryV1().EndpointSlices(w.ns).Create(ctx, slice, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return err
	}) {
		w.mark(w.confirmed, name+"/"+ip)
	}
}

// addEndpoint adds a new address to the slice of service name, reading
// the slice afresh before each try.
func (w *addingWriter) addEndpoint(ctx context.Context, name string) {
	ip := w.nextIP()
	w.mark(w.attempted, name+"/"+ip)
	if retry(ctx, func(ctx context.Context) error {
		s, err := w.c.DiscoveryV1().EndpointSlices(w.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, e := range s.Endpoints {
			if e.Addresses[0] == ip {
				return nil // an earlier try went through
			}
		}
		ready := true
		s.Endpoints = append(s.Endpoints, discovery.Endpoint{Addresses: []string{ip}, Conditions: discovery.EndpointConditions{Ready: &ready}})
		_, err = w.c.DiscoveryV1().EndpointSlices(w.ns).Update(ctx, s, metav1.UpdateOptions{})
		return err
	}) {
		w.mark(w.confirmed, name+"/"+ip)
	}
}
