package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// ginkgoReport is the part of ginkgo's JSON report read here: each test's
// name and the output it wrote.
type ginkgoReport []struct {
	SpecReports []struct {
		ContainerHierarchyTexts    []string
		LeafNodeText               string
		State                      string
		CapturedGinkgoWriterOutput string
	}
}

// percentile is a line of the "Service endpoints latency" test's output:
// "50 %ile: 992.137963ms".
var percentile = regexp.MustCompile(`(\d+) %ile: (\S+)`)

// EndpointsLatency reads, from DIR/report.json, the percentiles the
// "Service endpoints latency" test printed: the time from a Service's
// creation until its Endpoints are seen through the API (the control
// plane's figure: no proxier is on that path). Empty when it did not run
// or DIR has no report.json.
func EndpointsLatency(dir string) (map[string]time.Duration, error) {
	b, err := os.ReadFile(filepath.Join(dir, "report.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil // a run without it: no figures, the table stands
	}
	if err != nil {
		return nil, fmt.Errorf("reading ginkgo's report of %s: %w", dir, err)
	}
	var r ginkgoReport
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s/report.json: %w", dir, err)
	}
	out := map[string]time.Duration{}
	for _, s := range r {
		for _, sp := range s.SpecReports {
			if !strings.Contains(strings.Join(sp.ContainerHierarchyTexts, " "), "Service endpoints latency") || sp.State != "passed" {
				continue
			}
			for _, m := range percentile.FindAllStringSubmatch(sp.CapturedGinkgoWriterOutput, -1) {
				d, err := time.ParseDuration(m[2])
				if err != nil {
					return nil, fmt.Errorf("%s: the %s percentile %q: %w", dir, m[1], m[2], err)
				}
				out["p"+m[1]] = d
			}
		}
	}
	return out, nil
}

// BothPassedTime is the time the tests that passed in every run took in
// each: the Services tests wait until traffic follows each change, so the
// sums compare how soon the proxiers made it follow, on the same tests.
func BothPassedTime(runs []*Run) (int, []time.Duration) {
	sums := make([]time.Duration, len(runs))
	n := 0
	for name, res := range runs[0].Results {
		if res.State != Passed {
			continue
		}
		all := true
		for _, r := range runs[1:] {
			if r.Results[name].State != Passed {
				all = false
			}
		}
		if !all {
			continue
		}
		n++
		for i, r := range runs {
			sums[i] += r.Results[name].Duration
		}
	}
	return n, sums
}
