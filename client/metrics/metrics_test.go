package metrics

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"sigs.k8s.io/kpng/internal/promtest"
	"sigs.k8s.io/kpng/localsink"
)

// families returns the metric families r serves on /metrics, parsed with
// Prometheus' text parser.
func families(t *testing.T, r *Recorder) map[string]*dto.MetricFamily {
	t.Helper()
	rec := httptest.NewRecorder()
	r.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	families, err := promtest.Parse(strings.NewReader(rec.Body.String()))
	if err != nil {
		t.Fatalf("%v\n%s", err, rec.Body.String())
	}
	return families
}

// scrape fetches the metrics and parses them with Prometheus' own text
// parser: name, then "/" and each label value but service_proxy_name →
// the value of the sample (of a histogram: its sample count).
func scrape(t *testing.T, r *Recorder) map[string]float64 {
	t.Helper()
	families := families(t, r)
	out := map[string]float64{}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "service_proxy_name" && l.GetValue() != "p" {
					t.Errorf("%s: service_proxy_name=%q, want p", name, l.GetValue())
				}
			}
			key := name
			for _, l := range m.GetLabel() {
				if l.GetName() != "service_proxy_name" {
					key += "/" + l.GetValue()
				}
			}
			switch {
			case m.GetCounter() != nil:
				out[key] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[key] = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				out[key] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

// get answers path from the health handler.
func get(r *Recorder, path string) int {
	rec := httptest.NewRecorder()
	r.HealthHandler().ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	return rec.Code
}

func TestRecorder(t *testing.T) {
	now := time.Unix(1000, 0)
	r := New(Options{ServiceProxyName: "p", HealthTimeout: 10 * time.Second, Now: func() time.Time { return now }})
	r.Observe(localsink.Round{Start: now, Duration: 3 * time.Millisecond, Reset: true, Services: 5, Endpoints: 12})
	r.Observe(localsink.Round{Start: now.Add(time.Second), Duration: time.Millisecond, Services: 1, Endpoints: 1})
	m := scrape(t, r)
	for name, want := range map[string]float64{
		"kpng_sync_proxy_rules_duration_seconds":              2,
		"kpng_sync_proxy_rules_service_changes_total":         6,
		"kpng_sync_proxy_rules_endpoint_changes_total":        13,
		"kpng_rounds_total/reset":                             1,
		"kpng_rounds_total/change":                            1,
		"kpng_sync_proxy_rules_last_timestamp_seconds":        1001.001,
		"kpng_sync_proxy_rules_last_queued_timestamp_seconds": 0,
	} {
		if got := m[name]; got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if _, ok := m["go_goroutines"]; !ok {
		t.Error("no Go runtime metrics")
	}

	// A failed round: healthy until the timeout, then 503, until a success.
	now = now.Add(time.Minute)
	r.Observe(localsink.Round{Start: now, Duration: time.Millisecond, Services: 1, Err: errors.New("boom")})
	if c := get(r, "/healthz"); c != http.StatusOK {
		t.Errorf("/healthz right after a failure: %d, want 200", c)
	}
	now = now.Add(5 * time.Second)
	r.Observe(localsink.Round{Start: now, Duration: time.Millisecond, Retry: true, Err: errors.New("boom")})
	now = now.Add(6 * time.Second)
	for _, p := range []string{"/healthz", "/livez"} {
		if c := get(r, p); c != http.StatusServiceUnavailable {
			t.Errorf("%s 11 s after the first failure (timeout 10 s): %d, want 503", p, c)
		}
	}
	m = scrape(t, r)
	if m["kpng_sync_proxy_rules_failures_total"] != 2 || m["kpng_rounds_total/retry"] != 1 || m["kpng_sync_proxy_rules_last_queued_timestamp_seconds"] != 1060 {
		t.Errorf("after two failures: %v", m)
	}
	r.Observe(localsink.Round{Start: now, Duration: time.Millisecond, Retry: true})
	if c := get(r, "/healthz"); c != http.StatusOK {
		t.Errorf("/healthz after a success: %d, want 200", c)
	}
	m = scrape(t, r)
	if m["kpng_proxy_healthz_total/503"] != 1 || m["kpng_proxy_livez_total/503"] != 1 || m["kpng_proxy_healthz_total/200"] != 2 {
		t.Errorf("health answers counted: %v", m)
	}
}

// TestRecorderQueued: a proxier that never applies its first state, or
// whose Sync hangs on a queued change (Observe never comes), turns
// unhealthy after the timeout.
func TestRecorderQueued(t *testing.T) {
	now := time.Unix(1000, 0)
	r := New(Options{ServiceProxyName: "p", HealthTimeout: 10 * time.Second, Now: func() time.Time { return now }})
	if c := get(r, "/livez"); c != http.StatusOK {
		t.Errorf("/livez at start: %d, want 200", c)
	}
	now = now.Add(11 * time.Second)
	if c := get(r, "/livez"); c != http.StatusServiceUnavailable {
		t.Errorf("/livez 11 s after start without a round: %d, want 503", c)
	}
	r.Observe(localsink.Round{Start: now, Duration: time.Millisecond})
	if c := get(r, "/livez"); c != http.StatusOK {
		t.Errorf("/livez after the first round: %d, want 200", c)
	}
	r.Queued(now.Add(time.Second)) // its Sync hangs: no Observe
	now = now.Add(5 * time.Second)
	if c := get(r, "/healthz"); c != http.StatusOK {
		t.Errorf("/healthz 4 s into a hung Sync: %d, want 200", c)
	}
	now = now.Add(10 * time.Second)
	if c := get(r, "/healthz"); c != http.StatusServiceUnavailable {
		t.Errorf("/healthz 14 s into a hung Sync: %d, want 503", c)
	}
	if m := scrape(t, r); m["kpng_sync_proxy_rules_last_queued_timestamp_seconds"] != 1012 {
		t.Errorf("last queued: %v, want 1012", m["kpng_sync_proxy_rules_last_queued_timestamp_seconds"])
	}
}

// TestRecorderCounter: a backend's counter has the kpng_ prefix and the
// proxy name's label, and asking for it twice gives the same counter.
func TestRecorderCounter(t *testing.T) {
	r := New(Options{ServiceProxyName: "p"})
	c, err := r.Counter("sync_proxy_rules_nftables_sync_failures_total", "failures")
	if err != nil {
		t.Fatal(err)
	}
	again, err := r.Counter("sync_proxy_rules_nftables_sync_failures_total", "failures")
	if err != nil {
		t.Fatal(err)
	}
	c.Inc()
	again.Inc()
	if got := scrape(t, r)["kpng_sync_proxy_rules_nftables_sync_failures_total"]; got != 2 {
		t.Errorf("the counter scraped: %v, want 2", got)
	}
	if _, err := r.Counter("sync_proxy_rules_duration_seconds", "x"); err == nil {
		t.Error("a counter named as the Recorder's histogram: no error")
	}
}
