//go:build linux

// Command kpng-scale measures a kpng controller (`kpng kube … to-api`, a
// process of its own) serving many node backends, as issue 24 §2 asks:
// it starts the test control plane (a real kube-apiserver and etcd),
// creates --services Services with one EndpointSlice of --endpoints
// endpoints each, spread over --nodes nodes (endpoint e of service i on
// node-(i×endpoints+e mod nodes), so that every node's view differs by its
// Local endpoints), starts the controller on a unix socket (--tcp: on
// TCP loopback, plain; no connection limits; --max-streams-per-node=-1,
// the other limits at their defaults unless --to-api-flags says
// otherwise), waits until it holds
// the state, then opens one lightweight Watch stream per node
// (node-00000 …, --streams-per-conn to a connection) that counts the
// bytes it receives and reads only the fields it checks. The streams are
// node-independent, as client/remote's: a backend computes its Local
// endpoints from their node names (--per-node-view: the controller
// computes each node's view, as before node-independent streams). Since
// every backend of a node-independent stream is sent the same state, only
// --read-all of them (16) read every field of it; the others read only
// the operations' kinds and hash them, and the run checks that each holds
// the same bytes as a backend that read them all. It measures:
//
//   - first_state_all_s: from the streams opening to the last holding its
//     first state; each first state is checked (every service and endpoint,
//     and the node's own Local endpoints). Its floors, after the backends
//     are gone: the bytes sent through one connection of the controller's
//     transport, written and read by two goroutines of this process (on
//     one core, in turns); for comparison, from a process pinned to one
//     CPU to a process pinned to another, on the other transport, and
//     through a connection a backend; and, when the first states were
//     deflated, the state's bytes (as they inflate) in the same way as
//     the first: the target's floor. A line of the details gives the
//     target, that floor plus 20%, whether it was met, and the ratio to
//     both floors;
//   - change_p50_ms, change_p99_ms: --changes EndpointSlice updates (an
//     endpoint made not ready, one service each, one at a time), each from
//     when a watcher of the API server receives it (the tool's own watch,
//     beside the controller's) to the last backend holding it (the Sync
//     ending its round); the details also give the API call to the last
//     backend, the watcher to the first (the controller's reaction) and
//     the first to the last (its fan-out). The changes come back to back,
//     or --change-gap apart (each then the first after a quiet time);
//   - controller_rss_mib: the controller's peak RSS (VmHWM of
//     /proc/PID/status), and its RSS at each step;
//   - bytes_per_change_per_node: the bytes of the batches (the protobuf
//     messages, without gRPC's and HTTP/2's framing) the backends received
//     during the changes, per change and backend.
//
// With --peers, the controller also serves its replicas (to-api
// --peers-service, from a headless Service kube-system/kpng-controller
// whose EndpointSlice lists three), every backend follows them on a
// Peers stream as deploy/'s node backends do, and --replica-changes
// changes of them follow the EndpointSlice changes: each must reach
// every backend, timed from the API call to the last.
//
// It prints those on a closing line:
//
//	nodes=N services=S first_state_all_s=… change_p50_ms=… change_p99_ms=… controller_rss_mib=… bytes_per_change_per_node=…
//
// With --profile, the controller serves Go's profiles
// (--profiling-bind-address) and the tool saves, in --dir, CPU profiles
// of the first states and of the changes (up to 25 s each), the heap
// after the first states and the allocations at the end (go tool pprof).
// It exits non-zero when a check failed. hack/scale-controller.sh (make
// scale-controller) builds kpng and runs it; docs/benchmarks.md records
// the results.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"sigs.k8s.io/kpng/internal/loadtool"
)

func main() {
	if ok, err := floorPart(); ok {
		if err != nil {
			fmt.Fprintln(os.Stderr, "kpng-scale:", err)
			os.Exit(1)
		}
		return
	}
	cfg := config{endpoints: 10, createWorkers: 16, namespace: "scale", logf: logf}
	kpng := flag.String("kpng", "", "the kpng binary")
	toAPI := flag.String("to-api-flags", "", "more flags of to-api, space-separated (e.g. --max-concurrent-first-states=8)")
	flag.IntVar(&cfg.nodes, "nodes", 100, "node backends")
	flag.IntVar(&cfg.services, "services", 10000, "services")
	flag.IntVar(&cfg.endpoints, "endpoints", 10, "endpoints a service")
	flag.IntVar(&cfg.changes, "changes", 100, "EndpointSlice changes, one at a time (at most --services)")
	flag.DurationVar(&cfg.changeGap, "change-gap", 0, "pause before each change after the first (0: back to back, each as soon as the last reached every backend)")
	flag.BoolVar(&cfg.perNodeView, "per-node-view", false, "backends ask for their node's view computed by the controller (the protocol before node-independent streams), instead of the state every node shares")
	flag.BoolVar(&cfg.plain, "plain", false, "the backends do not ask for deflated operations (WatchRequest.accept_deflated, which client/remote asks for): their first states come as they are, about 7 times the bytes")
	flag.IntVar(&cfg.readAll, "read-all", 16, "on node-independent streams, how many backends (spread over the nodes) read every field of their first state; the others hash what they receive, which must be the same (0: all read every field)")
	flag.BoolVar(&cfg.grpcLight, "grpc-light", false, "the backends that hash what they receive read it through grpc-go's client too, instead of speaking HTTP/2 on their socket themselves (which costs the machine's shared cores about a third as much)")
	flag.IntVar(&cfg.streamsPerConn, "streams-per-conn", 1, "backends sharing one connection (the controller allows 8 by default)")
	flag.BoolVar(&cfg.tcp, "tcp", false, "serve the backends on TCP loopback (127.0.0.1, plain) instead of a unix socket; the target's floor is then the state's bytes through TCP loopback")
	flag.BoolVar(&cfg.tls, "tls", false, "serve the backends on TCP loopback with TLS and client certificates, as deploy/ runs the controller: each raw backend with its own node's certificate and handshake (the floors stay plain TCP's)")
	flag.BoolVar(&cfg.peers, "peers", false, "give the controller its replicas' Service (to-api --peers-service) and have every backend follow them on a Peers stream of its connection, as deploy/'s node backends do; after the EndpointSlice changes, --replica-changes changes of the replicas, each to every backend")
	flag.IntVar(&cfg.replicaChanges, "replica-changes", 10, "with --peers, changes of the controller's replicas (one of three made not ready)")
	controllerEnv := flag.String("controller-env", "", "environment variables of the controller, space-separated NAME=VALUE (e.g. GOMEMLIMIT=800MiB, as deploy/kpng-controller.yaml sets it)")
	flag.StringVar(&cfg.dir, "dir", "", "directory of the socket, the controller's log and the profiles (default: a temporary one, removed)")
	flag.BoolVar(&cfg.profile, "profile", false, "profile the controller (CPU, heap, allocations) into --dir")
	flag.DurationVar(&cfg.firstStateTimeout, "first-state-timeout", 30*time.Minute, "how long the controller may take to hold the state, and the backends their first states")
	flag.DurationVar(&cfg.changeTimeout, "change-timeout", time.Minute, "how long a change may take to reach every backend")
	flag.Float64Var(&cfg.maxRSS, "max-rss-mib", 12288, "stop when the controller's RSS passes this (MiB; 0: no limit)")
	flag.Float64Var(&cfg.minAvailable, "min-available-mib", 4096, "stop when the machine's MemAvailable falls below this (MiB; 0: no floor)")
	flag.Parse()
	if *kpng == "" || cfg.nodes < 1 || cfg.services < 1 || cfg.endpoints < 1 || cfg.endpoints > 254 || cfg.services > 62500 ||
		cfg.changes < 1 || cfg.streamsPerConn < 1 || (cfg.peers && cfg.replicaChanges < 1) {
		fmt.Fprintln(os.Stderr, "usage: kpng-scale --kpng=PATH [--nodes=N] [--services=S] [--changes=K] [--peers [--replica-changes=R]] [--profile --dir=DIR] (services ≤ 62500, endpoints 1…254, R ≥ 1)")
		os.Exit(2)
	}
	cfg.kpng = []string{*kpng}
	cfg.tcp = cfg.tcp || cfg.tls
	for _, v := range strings.Fields(*controllerEnv) {
		if name, _, ok := strings.Cut(v, "="); !ok || name == "" {
			fmt.Fprintf(os.Stderr, "kpng-scale: --controller-env: %q is not NAME=VALUE\n", v)
			os.Exit(2)
		}
		cfg.env = append(cfg.env, v)
	}
	cfg.toAPIFlags = strings.Fields(*toAPI)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := measure(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "kpng-scale:", err)
		os.Exit(1)
	}
}

// logf prints progress on stderr.
func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().UTC().Format("15:04:05")}, args...)...)
}

// measure starts the control plane and runs.
func measure(ctx context.Context, cfg config) error {
	env, err := loadtool.Start("hack/scale-controller.sh", "kpng-scale-", cfg.dir, logf)
	if err != nil {
		return err
	}
	defer env.Close()
	cfg.dir = env.Dir
	res, err := run(ctx, cfg, env.Client, env.CP.KubeconfigPath())
	if err != nil {
		return err
	}
	fmt.Print(res.details())
	fmt.Println(res.closing())
	if len(res.problems) > 0 {
		for i, p := range res.problems {
			if i == 20 {
				fmt.Fprintf(os.Stderr, "and %d more problems\n", len(res.problems)-i)
				break
			}
			fmt.Fprintln(os.Stderr, "problem:", p)
		}
		return fmt.Errorf("%d checks failed", len(res.problems))
	}
	return nil
}
