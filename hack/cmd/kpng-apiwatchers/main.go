//go:build linux

// Command kpng-apiwatchers measures what the API server pays for the
// watchers of Services and EndpointSlices, as issue 24 §2 asks: N
// kube-proxies (N raw watchers) against one kpng controller, or three,
// that serve every node instead. It starts the test control plane (a real
// kube-apiserver and etcd), creates --services Services with one
// EndpointSlice of --endpoints endpoints each, labelled
// service.kubernetes.io/service-proxy-name=--service-proxy-name, and then,
// one configuration after the other:
//
//   - --controllers: that many `kpng kube --service-proxy-name=NAME to-api`
//     processes, each through a loopback relay that counts the bytes the API
//     server sends it, and a backend of each (over the controller's unix
//     socket) to tell when the controller holds the state and each change;
//   - --watchers: that many raw watchers as kube-proxy's, each with its own
//     client and HTTP connection (a dialer that counts the bytes it reads):
//     client-go informers (a list, or the streaming list of client-go's
//     WatchListClient, then a watch, as kube-proxy's informers do) of
//     Services with kube-proxy's selector, its
//     !service.kubernetes.io/service-proxy-name clause replaced by the
//     controller's service-proxy-name=NAME so that both receive the same
//     objects, and of EndpointSlices with kube-proxy's
//     !service.kubernetes.io/headless, in --content-type (kube-proxy's
//     default, protobuf).
//
// Raw watchers start in waves of --wave, each once the one before holds
// the state: all at once, on this 2-core machine shared by the API server
// and every watcher, the watchers' streaming lists starve, time out
// client-side (client-go waits 10 s for the end of the initial events)
// and start again, a cost of the harness that real nodes, each with its
// own cores, would not pay. The watches restarted after an error are
// counted and reported.
//
// Each configuration waits until every watcher holds the initial state,
// then makes --changes EndpointSlice updates one at a time (one
// endpoint's readiness flipped), each waiting until every watcher has it.
// The initial state ends when every watcher holds it and their bytes
// have stopped growing for 2 s (a watch that ends as the initial state
// arrives lists again: that relist is the initial state's, not the
// changes'). It measures the kube-apiserver process's CPU time
// (utime+stime of /proc/PID/stat: the machine is shared, so CPU time, not
// wall time, is the figure), its RSS, and the bytes the watchers received
// (TLS records on the wire: HTTP/2 framing and encryption included), for
// the initial state and per change, and prints one closing line per
// configuration:
//
//	watchers=N kind=raw|kpng services=S apiserver_cpu_ms_per_change=… bytes_per_change=… apiserver_cpu_s_initial=… bytes_initial=… apiserver_rss_mib=…
//
// bytes_per_change is what all the configuration's watchers received per
// change, together. With an empty --service-proxy-name the services carry
// no such label, the raw watchers use kube-proxy's selectors unchanged and
// the controllers run without --service-proxy-name (kube-proxy's role).
// hack/apiserver-watchers.sh (make apiserver-watchers) builds kpng and
// runs it; docs/benchmarks.md records the results.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"sigs.k8s.io/kpng/internal/loadtool"
)

func main() {
	cfg := config{createWorkers: 16, namespace: "apiwatchers", logf: logf}
	kpng := flag.String("kpng", "", "the kpng binary")
	watchers := flag.String("watchers", "10,100,500", "raw watcher counts, comma-separated, one configuration each")
	controllers := flag.String("controllers", "1,3", "kpng controller counts, comma-separated, one configuration each (run first)")
	flag.IntVar(&cfg.services, "services", 1000, "services")
	flag.IntVar(&cfg.endpoints, "endpoints", 10, "endpoints a service")
	flag.IntVar(&cfg.nodes, "nodes", 100, "nodes the endpoints are spread over (their nodeName)")
	flag.IntVar(&cfg.changes, "changes", 100, "EndpointSlice changes a configuration, one at a time")
	flag.StringVar(&cfg.proxyName, "service-proxy-name", "apiwatchers", "the services' service-proxy-name label and the controllers' flag (empty: no label, kube-proxy's selectors)")
	flag.StringVar(&cfg.contentType, "content-type", "application/vnd.kubernetes.protobuf", "the raw watchers' content type (kube-proxy's default is protobuf; application/json is client-go's)")
	flag.StringVar(&cfg.dir, "dir", "", "directory of the sockets, kubeconfigs and controllers' logs (default: a temporary one, removed)")
	flag.IntVar(&cfg.wave, "wave", 50, "raw watchers started at once, each wave once the one before holds the state (0: all at once)")
	flag.DurationVar(&cfg.syncTimeout, "sync-timeout", 15*time.Minute, "how long the watchers may take to hold the initial state")
	flag.DurationVar(&cfg.changeTimeout, "change-timeout", time.Minute, "how long a change may take to reach every watcher")
	flag.Parse()
	var err error
	if cfg.watchers, err = counts(*watchers); err == nil {
		cfg.controllers, err = counts(*controllers)
	}
	if err != nil || *kpng == "" && len(cfg.controllers) > 0 || cfg.check() != nil {
		if err == nil {
			err = cfg.check()
		}
		fmt.Fprintf(os.Stderr, "usage: kpng-apiwatchers --kpng=PATH [--watchers=10,100,500] [--controllers=1,3] [--services=S] [--changes=K]: %v\n", err)
		os.Exit(2)
	}
	cfg.kpng = []string{*kpng}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := measure(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "kpng-apiwatchers:", err)
		os.Exit(1)
	}
}

// counts parses a comma-separated list of counts (empty: none).
func counts(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("count %q: want a positive number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// logf prints progress on stderr.
func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().UTC().Format("15:04:05")}, args...)...)
}

// measure starts the control plane and runs every configuration.
func measure(ctx context.Context, cfg config) error {
	env, err := loadtool.Start("hack/apiserver-watchers.sh", "kpng-apiwatchers-", cfg.dir, logf)
	if err != nil {
		return err
	}
	defer env.Close()
	cfg.dir = env.Dir
	results, err := run(ctx, cfg, env.Client, env.CP, os.Stdout)
	for _, r := range results {
		for _, p := range r.problems {
			fmt.Fprintf(os.Stderr, "problem: %s %s\n", r.label(), p)
		}
	}
	if err != nil {
		return err
	}
	for _, r := range results {
		if len(r.problems) > 0 {
			return fmt.Errorf("checks failed in %s", r.label())
		}
	}
	return nil
}
