//go:build linux

package main

import (
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"sigs.k8s.io/kpng/internal/promtest"
)

// histogram is a cumulative Prometheus histogram at one scrape: the
// upper bounds of its buckets, ascending, with the count of samples at or
// below each (the +Inf bucket last), the number of samples and their sum.
type histogram struct {
	Bounds []float64
	Counts []float64
	Count  float64
	Sum    float64
}

// sub returns h - old: the samples observed between the two scrapes.
// A histogram whose buckets differ (the process restarted) gives h.
func (h histogram) sub(old histogram) histogram {
	if !slices.Equal(h.Bounds, old.Bounds) || old.Count > h.Count {
		return h
	}
	out := histogram{Bounds: h.Bounds, Counts: make([]float64, len(h.Counts)), Count: h.Count - old.Count, Sum: h.Sum - old.Sum}
	for i := range h.Counts {
		out.Counts[i] = h.Counts[i] - old.Counts[i]
	}
	return out
}

// quantile returns an upper bound of the q-quantile of h: the upper
// bound of the bucket that holds its rank (kpng's buckets are coarse:
// the network programming latency's first is 250 ms, and an
// interpolation inside it, as Prometheus' histogram_quantile does, would
// report a figure nothing measured). A rank in the +Inf bucket gives the
// last finite bound, and above reports it (the quantile is beyond it).
// NaN when h holds no sample.
func (h histogram) quantile(q float64) (v float64, above bool) {
	if h.Count == 0 || len(h.Bounds) == 0 {
		return math.NaN(), false
	}
	rank := q * h.Count
	i := sort.Search(len(h.Counts), func(i int) bool { return h.Counts[i] >= rank })
	if i < len(h.Bounds) && !math.IsInf(h.Bounds[i], 1) {
		return h.Bounds[i], false
	}
	last := len(h.Bounds) - 1
	if math.IsInf(h.Bounds[last], 1) {
		last--
	}
	if last < 0 {
		return math.NaN(), true
	}
	return h.Bounds[last], true
}

// mean returns the mean of h's samples, NaN when it holds none.
func (h histogram) mean() float64 {
	if h.Count == 0 {
		return math.NaN()
	}
	return h.Sum / h.Count
}

// msText writes seconds in milliseconds, "–" for NaN.
func msText(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	return strconv.FormatFloat(v*1000, 'f', 1, 64)
}

// scrape is what one read of kpng's /metrics gave: plain values by name
// (counters and gauges, summed over their label sets) and histograms by
// name.
type scrape struct {
	Values     map[string]float64
	Histograms map[string]histogram
}

// parseMetrics parses the Prometheus text format with Prometheus' parser.
func parseMetrics(r io.Reader) (scrape, error) {
	families, err := promtest.Parse(r)
	if err != nil {
		return scrape{}, err
	}
	s := scrape{Values: map[string]float64{}, Histograms: map[string]histogram{}}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			switch f.GetType().String() {
			case "COUNTER":
				s.Values[name] += m.GetCounter().GetValue()
			case "GAUGE":
				s.Values[name] += m.GetGauge().GetValue()
			case "UNTYPED":
				s.Values[name] += m.GetUntyped().GetValue()
			case "HISTOGRAM":
				hm := m.GetHistogram()
				h := histogram{Count: float64(hm.GetSampleCount()), Sum: hm.GetSampleSum()}
				for _, b := range hm.GetBucket() {
					h.Bounds = append(h.Bounds, b.GetUpperBound())
					h.Counts = append(h.Counts, float64(b.GetCumulativeCount()))
				}
				if len(h.Bounds) == 0 || !math.IsInf(h.Bounds[len(h.Bounds)-1], 1) {
					h.Bounds = append(h.Bounds, math.Inf(1))
					h.Counts = append(h.Counts, h.Count)
				}
				s.Histograms[name] = h
			}
		}
	}
	return s, nil
}

// medianOf returns the median of xs (the mean of the two middle values
// for an even count), NaN for none.
func medianOf(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// quantileText writes a quantile's bound in milliseconds: "≤X", or ">X"
// when it lies beyond the last finite bucket, "–" when there was no
// sample.
func quantileText(v float64, above bool) string {
	if math.IsNaN(v) {
		return "–"
	}
	s := strconv.FormatFloat(v*1000, 'f', -1, 64)
	if above {
		return ">" + s
	}
	return "≤" + s
}

// csvEscape quotes a CSV field when it needs to be.
func csvEscape(s string) string {
	if strings.ContainsAny(s, ",\"\n") {
		return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
	}
	return s
}
