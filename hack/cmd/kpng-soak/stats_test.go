//go:build linux

package main

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// metricsText is a scrape as kpng serves it, cut down.
const metricsText = `# HELP go_goroutines Number of goroutines that currently exist.
# TYPE go_goroutines gauge
go_goroutines 42
# HELP kpng_rounds_total Rounds delivered.
# TYPE kpng_rounds_total counter
kpng_rounds_total{kind="change",service_proxy_name=""} 10
kpng_rounds_total{kind="reset",service_proxy_name=""} 1
# HELP kpng_network_programming_duration_seconds Latency.
# TYPE kpng_network_programming_duration_seconds histogram
kpng_network_programming_duration_seconds_bucket{service_proxy_name="",le="0.25"} 50
kpng_network_programming_duration_seconds_bucket{service_proxy_name="",le="0.5"} 90
kpng_network_programming_duration_seconds_bucket{service_proxy_name="",le="1"} 100
kpng_network_programming_duration_seconds_bucket{service_proxy_name="",le="+Inf"} 100
kpng_network_programming_duration_seconds_sum{service_proxy_name=""} 20
kpng_network_programming_duration_seconds_count{service_proxy_name=""} 100
`

func TestParseMetrics(t *testing.T) {
	s, err := parseMetrics(strings.NewReader(metricsText))
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Values["go_goroutines"]; got != 42 {
		t.Errorf("go_goroutines = %v, want 42", got)
	}
	if got := s.Values["kpng_rounds_total"]; got != 11 {
		t.Errorf("kpng_rounds_total = %v, want 11 (summed over kinds)", got)
	}
	want := histogram{Bounds: []float64{0.25, 0.5, 1, math.Inf(1)}, Counts: []float64{50, 90, 100, 100}, Count: 100, Sum: 20}
	if diff := cmp.Diff(want, s.Histograms[latencyMetric]); diff != "" {
		t.Errorf("histogram (-want +got):\n%s", diff)
	}
}

func TestQuantile(t *testing.T) {
	h := histogram{Bounds: []float64{0.25, 0.5, 1, math.Inf(1)}, Counts: []float64{50, 90, 100, 110}, Count: 110}
	for _, tc := range []struct {
		q         float64
		want      float64
		wantAbove bool
	}{
		{q: 0.1, want: 0.25},                // rank 11: in the first bucket
		{q: 0.5, want: 0.5},                 // rank 55: in (0.25, 0.5]
		{q: 0.9, want: 1},                   // rank 99: in (0.5, 1]
		{q: 0.99, want: 1, wantAbove: true}, // rank 108.9: in +Inf
	} {
		got, above := h.quantile(tc.q)
		if got != tc.want || above != tc.wantAbove {
			t.Errorf("quantile(%v) = %v, %v; want %v, %v", tc.q, got, above, tc.want, tc.wantAbove)
		}
	}
	if got, _ := (histogram{}).quantile(0.5); !math.IsNaN(got) {
		t.Errorf("quantile of an empty histogram = %v, want NaN", got)
	}
	for _, tc := range []struct {
		v     float64
		above bool
		want  string
	}{{0.25, false, "≤250"}, {0.002, false, "≤2"}, {300, true, ">300000"}, {math.NaN(), false, "–"}} {
		if got := quantileText(tc.v, tc.above); got != tc.want {
			t.Errorf("quantileText(%v, %v) = %q, want %q", tc.v, tc.above, got, tc.want)
		}
	}
}

func TestHistogramSub(t *testing.T) {
	old := histogram{Bounds: []float64{1, math.Inf(1)}, Counts: []float64{3, 4}, Count: 4, Sum: 2}
	now := histogram{Bounds: []float64{1, math.Inf(1)}, Counts: []float64{10, 14}, Count: 14, Sum: 7}
	want := histogram{Bounds: []float64{1, math.Inf(1)}, Counts: []float64{7, 10}, Count: 10, Sum: 5}
	if diff := cmp.Diff(want, now.sub(old)); diff != "" {
		t.Errorf("sub (-want +got):\n%s", diff)
	}
	if got := now.sub(old).mean(); got != 0.5 {
		t.Errorf("mean of the difference = %v, want 0.5", got)
	}
	// A restarted process: its counts fell; the new ones are taken whole.
	if diff := cmp.Diff(old, old.sub(now)); diff != "" {
		t.Errorf("sub after a restart (-want +got):\n%s", diff)
	}
}

// TestWindows checks that each window takes the medians of its own
// samples and the histogram samples observed since the window before.
func TestWindows(t *testing.T) {
	hist := func(fast, slow float64) histogram {
		return histogram{Bounds: []float64{0.1, 1, math.Inf(1)}, Counts: []float64{fast, fast + slow, fast + slow}, Count: fast + slow}
	}
	smp := func(at time.Duration, goroutines float64, h histogram) sample {
		return sample{at: at, s: scrape{Values: map[string]float64{"go_goroutines": goroutines}, Histograms: map[string]histogram{latencyMetric: h}}}
	}
	base := scrape{Histograms: map[string]histogram{latencyMetric: hist(5, 0)}}
	samples := []sample{
		smp(10*time.Second, 10, hist(10, 0)),
		smp(20*time.Second, 30, hist(20, 0)),
		smp(50*time.Second, 20, hist(25, 0)),
		// The second window is empty; the third has only slow rounds;
		// the fourth has too few samples.
		smp(130*time.Second, 40, hist(25, 10)),
		smp(140*time.Second, 40, hist(25, 10)),
		smp(190*time.Second, 50, hist(25, 20)),
	}
	ws := windowsOf(samples, time.Minute, base, 2)
	if len(ws) != 2 {
		t.Fatalf("%d windows, want 2: %+v", len(ws), ws)
	}
	if g := gauges[3].name; g != "goroutines" {
		t.Fatalf("gauge 3 is %s, want goroutines", g)
	}
	if ws[0].medians[3] != 20 || ws[1].medians[3] != 40 {
		t.Errorf("goroutine medians %v, %v; want 20, 40", ws[0].medians[3], ws[1].medians[3])
	}
	if ws[0].latencyCount != 20 || ws[1].latencyCount != 10 {
		t.Errorf("latency samples %v, %v; want 20 (25 less the 5 before the first window), 10", ws[0].latencyCount, ws[1].latencyCount)
	}
	if ws[0].latP99 > 0.1 || ws[1].latP50 <= 0.1 {
		t.Errorf("percentiles: first window p99 %v (want ≤ 0.1 s), last p50 %v (want > 0.1 s)", ws[0].latP99, ws[1].latP50)
	}
}

// TestSummarizeJudges checks the limits: a heap goal, RSS, goroutine or
// open-file median that grew past them fails the soak, the allocated heap
// does not, nor a failed comparison that was skipped.
func TestSummarizeJudges(t *testing.T) {
	cfg := config{services: 10, endpoints: 1, duration: 2 * time.Minute, rate: 1, sample: 10 * time.Second, window: time.Minute, maxGrowth: 0.2, maxExtra: 2}
	samples := func(last map[string]float64, lastRSS float64) []sample {
		var out []sample
		for i := 1; i < 12; i++ {
			v := map[string]float64{"go_memstats_heap_alloc_bytes": 100, "go_memstats_next_gc_bytes": 200, "go_goroutines": 50, "process_open_fds": 15}
			rss := 300.0
			if i >= 6 {
				for k, x := range last {
					v[k] = x
				}
				rss = lastRSS
			}
			out = append(out, sample{at: time.Duration(i) * 10 * time.Second, s: scrape{Values: v}, vmRSS: rss})
		}
		return out
	}
	for _, tc := range []struct {
		name     string
		last     map[string]float64
		lastRSS  float64
		wantFail string
	}{
		{name: "flat", lastRSS: 310},
		{name: "allocated heap doubled", last: map[string]float64{"go_memstats_heap_alloc_bytes": 200}, lastRSS: 300},
		{name: "heap goal +30%", last: map[string]float64{"go_memstats_next_gc_bytes": 260}, lastRSS: 300, wantFail: "heap_goal_bytes"},
		{name: "RSS +30%", lastRSS: 390, wantFail: "rss_bytes"},
		{name: "3 more goroutines", last: map[string]float64{"go_goroutines": 53}, lastRSS: 300, wantFail: "goroutines"},
		{name: "3 more files", last: map[string]float64{"process_open_fds": 18}, lastRSS: 300, wantFail: "open_fds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sum := summarize(cfg, samples(tc.last, tc.lastRSS), 100, time.Second, scrape{}, scrape{}, comparison{skipped: true})
			if len(sum.windows) != 2 {
				t.Fatalf("%d windows, want 2", len(sum.windows))
			}
			got := strings.Join(sum.failures, "; ")
			if tc.wantFail == "" && got != "" {
				t.Errorf("failures %q, want none", got)
			}
			if tc.wantFail != "" && (len(sum.failures) != 1 || !strings.Contains(got, tc.wantFail)) {
				t.Errorf("failures %q, want one about %s", got, tc.wantFail)
			}
		})
	}
}
