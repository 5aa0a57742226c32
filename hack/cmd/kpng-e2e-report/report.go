package main

import (
	"encoding/xml"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// State is a test's result in one run.
type State string

// The results a test can have. Filtered are the tests the run did not
// select (its focus, or hack/e2e/skips.txt); Skipped the ones the suite
// itself skipped, saying why (not enough nodes, for example).
const (
	Passed   State = "passed"
	Failed   State = "failed"
	Skipped  State = "skipped"
	Filtered State = "filtered"
)

// Result is one test's result in one run.
type Result struct {
	State    State
	Duration time.Duration
	// Message is why it failed or was skipped (its first line).
	Message string
}

// Run is one proxier's run of the suite.
type Run struct {
	Proxier string
	// Results by the test's name (the spec's full text, without ginkgo's
	// "[It] " prefix).
	Results map[string]Result
}

// Count is how many tests of the run ended in state.
func (r *Run) Count(state State) int {
	n := 0
	for _, res := range r.Results {
		if res.State == state {
			n++
		}
	}
	return n
}

// junit is the part of ginkgo's JUnit report read here.
type junit struct {
	Suites []struct {
		Cases []struct {
			Name    string `xml:"name,attr"`
			Status  string `xml:"status,attr"`
			Time    string `xml:"time,attr"`
			Skipped *struct {
				Message string `xml:"message,attr"`
			} `xml:"skipped"`
			Failure *struct {
				Message string `xml:"message,attr"`
			} `xml:"failure"`
			Error *struct {
				Message string `xml:"message,attr"`
			} `xml:"error"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

// Load reads DIR/junit.xml, the report of one proxier's run.
func Load(dir string) (*Run, error) {
	path := filepath.Join(dir, "junit.xml")
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the report of %s: %w", dir, err)
	}
	var doc junit
	if err := xml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("%s: not a JUnit report: %w", path, err)
	}
	r := &Run{Proxier: proxierOf(dir), Results: map[string]Result{}}
	for _, s := range doc.Suites {
		for _, c := range s.Cases {
			name, ok := strings.CutPrefix(c.Name, "[It] ")
			if !ok {
				// The suite's own nodes ([SynchronizedBeforeSuite], ...):
				// a failure there fails every test, which the tests show.
				continue
			}
			name = withoutLabels(name)
			res := Result{}
			if c.Time != "" {
				secs, err := strconv.ParseFloat(c.Time, 64)
				if err != nil {
					return nil, fmt.Errorf("%s: test %q: time %q: %w", path, name, c.Time, err)
				}
				res.Duration = time.Duration(secs * float64(time.Second))
			}
			switch {
			case c.Status == "passed":
				res.State = Passed
			case c.Status == "skipped" && c.Skipped != nil && isFiltered(c.Skipped.Message):
				res.State = Filtered
			case c.Status == "skipped":
				res.State = Skipped
				if c.Skipped != nil {
					res.Message = firstLine(strings.TrimPrefix(c.Skipped.Message, "skipped - "))
				}
			case c.Status == "pending":
				res.State = Filtered
			default: // failed, panicked, interrupted, timedout, aborted
				res.State = Failed
				switch {
				case c.Failure != nil:
					res.Message = firstLine(c.Failure.Message)
				case c.Error != nil:
					res.Message = firstLine(c.Error.Message)
				}
				if res.Message == "" {
					res.Message = c.Status
				}
			}
			r.Results[name] = res
		}
	}
	if len(r.Results) == 0 {
		return nil, fmt.Errorf("%s: no tests in the report", path)
	}
	return r, nil
}

// withoutLabels cuts the list of labels ginkgo appends to a test's name
// ("... [Conformance] [sig-network, Conformance]"): the name keeps the
// labels written in it.
func withoutLabels(name string) string {
	if i := strings.LastIndex(name, " [sig-"); i >= 0 && strings.HasSuffix(name, "]") &&
		!strings.Contains(name[i+2:len(name)-1], "]") {
		return name[:i]
	}
	return name
}

// isFiltered tells a test the run did not select (ginkgo says only
// "skipped") from one the suite skipped with a reason.
func isFiltered(message string) bool {
	return strings.TrimSpace(message) == "skipped"
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	const max = 160
	if len(s) > max {
		s = s[:max] + "…"
	}
	return s
}

// Summary is the run's closing line: the counts, then the failed tests.
func Summary(r *Run) string {
	var b strings.Builder
	fmt.Fprintf(&b, "proxier=%s passed=%d failed=%d skipped_by_suite=%d not_selected=%d",
		r.Proxier, r.Count(Passed), r.Count(Failed), r.Count(Skipped), r.Count(Filtered))
	for _, name := range r.names(Failed) {
		fmt.Fprintf(&b, "\n  FAILED %s: %s", name, r.Results[name].Message)
	}
	return b.String()
}

func (r *Run) names(state State) []string {
	var names []string
	for name, res := range r.Results {
		if res.State == state {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

// Regressions are the tests that passed in base and not in other.
func Regressions(base, other *Run) []string {
	var lost []string
	for _, name := range base.names(Passed) {
		if other.Results[name].State != Passed {
			lost = append(lost, name)
		}
	}
	return lost
}

// Table is a Markdown table of every test selected in any run: its
// result and duration in each, then the tests the suite skipped and why.
func Table(runs []*Run) string {
	selected := map[string]bool{}
	for _, r := range runs {
		for name, res := range r.Results {
			if res.State != Filtered {
				selected[name] = true
			}
		}
	}
	names := make([]string, 0, len(selected))
	for name := range selected {
		names = append(names, name)
	}
	slices.Sort(names)
	var b strings.Builder
	b.WriteString("| Test |")
	for _, r := range runs {
		fmt.Fprintf(&b, " %s |", r.Proxier)
	}
	b.WriteString("\n|---|")
	for range runs {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, name := range names {
		fmt.Fprintf(&b, "| %s |", escape(strings.TrimPrefix(name, "[sig-network] ")))
		for _, r := range runs {
			res, ok := r.Results[name]
			switch {
			case !ok || res.State == Filtered:
				b.WriteString(" – |")
			case res.State == Skipped:
				b.WriteString(" skipped |")
			default:
				fmt.Fprintf(&b, " %s %s |", res.State, res.Duration.Round(100*time.Millisecond))
			}
		}
		b.WriteString("\n")
	}
	b.WriteString("\n| Totals |")
	for _, r := range runs {
		fmt.Fprintf(&b, " %d passed, %d failed, %d skipped |", r.Count(Passed), r.Count(Failed), r.Count(Skipped))
	}
	b.WriteString("\n")
	// Why the suite skipped what it skipped (the first run's reason).
	var why strings.Builder
	for _, name := range names {
		for _, r := range runs {
			if res := r.Results[name]; res.State == Skipped {
				fmt.Fprintf(&why, "| %s | %s |\n", escape(strings.TrimPrefix(name, "[sig-network] ")), escape(res.Message))
				break
			}
		}
	}
	if why.Len() > 0 {
		b.WriteString("\n| Skipped by the suite itself | why |\n|---|---|\n")
		b.WriteString(why.String())
	}
	return b.String()
}

// escape keeps a test's name from breaking the table.
func escape(s string) string {
	return strings.ReplaceAll(s, "|", `\|`)
}
