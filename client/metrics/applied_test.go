package metrics

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"sigs.k8s.io/kpng/localsink"
	kmodel "sigs.k8s.io/kpng/model"
)

// sec is the Unix time s (fractions allowed) as a time.
func sec(s float64) time.Time { return time.Unix(0, int64(s*1e9)) }

// TestRecorderAppliedLater: with AppliedLater, a round delivered without
// error is not applied: a change waits until Applied reports a state at
// least as new, so a backend that never applies turns /healthz and /livez
// 503 after the timeout, and the next success brings them back; the last
// sync and last queued timestamps and the network programming latency
// follow Applied.
func TestRecorderAppliedLater(t *testing.T) {
	now := sec(1000)
	r := New(Options{ServiceProxyName: "p", HealthTimeout: 10 * time.Second, AppliedLater: true, Now: func() time.Time { return now }})
	health := func(when string, want int) {
		t.Helper()
		for _, p := range []string{"/healthz", "/livez"} {
			if c := get(r, p); c != want {
				t.Errorf("%s %s: %d, want %d", p, when, c, want)
			}
		}
	}
	gauges := func(when string, lastSync, lastQueued float64, latencies int) {
		t.Helper()
		m := scrape(t, r)
		if m["kpng_sync_proxy_rules_last_timestamp_seconds"] != lastSync || m["kpng_sync_proxy_rules_last_queued_timestamp_seconds"] != lastQueued ||
			m["kpng_network_programming_duration_seconds"] != float64(latencies) {
			t.Errorf("%s: last sync %v, last queued %v, %v latency samples; want %v, %v, %v", when,
				m["kpng_sync_proxy_rules_last_timestamp_seconds"], m["kpng_sync_proxy_rules_last_queued_timestamp_seconds"],
				m["kpng_network_programming_duration_seconds"], lastSync, lastQueued, latencies)
		}
	}
	a := kmodel.ServiceKey{Namespace: "ns", Name: "a"}
	triggers := func(at float64) map[kmodel.ServiceKey][]time.Time {
		return map[kmodel.ServiceKey][]time.Time{a: {sec(at)}}
	}

	// The first state is delivered, and the backend does not apply it
	// (a callout that keeps failing).
	r.Queued(sec(1000.5))
	r.Observe(localsink.Round{Start: sec(1000.5), Duration: time.Millisecond, Reset: true, Services: 1, Triggers: triggers(999)})
	now = sec(1005)
	health("5 s after the start, the first state delivered, not applied", http.StatusOK)
	gauges("delivered, not applied", 0, 1000, 0)
	now = sec(1011)
	health("11 s after the start (timeout 10 s), the first state delivered, not applied", http.StatusServiceUnavailable)

	// The backend applies it.
	r.Applied(sec(1000.5))
	health("after Applied", http.StatusOK)
	gauges("after Applied", 1011, 0, 1)

	// Two rounds; the backend applies the first (delivered at 1012) at
	// 1020: the second waits since it was queued, at 1015.
	r.Queued(sec(1012))
	r.Observe(localsink.Round{Start: sec(1012), Duration: time.Millisecond, Services: 1, Triggers: triggers(1011)})
	r.Queued(sec(1015))
	r.Observe(localsink.Round{Start: sec(1015), Duration: time.Millisecond, Services: 1, Triggers: triggers(1014)})
	now = sec(1020)
	r.Applied(sec(1012.0005))
	gauges("the first of two rounds applied", 1020, 1015, 2)
	now = sec(1024)
	health("9 s after the second round was queued", http.StatusOK)
	now = sec(1026)
	health("11 s after the second round was queued", http.StatusServiceUnavailable)
	r.Applied(sec(1015.0005))
	health("after the second round is applied", http.StatusOK)
	gauges("both rounds applied", 1026, 0, 3)

	// The backend may apply a state before the round that delivered it
	// ends: its triggers are measured when it ends.
	now = sec(1030)
	r.Queued(sec(1030))
	r.Applied(sec(1030.0005))
	r.Observe(localsink.Round{Start: sec(1030), Duration: time.Millisecond, Services: 1, Triggers: triggers(1029)})
	gauges("a round applied before it ended", 1030, 0, 4)

	// A round the sink refuses, nothing else waiting: it waits since
	// its start; Applied of an older state changes nothing.
	r.Observe(localsink.Round{Start: sec(1031), Duration: time.Millisecond, Retry: true, Err: errors.New("boom")})
	r.Applied(sec(1030.0005))
	now = sec(1042)
	health("11 s after a refused round", http.StatusServiceUnavailable)
	gauges("after a refused round", 1030, 1031, 4)
	r.Observe(localsink.Round{Start: sec(1042), Duration: time.Millisecond, Retry: true})
	health("a retry delivered, not applied", http.StatusServiceUnavailable)
	r.Applied(sec(1042.0005))
	health("the retry applied", http.StatusOK)
}

// TestRecorderAppliedLaterBound: beyond maxWaiting queue times, a
// backend that catches up only in part waits since the state it applied:
// never less than the truth.
func TestRecorderAppliedLaterBound(t *testing.T) {
	now := sec(0)
	r := New(Options{ServiceProxyName: "p", HealthTimeout: time.Hour, AppliedLater: true, Now: func() time.Time { return now }})
	// Queued at 1 s, 2 s, ...: the construction time and maxWaiting-1
	// of them are listed.
	n := maxWaiting + 5
	for i := 1; i <= n; i++ {
		r.Queued(sec(float64(i)))
	}
	now = sec(float64(n + 1))
	lastQueued := func(when string, want float64) {
		t.Helper()
		if got := scrape(t, r)["kpng_sync_proxy_rules_last_queued_timestamp_seconds"]; got != want {
			t.Errorf("last queued %s: %v, want %v", when, got, want)
		}
	}
	r.Applied(sec(100.5))
	lastQueued("after Applied(100.5)", 101)
	r.Applied(sec(maxWaiting + 2.5))
	lastQueued("after Applied beyond the listed times", maxWaiting+2.5)
	r.Applied(sec(float64(n)))
	lastQueued("after Applied(the newest)", 0)
}

// TestRecorderAppliedWithoutAppliedLater: without AppliedLater, the rounds
// say what is applied, and Applied does nothing.
func TestRecorderAppliedWithoutAppliedLater(t *testing.T) {
	now := sec(1000)
	r := New(Options{ServiceProxyName: "p", HealthTimeout: 10 * time.Second, Now: func() time.Time { return now }})
	r.Observe(localsink.Round{Start: now, Duration: time.Millisecond})
	r.Queued(sec(1001)) // its Sync hangs
	now = sec(1020)
	r.Applied(sec(1010))
	if c := get(r, "/livez"); c != http.StatusServiceUnavailable {
		t.Errorf("/livez 19 s into a hung Sync, Applied called: %d, want 503", c)
	}
}
