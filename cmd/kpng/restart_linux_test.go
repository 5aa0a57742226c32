//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	discovery "k8s.io/api/discovery/v1"

	"sigs.k8s.io/kpng/client/remote"
	"sigs.k8s.io/kpng/internal/e2e"
	"sigs.k8s.io/kpng/internal/kubetest"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/localsink/sinktest"
)

// TestControllerRestartUnder100Backends runs `kpng kube … to-api` with
// 100 remote backends (client/remote, each its own node) connected, kills
// the controller with SIGKILL, removes an endpoint while it is down, and
// starts it again on the same socket: every backend must get exactly the
// difference, the one endpoint removed, in one round: no Reset, no
// service deleted and added again, nothing else before the next change
// (a fence: another endpoint removed).
func TestControllerRestartUnder100Backends(t *testing.T) {
	cp.Require(t)
	const backends, services = 100, 20
	kc := kubetest.Client{T: t, C: cp.Client()}
	ns := kubetest.Namespace(t, cp.Client())
	name := kubetest.UniqueName("restart")
	var created []*discovery.EndpointSlice
	for i := range services {
		svc := kc.CreateService(kubetest.Service(ns, fmt.Sprintf("svc-%02d", i), name))
		var eps []kubetest.EP
		for j := range 3 {
			eps = append(eps, kubetest.EP{IP: fmt.Sprintf("10.70.%d.%d", i, j+1), Node: fmt.Sprintf("node-%03d", (i*3+j)%backends)})
		}
		created = append(created, kc.CreateSlice(kubetest.Slice(svc, fmt.Sprintf("svc-%02d-1", i), eps...)))
	}

	bin := e2e.Build(t, "cmd/kpng")
	sock := "unix://" + filepath.Join(t.TempDir(), "kpng.sock")
	args := []string{"kube", "--kubeconfig=" + cp.KubeconfigPath(), "--service-proxy-name=" + name, "to-api", "--listen=" + sock}
	controller := e2e.Start(t, bin, args...)

	checkers := make([]*sinktest.Checker, backends)
	for i := range backends {
		checkers[i] = sinktest.NewChecker(nil)
		cfg := remote.Config{Address: sock, NodeName: fmt.Sprintf("node-%03d", i), MinBackoff: 100 * time.Millisecond, MaxBackoff: 500 * time.Millisecond}
		sinktest.RunSource(t, cfg.NodeName, checkers[i], func(ctx context.Context, sink localsink.Sink) error {
			return remote.Run(ctx, cfg, sink)
		})
	}
	waitAll(t, checkers, 1)
	for i, c := range checkers {
		calls := c.TakeCalls()
		if len(calls) != services+2 || calls[0] != "Reset" {
			t.Fatalf("backend %d's first state: %q, want Reset, %d services, Sync", i, calls, services)
		}
	}

	// The controller crashes; meanwhile an endpoint goes.
	start := time.Now()
	controller.Kill(t)
	s := created[7]
	removed := s.Endpoints[1].Addresses[0]
	s.Endpoints = slices.Delete(s.Endpoints, 1, 2)
	kc.UpdateSlice(s)
	time.Sleep(300 * time.Millisecond)
	e2e.Start(t, bin, args...)
	waitAll(t, checkers, 2)
	t.Logf("%d backends got the change %v after the controller was killed", backends, time.Since(start).Round(time.Millisecond))

	// Anything more that the restart would send comes before a later
	// change: another endpoint removed, a fence every backend waits for.
	fence := created[8]
	fenced := fence.Endpoints[0].Addresses[0]
	fence.Endpoints = fence.Endpoints[1:]
	kc.UpdateSlice(fence)
	waitAll(t, checkers, 3)
	want := []string{fmt.Sprintf("Update %s/svc-07 -%s", ns, removed), "Sync", fmt.Sprintf("Update %s/svc-08 -%s", ns, fenced), "Sync"}
	for i, c := range checkers {
		if calls := c.TakeCalls(); !slices.Equal(calls, want) {
			t.Errorf("backend %d after the restart: %q, want only %q", i, calls, want)
		}
	}
}

// waitAll waits until every checker received n Syncs, and fails the test
// (from its own goroutine) naming the backends that did not.
func waitAll(t *testing.T, checkers []*sinktest.Checker, n int) {
	t.Helper()
	errs := make([]error, len(checkers))
	var wg sync.WaitGroup
	for i, c := range checkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.AwaitSyncs(n, time.Minute); err != nil {
				errs[i] = fmt.Errorf("backend %d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}
