//go:build linux

package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"sigs.k8s.io/kpng/cmd/kpng/app"
	"sigs.k8s.io/kpng/internal/controlplane"
	"sigs.k8s.io/kpng/internal/kubetest"
)

var cp *controlplane.ControlPlane

// runKpngEnv makes the test binary run kpng (the controllers the tool
// starts) instead of the tests.
const runKpngEnv = "KPNG_APIWATCHERS_TEST_RUN_KPNG=1"

func TestMain(m *testing.M) {
	if os.Getenv("KPNG_APIWATCHERS_TEST_RUN_KPNG") == "1" {
		os.Exit(app.Main(os.Args[1:], os.Stdout, os.Stderr))
	}
	controlplane.Main(m, &cp)
}

var closingLine = regexp.MustCompile(`^watchers=(\d+) kind=(raw|kpng) services=5 apiserver_cpu_ms_per_change=([0-9.]+) bytes_per_change=(\d+) apiserver_cpu_s_initial=([0-9.]+) bytes_initial=(\d+) apiserver_rss_mib=(\d+)$`)

// TestSmallRun runs the tool against the real API server at 5 services
// and 3 changes: one controller process, then 1 and 2 raw watchers. Each
// configuration must print its closing line with bytes and RSS measured,
// every watcher must hold every service and every change, and 2 raw
// watchers must receive about twice the bytes a change that 1 does (each
// watcher its own connection, counted).
func TestSmallRun(t *testing.T) {
	cp.Require(t)
	rc := cp.RESTConfig()
	rc.QPS, rc.Burst = 500, 1000
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := config{
		kpng: []string{os.Args[0]}, env: []string{runKpngEnv},
		services: 5, endpoints: 10, nodes: 3, changes: 3, watchers: []int{1, 2}, controllers: []int{1},
		proxyName: "apiwatchers-test", contentType: "application/vnd.kubernetes.protobuf",
		wave: 1, dir: t.TempDir(), syncTimeout: 2 * time.Minute, changeTimeout: time.Minute,
		namespace: kubetest.UniqueName("apiwatchers"), createWorkers: 4, logf: t.Logf,
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	var out bytes.Buffer
	results, err := run(ctx, cfg, c, cp, &out)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range results {
		if len(r.problems) > 0 {
			t.Errorf("%s: %v", r.label(), r.problems)
		}
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	perChange := map[string]float64{}
	for _, line := range lines {
		m := closingLine.FindStringSubmatch(line)
		if m == nil {
			t.Errorf("not a closing line: %q", line)
			continue
		}
		t.Log(line)
		perChange[m[2]+m[1]], _ = strconv.ParseFloat(m[4], 64)
		if m[4] == "0" || m[6] == "0" || m[7] == "0" {
			t.Errorf("bytes or RSS not measured: %q", line)
		}
	}
	for _, want := range []string{"kpng1", "raw1", "raw2"} {
		if _, ok := perChange[want]; !ok {
			t.Errorf("no closing line for %s in:\n%s", want, out.String())
		}
	}
	if one, two := perChange["raw1"], perChange["raw2"]; one == 0 || two < 1.6*one || two > 2.4*one {
		t.Errorf("2 raw watchers received %.0f bytes a change, 1 received %.0f: want about twice", two, one)
	}
}

// TestRawSelectors checks the raw watchers' selectors: kube-proxy's, or
// with the controller's service-proxy-name for the services.
func TestRawSelectors(t *testing.T) {
	for _, tc := range []struct{ name, services, slices string }{
		{"", "!service.kubernetes.io/service-proxy-name", "!service.kubernetes.io/headless"},
		{"x", "service.kubernetes.io/service-proxy-name=x", "!service.kubernetes.io/headless"},
	} {
		if s, sl := rawSelectors(tc.name); s != tc.services || sl != tc.slices {
			t.Errorf("rawSelectors(%q) = %q, %q; want %q, %q", tc.name, s, sl, tc.services, tc.slices)
		}
	}
}
