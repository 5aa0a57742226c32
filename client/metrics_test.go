package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sigs.k8s.io/kpng/backends/healthcheck"
	"sigs.k8s.io/kpng/client/metrics"
	"sigs.k8s.io/kpng/internal/kubetest"
	"sigs.k8s.io/kpng/internal/promtest"
	"sigs.k8s.io/kpng/internal/testio"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

// failingSink is a sink whose Sync fails while fail is set.
type failingSink struct{ fail atomic.Bool }

func (s *failingSink) Reset()                                                                    {}
func (s *failingSink) Update(model.ServiceKey, *model.ServiceEndpoints, *model.ServiceEndpoints) {}
func (s *failingSink) Sync() error {
	if s.fail.Load() {
		return errors.New("the backend could not apply the round")
	}
	return nil
}

// counters scrapes addr's /metrics with Prometheus' text parser and
// returns the kpng counters, gauges and histograms (their sample count),
// summed over their labels.
func counters(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	families := promtest.Scrape(t, addr)
	out := map[string]float64{}
	for name, f := range families {
		if strings.HasPrefix(name, "kpng_") {
			for _, m := range f.GetMetric() {
				switch {
				case m.GetCounter() != nil:
					out[name] += m.GetCounter().GetValue()
				case m.GetGauge() != nil:
					out[name] += m.GetGauge().GetValue()
				case m.GetHistogram() != nil:
					out[name] += float64(m.GetHistogram().GetSampleCount())
				}
			}
		}
	}
	return out
}

// status returns the HTTP status of GET addr/path.
func status(t *testing.T, addr, path string) int {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// waitFor polls cond for up to 30 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// loopback is the health check Config of the tests: the node's one
// address is 127.0.0.1, selected explicitly (the default leaves loopback
// out).
var loopback = healthcheck.Config{
	Addresses:         func() ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil },
	NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
}

// createNode creates a Node named uniquely and returns its name.
func createNode(t *testing.T) string {
	t.Helper()
	name := kubetest.UniqueName("node")
	if _, err := cp.Client().CoreV1().Nodes().Create(context.Background(), &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return name
}

// runWithMetrics runs f with sink until the test ends, and waits for its
// servers.
func runWithMetrics(t *testing.T, f *Flags, sink localsink.Sink) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx, sink) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	waitFor(t, "the servers", func() bool {
		for _, a := range []string{f.MetricsBindAddress, f.HealthzBindAddress} {
			c, err := net.Dial("tcp", a)
			if err != nil {
				return false
			}
			c.Close()
		}
		return true
	})
}

// TestMetricsAndHealth runs the watcher with --metrics-bind-address and
// --healthz-bind-address against the real API server, with a backend
// beside a health check node port: one endpoint change moves the change
// counters by exactly one and records exactly one network programming
// latency sample; a backend whose rounds fail turns /healthz, /livez and
// the health check node port to 503 after --healthz-timeout, and back to
// 200 after a success; the debug endpoint lists the service.
func TestMetricsAndHealth(t *testing.T) {
	cp.Require(t)
	kc := kubetest.Client{T: t, C: cp.Client()}
	ns := kubetest.Namespace(t, cp.Client())
	name := kubetest.UniqueName("metrics")
	node := createNode(t)
	svc := kc.CreateService(kubetest.Service(ns, "a", name, func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	}))
	hcPort := svc.Spec.HealthCheckNodePort
	slice := kc.CreateSlice(kubetest.Slice(svc, "a-1", kubetest.EP{IP: "10.8.0.1", Node: node}))

	f := Flags{Kubeconfig: cp.KubeconfigPath(), ServiceProxyName: name, NodeName: node,
		MetricsBindAddress: testio.FreeAddr(t), HealthzBindAddress: testio.FreeAddr(t), HealthzTimeout: time.Second}
	f.DebugBindAddress = f.MetricsBindAddress
	// Started before Run, so that the health check port asks its
	// Recorder: the servers are the test's, closed at its end.
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	rec, err := f.StartMetrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hcCfg := loopback
	hcCfg.Healthy = rec.Healthy
	hc, err := healthcheck.New(ctx, hcCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	sink := &failingSink{}
	runWithMetrics(t, &f, localsink.Tee(sink, hc))
	metricsAddr, healthAddr, hcAddr := f.MetricsBindAddress, f.HealthzBindAddress, fmt.Sprintf("127.0.0.1:%d", hcPort)

	waitFor(t, "the first round", func() bool { return counters(t, metricsAddr)["kpng_sync_proxy_rules_service_changes_total"] == 1 })
	waitFor(t, "/healthz 200 (the node exists)", func() bool { return status(t, healthAddr, "/healthz") == http.StatusOK })
	if c := status(t, hcAddr, "/"); c != http.StatusOK {
		t.Errorf("health check node port %d: %d, want 200 (one local endpoint)", hcPort, c)
	}
	before := counters(t, metricsAddr)
	slice.Endpoints[0].Addresses = []string{"10.8.0.2"}
	// As the EndpointSlice controller does.
	slice.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: time.Now().Format(time.RFC3339Nano)}
	slice = kc.UpdateSlice(slice)
	waitFor(t, "the change's round", func() bool {
		return counters(t, metricsAddr)["kpng_sync_proxy_rules_service_changes_total"] == before["kpng_sync_proxy_rules_service_changes_total"]+1
	})
	after := counters(t, metricsAddr)
	// The endpoint 10.8.0.1 went and 10.8.0.2 came: two endpoint changes
	// in one service change, in one round, from one event, applied.
	for name, want := range map[string]float64{
		"kpng_sync_proxy_rules_endpoint_changes_total": 2, "kpng_rounds_total": 1, "kpng_sync_proxy_rules_failures_total": 0,
		"kpng_network_programming_duration_seconds": 1, "kpng_events_total": 1, "kpng_event_delivery_duration_seconds": 1,
		"kpng_services": 0, "kpng_endpoints": 0,
	} {
		if got := after[name] - before[name]; got != want {
			t.Errorf("%s moved by %v, want %v", name, got, want)
		}
	}
	if after["kpng_services"] != 1 || after["kpng_endpoints"] != 1 {
		t.Errorf("held: %v services, %v endpoints; want 1, 1", after["kpng_services"], after["kpng_endpoints"])
	}
	for _, p := range []string{"/healthz", "/livez"} {
		if c := status(t, healthAddr, p); c != http.StatusOK {
			t.Errorf("%s: %d, want 200", p, c)
		}
	}
	debug := get(t, metricsAddr, metrics.DebugPath)
	if !strings.Contains(debug, `"Name": "a"`) || !strings.Contains(debug, `"10.8.0.2"`) {
		t.Errorf("the debug endpoint does not list service a with 10.8.0.2:\n%s", debug)
	}

	// The backend fails: unhealthy after the timeout, healthy again after
	// a success (kpng retries the round).
	sink.fail.Store(true)
	slice.Endpoints[0].Addresses = []string{"10.8.0.3"}
	kc.UpdateSlice(slice)
	waitFor(t, "/healthz 503", func() bool { return status(t, healthAddr, "/healthz") == http.StatusServiceUnavailable })
	if c := status(t, healthAddr, "/livez"); c != http.StatusServiceUnavailable {
		t.Errorf("/livez while failing: %d, want 503", c)
	}
	if c := status(t, hcAddr, "/"); c != http.StatusServiceUnavailable {
		t.Errorf("health check node port while failing: %d, want 503", c)
	}
	m := counters(t, metricsAddr)
	if m["kpng_sync_proxy_rules_failures_total"] < 1 || m["kpng_sync_proxy_rules_service_changes_pending"] != 1 {
		t.Errorf("failures counted: %v, pending service changes: %v (want 1)", m["kpng_sync_proxy_rules_failures_total"], m["kpng_sync_proxy_rules_service_changes_pending"])
	}
	sink.fail.Store(false)
	waitFor(t, "/healthz 200 after a success", func() bool { return status(t, healthAddr, "/healthz") == http.StatusOK })
	if c := status(t, hcAddr, "/"); c != http.StatusOK {
		t.Errorf("health check node port after a success: %d, want 200", c)
	}
}

// TestHealthzNodeEligibility: /healthz requires the node to be eligible
// (KEP-3836): tainted ToBeDeletedByClusterAutoscaler or deleted, it
// answers 503; /livez does not look at the node.
func TestHealthzNodeEligibility(t *testing.T) {
	cp.Require(t)
	node := createNode(t)
	f := Flags{Kubeconfig: cp.KubeconfigPath(), ServiceProxyName: kubetest.UniqueName("elig"), NodeName: node,
		MetricsBindAddress: testio.FreeAddr(t), HealthzBindAddress: testio.FreeAddr(t), HealthzTimeout: time.Minute}
	runWithMetrics(t, &f, &failingSink{})
	addr := f.HealthzBindAddress
	expect := func(what string, healthz int) {
		t.Helper()
		waitFor(t, fmt.Sprintf("/healthz %d (%s)", healthz, what), func() bool { return status(t, addr, "/healthz") == healthz })
		if c := status(t, addr, "/livez"); c != http.StatusOK {
			t.Errorf("%s: /livez %d, want 200", what, c)
		}
	}
	expect("the node exists", http.StatusOK)
	nodes := cp.Client().CoreV1().Nodes()
	ctx := context.Background()
	n, err := nodes.Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Spec.Taints = []v1.Taint{{Key: "ToBeDeletedByClusterAutoscaler", Effect: v1.TaintEffectNoSchedule}}
	if n, err = nodes.Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("the node is tainted", http.StatusServiceUnavailable)
	if body := get(t, addr, "/healthz"); !strings.Contains(body, `"nodeEligible":false`) {
		t.Errorf("/healthz body %s, want nodeEligible false", body)
	}
	if body := get(t, addr, "/livez"); strings.Contains(body, "nodeEligible") {
		t.Errorf("/livez body %s, want no nodeEligible", body)
	}
	n.Spec.Taints = nil
	if _, err = nodes.Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("the taint is removed", http.StatusOK)
	if err := nodes.Delete(ctx, node, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("the node is deleted", http.StatusServiceUnavailable)
}

// get returns the body of GET addr/path.
func get(t *testing.T, addr, path string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestMetricsServersEndWithRun: a Run that fails early closes the servers
// it opened, so that the next Run can open them again.
func TestMetricsServersEndWithRun(t *testing.T) {
	addr := testio.FreeAddr(t)
	f := Flags{Kubeconfig: "/nonexistent/kubeconfig", MetricsBindAddress: addr}
	for i := range 2 {
		err := f.Run(context.Background(), &failingSink{})
		if err == nil || strings.Contains(err.Error(), "address already in use") {
			t.Fatalf("Run %d: %v, want the kubeconfig's error", i, err)
		}
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			t.Errorf("Run %d returned, its metrics server still answers", i)
		}
	}
}

// TestDebugEndpointOnlyWhereAsked starts the servers of Flags on real
// loopback ports: without --debug-bind-address no server answers the
// debug endpoint (the metrics and health servers answer 404 there); with
// it equal to the metrics address, that one server answers both; with an
// address of its own, the debug endpoint is there and not on the metrics
// address.
func TestDebugEndpointOnlyWhereAsked(t *testing.T) {
	start := func(t *testing.T, f *Flags) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		if _, err := f.StartMetrics(ctx); err != nil {
			cancel()
			t.Fatal(err)
		}
		t.Cleanup(func() { cancel(); f.stopMetrics() })
	}
	t.Run("off by default", func(t *testing.T) {
		f := Flags{MetricsBindAddress: testio.FreeAddr(t), HealthzBindAddress: testio.FreeAddr(t)}
		start(t, &f)
		for addr, path := range map[string]string{f.MetricsBindAddress: "/metrics", f.HealthzBindAddress: "/healthz"} {
			if got := status(t, addr, path); got != http.StatusOK {
				t.Errorf("GET %s%s: %d, want 200", addr, path, got)
			}
			if got := status(t, addr, metrics.DebugPath); got != http.StatusNotFound {
				t.Errorf("without --debug-bind-address, GET %s%s: %d, want 404", addr, metrics.DebugPath, got)
			}
		}
	})
	t.Run("beside the metrics", func(t *testing.T) {
		f := Flags{MetricsBindAddress: testio.FreeAddr(t), HealthzBindAddress: testio.FreeAddr(t)}
		f.DebugBindAddress = f.MetricsBindAddress
		start(t, &f)
		for path, want := range map[string]int{"/metrics": 200, metrics.DebugPath: 200, "/healthz": 404} {
			if got := status(t, f.MetricsBindAddress, path); got != want {
				t.Errorf("GET %s%s: %d, want %d", f.MetricsBindAddress, path, got, want)
			}
		}
		if got := status(t, f.HealthzBindAddress, metrics.DebugPath); got != http.StatusNotFound {
			t.Errorf("GET %s%s (health): %d, want 404", f.HealthzBindAddress, metrics.DebugPath, got)
		}
	})
	t.Run("its own address", func(t *testing.T) {
		f := Flags{MetricsBindAddress: testio.FreeAddr(t), DebugBindAddress: testio.FreeAddr(t)}
		start(t, &f)
		if got := status(t, f.DebugBindAddress, metrics.DebugPath); got != http.StatusOK {
			t.Errorf("GET %s%s: %d, want 200", f.DebugBindAddress, metrics.DebugPath, got)
		}
		if got := status(t, f.MetricsBindAddress, metrics.DebugPath); got != http.StatusNotFound {
			t.Errorf("GET %s%s (metrics): %d, want 404", f.MetricsBindAddress, metrics.DebugPath, got)
		}
		if got := status(t, f.DebugBindAddress, "/metrics"); got != http.StatusNotFound {
			t.Errorf("GET %s/metrics (debug): %d, want 404", f.DebugBindAddress, got)
		}
	})
}
