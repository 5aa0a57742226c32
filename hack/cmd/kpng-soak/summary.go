//go:build linux

package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// gauges are the per-sample values whose medians the summary compares:
// a name for the tables, how to read it from a sample, and whether the
// limits apply to it.
var gauges = []struct {
	name   string
	get    func(s sample) float64
	judged bool
}{
	// The allocated heap: reported, not judged: its median over a
	// window still follows the collector's sawtooth (+18% to +32%
	// between the first and last minutes of short smoke runs).
	{"heap_alloc_bytes", func(s sample) float64 { return s.s.Values["go_memstats_heap_alloc_bytes"] }, false},
	// The heap goal: twice the live heap after the last collection
	// (GOGC=100), without the sawtooth: the heap that is judged.
	{"heap_goal_bytes", func(s sample) float64 { return s.s.Values["go_memstats_next_gc_bytes"] }, true},
	{"rss_bytes", func(s sample) float64 { return s.vmRSS }, true},
	{"goroutines", func(s sample) float64 { return s.s.Values["go_goroutines"] }, true},
	{"open_fds", func(s sample) float64 { return s.s.Values["process_open_fds"] }, true},
}

// The histograms whose percentiles the summary gives per window.
const (
	latencyMetric  = "kpng_network_programming_duration_seconds"
	syncMetric     = "kpng_sync_proxy_rules_duration_seconds"
	deliveryMetric = "kpng_event_delivery_duration_seconds"
)

// window is one period of the soak: the medians of the gauges over its
// samples, and the percentiles of what the histograms observed in it.
type window struct {
	from, to     time.Duration
	samples      int
	changes      int64
	medians      []float64 // by gauges
	latencyCount float64
	latP50       float64
	latP50Above  bool
	latP99       float64
	latP99Above  bool
	syncP50      float64
	syncP50Above bool
	syncP99      float64
	syncP99Above bool
	delP50       float64
	delP50Above  bool
	delP99       float64
	delP99Above  bool
	// The means of the histograms (their sums over their counts).
	latMean, syncMean, delMean float64
}

// summary is the soak's result.
type summary struct {
	windows  []window
	csv      string // samples.csv
	wcsv     string // windows.csv
	markdown string // summary.md
	failures []string
}

// windowsOf cuts samples into windows of length d from 0 and computes
// each. The histograms of a window are the difference between its last
// sample and the last sample before it (the first window: base, the
// scrape once the loaded state was applied, so that the cold start's
// round is left out).
//
// A window with fewer than minSamples samples (the last one, cut by the
// end of the churn) is left out.
func windowsOf(samples []sample, d time.Duration, base scrape, minSamples int) []window {
	var out []window
	prev := &sample{s: base}
	for from := time.Duration(0); ; from += d {
		var in []sample
		for _, s := range samples {
			if s.at >= from && s.at < from+d {
				in = append(in, s)
			}
		}
		if len(in) < max(1, minSamples) {
			if len(samples) == 0 || from > samples[len(samples)-1].at {
				return out
			}
			continue
		}
		w := window{from: from, to: from + d, samples: len(in)}
		for _, g := range gauges {
			var xs []float64
			for _, s := range in {
				xs = append(xs, g.get(s))
			}
			w.medians = append(w.medians, medianOf(xs))
		}
		last := in[len(in)-1]
		w.changes = last.changes - prev.changes
		lat := last.s.Histograms[latencyMetric].sub(prev.s.Histograms[latencyMetric])
		sync := last.s.Histograms[syncMetric].sub(prev.s.Histograms[syncMetric])
		del := last.s.Histograms[deliveryMetric].sub(prev.s.Histograms[deliveryMetric])
		w.latMean, w.syncMean, w.delMean = lat.mean(), sync.mean(), del.mean()
		w.delP50, w.delP50Above = del.quantile(0.5)
		w.delP99, w.delP99Above = del.quantile(0.99)
		w.latencyCount = lat.Count
		w.latP50, w.latP50Above = lat.quantile(0.5)
		w.latP99, w.latP99Above = lat.quantile(0.99)
		w.syncP50, w.syncP50Above = sync.quantile(0.5)
		w.syncP99, w.syncP99Above = sync.quantile(0.99)
		out = append(out, w)
		prev = &last
	}
}

// summarize computes the windows, checks the limits and writes the
// tables.
func summarize(cfg config, samples []sample, churned int64, cold time.Duration, base, last scrape, cmp comparison) summary {
	sum := summary{windows: windowsOf(samples, cfg.window, base, int(cfg.window/cfg.sample)/2)}
	var b strings.Builder
	b.WriteString("at_s,changes,heap_alloc_bytes,heap_goal_bytes,rss_bytes,process_resident_memory_bytes,goroutines,open_fds,services,endpoints,rounds,failures,latency_samples,sync_samples\n")
	for _, s := range samples {
		v := s.s.Values
		fmt.Fprintf(&b, "%.0f,%d,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f\n", s.at.Seconds(), s.changes,
			v["go_memstats_heap_alloc_bytes"], v["go_memstats_next_gc_bytes"], s.vmRSS, v["process_resident_memory_bytes"], v["go_goroutines"], v["process_open_fds"],
			v["kpng_services"], v["kpng_endpoints"], v["kpng_rounds_total"], v["kpng_sync_proxy_rules_failures_total"],
			s.s.Histograms[latencyMetric].Count, s.s.Histograms[syncMetric].Count)
	}
	sum.csv = b.String()

	b.Reset()
	b.WriteString("from_s,to_s,samples,changes,heap_alloc_bytes,heap_goal_bytes,rss_bytes,goroutines,open_fds,latency_samples,latency_p50_ms,latency_p99_ms,latency_mean_ms,sync_p50_ms,sync_p99_ms,sync_mean_ms,delivery_p50_ms,delivery_p99_ms,delivery_mean_ms\n")
	for _, w := range sum.windows {
		fmt.Fprintf(&b, "%.0f,%.0f,%d,%d,%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%s,%s,%s,%s,%s,%s,%s,%s,%s\n", w.from.Seconds(), w.to.Seconds(), w.samples, w.changes,
			w.medians[0], w.medians[1], w.medians[2], w.medians[3], w.medians[4], w.latencyCount,
			csvEscape(quantileText(w.latP50, w.latP50Above)), csvEscape(quantileText(w.latP99, w.latP99Above)), msText(w.latMean),
			csvEscape(quantileText(w.syncP50, w.syncP50Above)), csvEscape(quantileText(w.syncP99, w.syncP99Above)), msText(w.syncMean),
			csvEscape(quantileText(w.delP50, w.delP50Above)), csvEscape(quantileText(w.delP99, w.delP99Above)), msText(w.delMean))
	}
	sum.wcsv = b.String()

	b.Reset()
	host, _ := os.Hostname()
	fmt.Fprintf(&b, "kpng soak: %d services × %d endpoints, %s of churn at %.1f changes/s (made: %d, %.2f/s), seed %d, one sample every %s; machine %s: %s\n\n",
		cfg.services, cfg.endpoints, cfg.duration, cfg.rate, churned, float64(churned)/cfg.duration.Seconds(), cfg.seed, cfg.sample, host, machine())
	fmt.Fprintf(&b, "cold start (kpng started → the loaded state applied, seen by polling its metrics every 0.5 s): %s\n\n", cold.Round(time.Millisecond))
	b.WriteString("| window | samples | changes | heap (MiB) | heap goal (MiB) | RSS (MiB) | goroutines | open fds | latency samples | network programming p50 / p99 / mean (ms) | sync p50 / p99 / mean (ms) | event delivery p50 / p99 / mean (ms) |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, w := range sum.windows {
		fmt.Fprintf(&b, "| %s–%s | %d | %d | %.1f | %.1f | %.1f | %.0f | %.0f | %.0f | %s / %s / %s | %s / %s / %s | %s / %s / %s |\n",
			w.from, w.to, w.samples, w.changes, w.medians[0]/(1<<20), w.medians[1]/(1<<20), w.medians[2]/(1<<20), w.medians[3], w.medians[4], w.latencyCount,
			quantileText(w.latP50, w.latP50Above), quantileText(w.latP99, w.latP99Above), msText(w.latMean),
			quantileText(w.syncP50, w.syncP50Above), quantileText(w.syncP99, w.syncP99Above), msText(w.syncMean),
			quantileText(w.delP50, w.delP50Above), quantileText(w.delP99, w.delP99Above), msText(w.delMean))
	}
	b.WriteString("\n(medians of the samples in each window; heap goal: go_memstats_next_gc_bytes, twice the live heap after the last collection; percentiles as the upper bound of kpng's histogram bucket that holds them, \">X\": beyond the last bucket; network programming: from the slice's trigger time to the end of the round that applied it; sync: one round's delivery and Sync; event delivery: from a round's first informer event to its delivery, coalescing included)\n\n")

	if len(sum.windows) >= 2 {
		first, lastW := sum.windows[0], sum.windows[len(sum.windows)-1]
		b.WriteString("| gauge | first window | last window | change | limit | flat |\n|---|---|---|---|---|---|\n")
		for i, g := range gauges {
			f, l := first.medians[i], lastW.medians[i]
			ok, limit := true, "– (reported)"
			switch {
			case !g.judged:
			case strings.HasSuffix(g.name, "_bytes"):
				ok = l <= f*(1+cfg.maxGrowth)
				limit = fmt.Sprintf("+%.0f%%", cfg.maxGrowth*100)
			default:
				ok = l <= f+cfg.maxExtra
				limit = fmt.Sprintf("+%.0f", cfg.maxExtra)
			}
			fmt.Fprintf(&b, "| %s | %.0f | %.0f | %+.1f%% | %s | %v |\n", g.name, f, l, 100*(l-f)/f, limit, ok)
			if !ok {
				sum.failures = append(sum.failures, fmt.Sprintf("%s grew from %.0f to %.0f", g.name, f, l))
			}
		}
		b.WriteString("\n")
	} else {
		sum.failures = append(sum.failures, fmt.Sprintf("%d window(s): nothing to compare (--duration shorter than two --window)", len(sum.windows)))
	}
	failed := last.Values["kpng_sync_proxy_rules_failures_total"]
	fmt.Fprintf(&b, "after the churn: %.0f services, %.0f endpoints, %.0f rounds, %.0f failed rounds, %.0f network programming latency samples\n\n",
		last.Values["kpng_services"], last.Values["kpng_endpoints"], last.Values["kpng_rounds_total"], failed, last.Histograms[latencyMetric].Count)
	if failed > 0 {
		sum.failures = append(sum.failures, fmt.Sprintf("%.0f rounds failed", failed))
	}
	switch {
	case cmp.skipped:
		b.WriteString("kernel state: not compared (no --compare-test)\n")
	case cmp.equal:
		fmt.Fprintf(&b, "kernel state: the soaked table equals a fresh kpng's (its cold start %s), read back with the nft backend's kernel-state reader\n", cmp.fresh.Round(time.Millisecond))
	default:
		b.WriteString("kernel state: the soaked table DIFFERS from a fresh kpng's\n")
		sum.failures = append(sum.failures, "the soaked table differs from a fresh one")
	}
	if !cmp.skipped {
		b.WriteString("\n```\n" + cmp.output + "```\n")
	}
	if len(sum.failures) > 0 {
		fmt.Fprintf(&b, "\nFAILED: %s\n", strings.Join(sum.failures, "; "))
	} else {
		b.WriteString("\nPASSED\n")
	}
	sum.markdown = b.String()
	return sum
}

// write writes samples.csv, windows.csv and summary.md into dir.
func (s summary) write(dir string) error {
	for name, text := range map[string]string{"samples.csv": s.csv, "windows.csv": s.wcsv, "summary.md": s.markdown} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	return nil
}

// machine describes this machine: cores, memory, kernel.
func machine() string {
	cores := 0
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		cores = strings.Count(string(data), "\nprocessor")
		if strings.HasPrefix(string(data), "processor") {
			cores++
		}
	}
	mem := 0.0
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kib float64
		if _, err := fmt.Sscanf(string(data), "MemTotal: %f kB", &kib); err == nil {
			mem = kib / (1 << 20)
		}
	}
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	load, _ := os.ReadFile("/proc/loadavg")
	return fmt.Sprintf("%d cores, %.0f GiB, kernel %s, load at the end %s", cores, math.Round(mem), strings.TrimSpace(string(kernel)),
		strings.Join(strings.Fields(string(load))[:min(3, len(strings.Fields(string(load))))], " "))
}
