// Command kpng-e2e-report reads the JUnit reports that hack/e2e/run.sh
// (make e2e) writes, one directory per proxier, and prints:
//
//	kpng-e2e-report --summary DIR
//	    one line: how many tests passed, failed and were skipped by the
//	    suite itself, with the failed tests' names after it;
//	kpng-e2e-report --table DIR...
//	    a Markdown table of every test that ran with any of the proxiers:
//	    its result and duration with each (docs/e2e.md), then the figures
//	    the suite gives: the "Service endpoints latency" percentiles and
//	    the time the tests every proxier passed took with each;
//	kpng-e2e-report --compare BASE DIR
//	    the tests that passed with BASE's proxier and not with DIR's;
//	    exits 1 when there is one (make e2e-report, hack/e2e/report.sh).
//
// A directory's proxier is named by its file "proxier" (else the
// directory's name).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

func main() {
	summary := flag.Bool("summary", false, "print one proxier's summary line")
	table := flag.Bool("table", false, "print the Markdown table of the proxiers' results")
	compare := flag.Bool("compare", false, "list the tests that passed with the first proxier and not with the second; exit 1 if any")
	flag.Parse()
	if err := run(os.Stdout, *summary, *table, *compare, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "kpng-e2e-report:", err)
		os.Exit(1)
	}
}

// errRegressed is returned by --compare when a test passed with the base
// proxier only.
var errRegressed = errors.New("tests passed with the base proxier and not with the other")

func run(w io.Writer, summary, table, compare bool, dirs []string) error {
	modes := 0
	for _, m := range []bool{summary, table, compare} {
		if m {
			modes++
		}
	}
	if modes != 1 {
		return errors.New("give one of --summary, --table, --compare")
	}
	runs := make([]*Run, 0, len(dirs))
	for _, dir := range dirs {
		r, err := Load(dir)
		if err != nil {
			return err
		}
		runs = append(runs, r)
	}
	switch {
	case summary:
		if len(runs) != 1 {
			return errors.New("--summary takes one directory")
		}
		_, err := fmt.Fprintln(w, Summary(runs[0]))
		return err
	case table:
		if len(runs) == 0 {
			return errors.New("--table takes one directory or more")
		}
		if _, err := io.WriteString(w, Table(runs)); err != nil {
			return err
		}
		return writeFigures(w, runs, dirs)
	default:
		if len(runs) != 2 {
			return errors.New("--compare takes two directories: the base proxier's, then the other's")
		}
		lost := Regressions(runs[0], runs[1])
		for _, name := range lost {
			fmt.Fprintf(w, "passed with %s, not with %s: %s (%s)\n", runs[0].Proxier, runs[1].Proxier, name, runs[1].Results[name].State)
		}
		if len(lost) > 0 {
			return fmt.Errorf("%d %w", len(lost), errRegressed)
		}
		fmt.Fprintf(w, "every test that passed with %s passed with %s (%d)\n", runs[0].Proxier, runs[1].Proxier, runs[0].Count(Passed))
		return nil
	}
}

// proxierOf names the proxier of a report directory.
func proxierOf(dir string) string {
	if b, err := os.ReadFile(filepath.Join(dir, "proxier")); err == nil {
		if name := strings.TrimSpace(string(b)); name != "" {
			return name
		}
	}
	return filepath.Base(filepath.Clean(dir))
}

// writeFigures writes the figures of the runs under their table.
func writeFigures(w io.Writer, runs []*Run, dirs []string) error {
	fmt.Fprintf(w, "\n| Figure |")
	for _, r := range runs {
		fmt.Fprintf(w, " %s |", r.Proxier)
	}
	fmt.Fprintf(w, "\n|---|")
	for range runs {
		fmt.Fprint(w, "---|")
	}
	fmt.Fprintln(w)
	for _, p := range []string{"p50", "p90", "p99"} {
		fmt.Fprintf(w, "| Service endpoints latency, %s (the control plane's) |", p)
		for _, dir := range dirs {
			lat, err := EndpointsLatency(dir)
			if err != nil {
				return err
			}
			if d, ok := lat[p]; ok {
				fmt.Fprintf(w, " %s |", d.Round(time.Millisecond))
			} else {
				fmt.Fprint(w, " – |")
			}
		}
		fmt.Fprintln(w)
	}
	n, sums := BothPassedTime(runs)
	fmt.Fprintf(w, "| the %d tests every proxier passed, their time summed |", n)
	for _, d := range sums {
		fmt.Fprintf(w, " %s |", d.Round(time.Second))
	}
	_, err := fmt.Fprintln(w)
	return err
}
