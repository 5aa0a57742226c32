//go:build linux

package main

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestSplitRule: a rule as iptables -S prints it becomes the arguments
// of its -D, the quoted comment one argument.
func TestSplitRule(t *testing.T) {
	got, err := splitRule(`-m comment --comment "kubernetes service portals" -j KUBE-SERVICES`)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("splitRule (-want +got):\n%s", diff)
	}
	if _, err := splitRule(`--comment "open`); err == nil {
		t.Error("unbalanced quotes: no error")
	}
}

// TestSummary: median and worst of the tries, or how many were not
// served within the limit.
func TestSummary(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		ds   []time.Duration
		want string
	}{
		{nil, "n/a"},
		{[]time.Duration{30 * ms, 10 * ms, 20 * ms}, "20 ms / 30 ms (3)"},
		{[]time.Duration{-1}, "> 1m10s (1 of 1 tries)"},
		{[]time.Duration{12 * time.Second}, "12.0 s / 12.0 s (1)"},
	} {
		if got := summary(tc.ds, 70*time.Second); got != tc.want {
			t.Errorf("summary(%v) = %q, want %q", tc.ds, got, tc.want)
		}
	}
}
