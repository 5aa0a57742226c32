package client

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	pmodel "github.com/prometheus/common/model"

	"sigs.k8s.io/kpng/client/model"
	"sigs.k8s.io/kpng/internal/kubetest"
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

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// counters scrapes addr's /metrics with Prometheus' text parser and
// returns the kpng counters.
func counters(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(pmodel.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	out := map[string]float64{}
	for name, f := range families {
		if strings.HasPrefix(name, "kpng_") {
			for _, m := range f.GetMetric() {
				if c := m.GetCounter(); c != nil {
					out[name] += c.GetValue()
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

// TestMetricsAndHealth runs the watcher with --metrics-bind-address and
// --healthz-bind-address against the real API server: one endpoint
// change moves the change counters by exactly one; a backend whose rounds
// fail turns /healthz and /livez to 503 after --healthz-timeout, and back
// to 200 after a success.
func TestMetricsAndHealth(t *testing.T) {
	cp.Require(t)
	kc := kubetest.Client{T: t, C: cp.Client()}
	ns := kubetest.Namespace(t, cp.Client())
	name := kubetest.UniqueName("metrics")
	svc := kc.CreateService(kubetest.Service(ns, "a", name))
	slice := kc.CreateSlice(kubetest.Slice(svc, "a-1", kubetest.EP{IP: "10.8.0.1", Node: "me"}))

	metricsAddr, healthAddr := freeAddr(t), freeAddr(t)
	f := Flags{Kubeconfig: cp.KubeconfigPath(), ServiceProxyName: name, NodeName: "me",
		MetricsBindAddress: metricsAddr, HealthzBindAddress: healthAddr, HealthzTimeout: time.Second}
	sink := &failingSink{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx, sink) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	waitFor(t, "the servers", func() bool {
		for _, a := range []string{metricsAddr, healthAddr} {
			c, err := net.Dial("tcp", a)
			if err != nil {
				return false
			}
			c.Close()
		}
		return true
	})
	waitFor(t, "the first round", func() bool { return counters(t, metricsAddr)["kpng_sync_proxy_rules_service_changes_total"] == 1 })
	before := counters(t, metricsAddr)
	slice.Endpoints[0].Addresses = []string{"10.8.0.2"}
	slice = kc.UpdateSlice(slice)
	waitFor(t, "the change's round", func() bool {
		return counters(t, metricsAddr)["kpng_sync_proxy_rules_service_changes_total"] == before["kpng_sync_proxy_rules_service_changes_total"]+1
	})
	after := counters(t, metricsAddr)
	// The endpoint 10.8.0.1 went and 10.8.0.2 came: two endpoint changes
	// in one service change, in one round.
	for name, want := range map[string]float64{"kpng_sync_proxy_rules_endpoint_changes_total": 2, "kpng_rounds_total": 1, "kpng_sync_proxy_rules_failures_total": 0} {
		if got := after[name] - before[name]; got != want {
			t.Errorf("%s moved by %v, want %v", name, got, want)
		}
	}
	for _, p := range []string{"/healthz", "/livez"} {
		if c := status(t, healthAddr, p); c != http.StatusOK {
			t.Errorf("%s: %d, want 200", p, c)
		}
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
	if got := counters(t, metricsAddr)["kpng_sync_proxy_rules_failures_total"]; got < 1 {
		t.Errorf("failures counted: %v", got)
	}
	sink.fail.Store(false)
	waitFor(t, "/healthz 200 after a success", func() bool { return status(t, healthAddr, "/healthz") == http.StatusOK })
}

// TestMetricsServersEndWithRun: a Run that fails early closes the servers
// it opened, so that the next Run can open them again.
func TestMetricsServersEndWithRun(t *testing.T) {
	addr := freeAddr(t)
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
