package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestLoadReadsGinkgoJUnit(t *testing.T) {
	r, err := Load("testdata/run-a")
	if err != nil {
		t.Fatal(err)
	}
	if r.Proxier != "kpng-nft" {
		t.Errorf("proxier %q, want kpng-nft (from the proxier file)", r.Proxier)
	}
	want := map[string]Result{
		"[sig-network] Services should serve a basic endpoint from pods [Conformance]":                         {State: Passed, Duration: 12250 * time.Millisecond},
		"[sig-network] Services should preserve source pod IP for traffic thru service cluster IP [LinuxOnly]": {State: Failed, Duration: 30500 * time.Millisecond, Message: "[FAILED] source IP was 10.244.1.1, not the pod's"},
		"[sig-network] Topology Hints should distribute endpoints evenly":                                      {State: Skipped, Duration: 1500 * time.Millisecond, Message: "requires 3 zones"},
		"[sig-storage] Volumes should work":                                                                    {State: Filtered},
	}
	if len(r.Results) != len(want) {
		t.Errorf("%d results, want %d (the suite's own nodes left out): %v", len(r.Results), len(want), r.Results)
	}
	for name, w := range want {
		if got, ok := r.Results[name]; !ok || got != w {
			t.Errorf("%s: got %+v (found %v), want %+v", name, got, ok, w)
		}
	}
}

func TestSummaryTableAndCompare(t *testing.T) {
	var out bytes.Buffer
	if err := run(&out, true, false, false, []string{"testdata/run-a"}); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "proxier=kpng-nft passed=1 failed=1 skipped_by_suite=1 not_selected=1\n  FAILED [sig-network] Services should preserve") {
		t.Errorf("summary:\n%s", out.String())
	}

	out.Reset()
	if err := run(&out, false, true, false, []string{"testdata/run-b", "testdata/run-a"}); err != nil {
		t.Fatal(err)
	}
	table := out.String()
	for _, line := range []string{
		"| Test | kube-proxy-nftables | kpng-nft |",
		"| Services should preserve source pod IP for traffic thru service cluster IP [LinuxOnly] | passed 20s | failed 30.5s |",
		"| Topology Hints should distribute endpoints evenly | skipped | skipped |",
		"| Totals | 2 passed, 0 failed, 1 skipped | 1 passed, 1 failed, 1 skipped |",
		"| Topology Hints should distribute endpoints evenly | requires 3 zones |",
		"| Service endpoints latency, p50 (the control plane's) | – | 992ms |", // run-b has no report.json
		"| Service endpoints latency, p99 (the control plane's) | – | 2.005s |",
		"| the 1 tests every proxier passed, their time summed | 12s | 12s |",
	} {
		if !strings.Contains(table, line+"\n") {
			t.Errorf("table has no line %q:\n%s", line, table)
		}
	}
	if strings.Contains(table, "Volumes") {
		t.Errorf("a test no run selected is in the table:\n%s", table)
	}

	out.Reset()
	err := run(&out, false, false, true, []string{"testdata/run-b", "testdata/run-a"})
	if !errors.Is(err, errRegressed) || !strings.Contains(out.String(), "passed with kube-proxy-nftables, not with kpng-nft: [sig-network] Services should preserve source pod IP") {
		t.Errorf("compare: err %v, output:\n%s", err, out.String())
	}
	out.Reset()
	if err := run(&out, false, false, true, []string{"testdata/run-a", "testdata/run-b"}); err != nil {
		t.Errorf("compare the other way: %v\n%s", err, out.String())
	}
}
