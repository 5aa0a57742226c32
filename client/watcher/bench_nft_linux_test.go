//go:build linux

package watcher_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/kpng/internal/controlplane"
	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/internal/nftlisting"
)

const (
	// kpngNFTRuns is the number of kpng processes each call starts, one
	// after the other, on the same API server content.
	kpngNFTRuns = 3
	// kpngNFTSettle is how long the process runs after its first complete
	// sync before its steady memory is read: the release of the first
	// state's garbage (cmd/kpng releases it after a full state) is done
	// by then.
	kpngNFTSettle = 5 * time.Second
	// kpngNFTTimeout bounds one run.
	kpngNFTTimeout = 5 * time.Minute
)

// BenchmarkKpngNFTRealAPIServer10k measures the memory of the whole
// proxier as a node runs it: `kpng kube … to-local to-nft`, built from
// ./cmd/kpng, against the real kube-apiserver holding the 10,000 selected
// services × 10 endpoints of BenchmarkWatcherRealAPIServer10k (populated
// once per test process: run both in one `go test` to load them once),
// programming its tables in a network namespace of its own. Each call runs
// kpngNFTRuns processes one after the other and reports the medians of:
//
//   - first-sync-ms: process start → the metrics say that the first
//     complete state (10,000 services, 100,000 endpoints) was applied;
//   - peak-rss-MiB: the process's VmHWM, polled every 2 ms from
//     /proc/<pid>/status (its rusage would hold this test process's, see
//     runKpngJSON), over its whole run;
//   - rss-MiB, heap-MiB, heap-inuse-MiB: VmRSS and the Go runtime's
//     go_memstats_heap_alloc_bytes and go_memstats_heap_inuse_bytes (its
//     metrics), kpngNFTSettle after the first complete sync: what the
//     proxier holds;
//   - cpu-s: the process's CPU time (user and system, from
//     /proc/<pid>/stat) until then, the kernel's work on its
//     transactions included.
//
// Each run must program every service: its table ip must serve 10,000
// service ports. It needs root (network namespaces, nftables) and the
// control plane; run it with -benchtime=1x (one call runs everything).
func BenchmarkKpngNFTRealAPIServer10k(b *testing.B) { benchKpngRealAPIServer10k(b, nftBackend) }

// BenchmarkKpngUserspaceRealAPIServer10k is BenchmarkKpngNFTRealAPIServer10k
// for `kpng kube … to-local to-userspace`: the same figures, and each run
// must listen on every service's cluster IP and port (10,000 TCP sockets
// in its namespace). deploy/kpng-default-userspace.yaml's memory request
// and limit follow it (docs/benchmarks.md, "Memory limits of the
// DaemonSets").
func BenchmarkKpngUserspaceRealAPIServer10k(b *testing.B) {
	benchKpngRealAPIServer10k(b, userspaceBackend)
}

// kpngBackend is a backend the real-API-server benchmarks run kpng with.
type kpngBackend struct {
	// name is the backend's command (after to-local).
	name string
	// programmed reports an error unless the run in node programmed
	// every service of proxyName.
	programmed func(node *netns.NS, proxyName string) error
}

var (
	// nftBackend's table of IPv4 must serve every service (with a chain or
	// in a shard map).
	nftBackend = kpngBackend{"to-nft", func(node *netns.NS, proxyName string) error {
		out, _, err := node.Exec(nil, "nft", "list", "table", "ip", "kpng-"+proxyName)
		if err != nil {
			return fmt.Errorf("nft list table: %w", err)
		}
		if n := nftlisting.ServicePortsV4(out); n != realServices {
			return fmt.Errorf("%d service ports in the table, want %d", n, realServices)
		}
		return nil
	}}
	// userspaceBackend must listen on every service's one TCP port.
	userspaceBackend = kpngBackend{"to-userspace", func(node *netns.NS, _ string) error {
		out, _, err := node.Exec(nil, "ss", "-Hltn")
		if err != nil {
			return fmt.Errorf("ss: %w", err)
		}
		if n := strings.Count(out, ":80 "); n != realServices {
			return fmt.Errorf("%d TCP sockets listening on port 80, want %d", n, realServices)
		}
		return nil
	}}
)

// benchKpngRealAPIServer10k is BenchmarkKpngNFTRealAPIServer10k with
// backend be.
func benchKpngRealAPIServer10k(b *testing.B, be kpngBackend) {
	cp.Require(b)
	netns.RequirePrivileged(b)
	populateReal(b)
	b.ResetTimer()
	b.StopTimer()
	p := &realPopulation
	b.ReportMetric(p.took.Seconds(), "populate-s")
	bin := buildKpng(b)
	var first, peak, rss, heap, inuse, cpu []float64
	for i := range kpngNFTRuns {
		r := runKpngNFT(b, bin, p.proxyName, be)
		b.Logf("run %d: first sync %v, peak RSS %.0f MiB, RSS %.0f MiB, heap %.0f MiB (in use %.0f MiB), CPU %.2f s",
			i, r.firstSync.Round(time.Millisecond), r.peakRSSMiB, r.rssMiB, r.heapMiB, r.heapInuseMiB, r.cpu.Seconds())
		first = append(first, realMillis(r.firstSync))
		peak = append(peak, r.peakRSSMiB)
		rss = append(rss, r.rssMiB)
		heap = append(heap, r.heapMiB)
		inuse = append(inuse, r.heapInuseMiB)
		cpu = append(cpu, r.cpu.Seconds())
	}
	b.ReportMetric(medianOf(first), "first-sync-ms")
	b.ReportMetric(medianOf(peak), "peak-rss-MiB")
	b.ReportMetric(medianOf(rss), "rss-MiB")
	b.ReportMetric(medianOf(heap), "heap-MiB")
	b.ReportMetric(medianOf(inuse), "heap-inuse-MiB")
	b.ReportMetric(medianOf(cpu), "cpu-s")
}

// medianOf returns the median of xs (the upper one of an even count).
func medianOf(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// buildKpng builds ./cmd/kpng into a temporary directory.
func buildKpng(b *testing.B) string {
	b.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		b.Fatal(err)
	}
	bin := filepath.Join(b.TempDir(), "kpng")
	build := exec.Command("go", "build", "-o", bin, "./cmd/kpng")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("go build ./cmd/kpng: %v\n%s", err, out)
	}
	return bin
}

// kpngNFTRun is what one kpng process showed.
type kpngNFTRun struct {
	firstSync             time.Duration
	peakRSSMiB, rssMiB    float64
	heapMiB, heapInuseMiB float64
	cpu                   time.Duration
}

// runKpngNFT runs `kpng kube … to-local <be>` for proxyName in a new
// network namespace until kpngNFTSettle after its first complete sync,
// checks that it programmed every service, then stops it with SIGTERM.
func runKpngNFT(b *testing.B, bin, proxyName string, be kpngBackend) kpngNFTRun {
	b.Helper()
	node := netns.New(b, "kpng-bench")
	metricsAddr := freeLoopbackPort(b)
	ctx, cancel := context.WithTimeout(context.Background(), kpngNFTTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "kube", "--kubeconfig="+cp.KubeconfigPath(), "--service-proxy-name="+proxyName,
		"--node-name="+realNodeName, "--metrics-bind-address="+metricsAddr, "to-local", be.name, "--netns="+node.Path())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	pid := cmd.Process.Pid
	hwm := pollPeakRSS(pid)
	fail := func(format string, args ...any) {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		hwm.stop()
		b.Fatalf(format+"\n%s", append(args, stderr.String())...)
	}

	var run kpngNFTRun
	url := "http://" + metricsAddr + "/metrics"
	for {
		m, err := scrape(url)
		if err == nil && m["kpng_services"] == realServices && m["kpng_endpoints"] == realServices*realEndpointsPerService &&
			m["kpng_sync_proxy_rules_last_timestamp_seconds"] > 0 {
			run.firstSync = time.Since(start)
			break
		}
		if ctx.Err() != nil {
			fail("kpng %s: no complete sync within %v (last metrics error: %v)", be.name, kpngNFTTimeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(kpngNFTSettle)
	m, err := scrape(url)
	if err != nil {
		fail("kpng %s: metrics: %v", be.name, err)
	}
	run.heapMiB = m["go_memstats_heap_alloc_bytes"] / (1 << 20)
	run.heapInuseMiB = m["go_memstats_heap_inuse_bytes"] / (1 << 20)
	rssKiB, err := statusKiB(fmt.Sprintf("/proc/%d/status", pid), "VmRSS")
	if err != nil {
		fail("kpng %s: %v", be.name, err)
	}
	run.rssMiB = float64(rssKiB) / 1024
	if run.cpu, err = processCPUTime(pid); err != nil {
		fail("kpng %s: %v", be.name, err)
	}
	if err := be.programmed(node, proxyName); err != nil {
		fail("kpng %s: %v", be.name, err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		b.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		hwm.stop()
		b.Fatalf("kpng %s: %v\n%s", be.name, err, stderr.String())
	}
	run.peakRSSMiB = float64(hwm.stop()) / 1024
	return run
}

// freeLoopbackPort returns a 127.0.0.1 address with a port free a moment
// ago.
func freeLoopbackPort(b *testing.B) string {
	b.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// scrape returns the samples of the Prometheus text at url, by metric
// name (the last sample of a name, whatever its labels).
func scrape(url string) (map[string]float64, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		sep := strings.LastIndexByte(line, ' ')
		if sep < 0 {
			continue
		}
		name := line[:sep]
		if i := strings.IndexByte(name, '{'); i >= 0 {
			name = name[:i]
		}
		v, err := strconv.ParseFloat(line[sep+1:], 64)
		if err != nil {
			continue
		}
		out[name] = v
	}
	return out, sc.Err()
}

// processCPUTime returns the user and system CPU time of process pid so
// far, from /proc/<pid>/stat.
func processCPUTime(pid int) (time.Duration, error) {
	data, err := readProcFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The fields after the command, which is in parentheses and may hold
	// spaces: state is field 3, utime 14 and stime 15.
	rest := data[strings.LastIndexByte(data, ')')+2:]
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: utime %q, stime %q", pid, f[11], f[12])
	}
	const ticks = 100 // USER_HZ
	return time.Duration(utime+stime) * time.Second / ticks, nil
}
