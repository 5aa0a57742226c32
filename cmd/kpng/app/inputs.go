package app

import (
	"context"
	"flag"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/api/server"
	"sigs.k8s.io/kpng/client"
	"sigs.k8s.io/kpng/client/metrics"
	"sigs.k8s.io/kpng/client/watcher"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/localsink/statefile"
)

// input is where the state comes from. bind registers its flags and returns
// the function that runs it into an output once they are parsed, and what
// in-process backends learn from it.
type input struct {
	help string
	bind func(fs *flag.FlagSet) (func(ctx context.Context, out *output) error, func() BackendEnv)
}

var inputs = map[string]input{
	"kube": {help: kubeHelp, bind: bindKube},
	"file": {help: fileHelp, bind: bindFile},
	"api":  {help: apiHelp, bind: bindAPI},
}

const kubeHelp = `kpng kube: watch the Kubernetes API server for the services of one
service-proxy-name (or, without a name, the services without one), with their
EndpointSlices and this node's topology.

Usage: kpng kube [flags] <output> [output flags]
`

func bindKube(fs *flag.FlagSet) (func(context.Context, *output) error, func() BackendEnv) {
	var f client.Flags
	f.BindKube(fs)
	f.BindMetrics(fs)
	var rec *metrics.Recorder
	env := func() BackendEnv { return BackendEnv{ServiceProxyName: f.ServiceProxyName, Metrics: rec} }
	return func(ctx context.Context, out *output) error {
		var err error
		if rec, err = f.StartMetrics(ctx); err != nil {
			return err
		}
		out.metrics = rec
		f.Observe = releaseAfterFullState(f.Observe)
		if out.hub != nil {
			// A controller serves every node's backends: whether the
			// Node named as its host (a Deployment's pod: no Node has
			// that name) may receive load-balancer traffic is no
			// business of its /healthz, its readiness.
			f.NodeEligible = nil
		}
		w, cs, err := f.Watcher()
		if err != nil {
			return usagef("%v", err)
		}
		return out.run(ctx, func(ctx context.Context, sink localsink.Sink) error {
			if out.hub != nil {
				// Backends on other nodes need their zone for topology hints.
				go func() { _ = watcher.WatchNodeZones(ctx, cs, out.hub.SetNodeZone) }()
			}
			if out.peers != nil {
				ns, name, _ := strings.Cut(out.peersService, "/")
				go func() { _ = watcher.WatchReadyAddresses(ctx, cs, ns, name, setPeers(out.peers)) }()
			}
			return w.Run(ctx, sink)
		})
	}, env
}

// setPeers returns the function that gives peers the ready addresses of the
// controller's Service; an address that does not parse is logged, the
// last good list kept.
func setPeers(peers *server.Peers) func([]string) {
	return func(addrs []string) {
		if err := peers.Set(addrs); err != nil {
			klog.ErrorS(err, "Keeping the controller's last known replica addresses")
		}
	}
}

const fileHelp = `kpng file: read the state from a file (a YAML or JSON list of services with
their endpoints, as written by "to-file", or kpng-json's output), and follow
its changes. A malformed file is reported and the last good state is kept.

Usage: kpng file --input=state.yaml [flags] <output> [output flags]
`

func bindFile(fs *flag.FlagSet) (func(context.Context, *output) error, func() BackendEnv) {
	path := fs.String("input", "", "state file to read (required)")
	interval := fs.Duration("interval", time.Second, "how often to check the file for changes")
	maxMiB := fs.Int64("max-size-mib", statefile.DefaultMaxSize>>20, "the largest file read, in MiB: a larger one is reported and not read")
	var f client.Flags
	f.BindMetrics(fs)
	var rec *metrics.Recorder
	env := func() BackendEnv { return BackendEnv{Metrics: rec} }
	return func(ctx context.Context, out *output) error {
		if *path == "" {
			return usagef("kpng file: --input is required")
		}
		if *interval <= 0 {
			return usagef("kpng file: --interval must be positive")
		}
		if *maxMiB <= 0 || *maxMiB > 1<<20 {
			return usagef("kpng file: --max-size-mib=%d: must be between 1 and 1048576", *maxMiB)
		}
		if out.peersService != "" {
			return usagef("kpng file: to-api --peers-service needs the kube input")
		}
		var err error
		if rec, err = f.StartMetrics(ctx); err != nil {
			return err
		}
		out.metrics = rec
		f.Observe = releaseAfterFullState(f.Observe)
		return out.run(ctx, func(ctx context.Context, sink localsink.Sink) error {
			return statefile.WatchWithOptions(ctx, *path, *interval, *maxMiB<<20, sink, localsink.FeederOptions{Observe: f.Observe, Queued: f.Queued})
		})
	}, env
}

const apiHelp = `kpng api: watch another kpng controller (to chain controllers, or to
record or re-serve what a controller sends to one node).

Usage: kpng api --api=<address> [flags] <output> [output flags]
`

func bindAPI(fs *flag.FlagSet) (func(context.Context, *output) error, func() BackendEnv) {
	var f client.Flags
	f.BindAPI(fs)
	f.BindNodeName(fs)
	f.BindMetrics(fs)
	var rec *metrics.Recorder
	env := func() BackendEnv { return BackendEnv{Metrics: rec} }
	return func(ctx context.Context, out *output) error {
		if f.API == "" {
			return usagef("kpng api: --api is required")
		}
		if _, err := f.RemoteConfig(); err != nil {
			return usagef("%v", err)
		}
		if out.peersService != "" {
			return usagef("kpng api: to-api --peers-service needs the kube input")
		}
		var err error
		if rec, err = f.StartMetrics(ctx); err != nil {
			return err
		}
		out.metrics = rec
		f.Observe = releaseAfterFullState(f.Observe)
		return out.run(ctx, func(ctx context.Context, sink localsink.Sink) error {
			return f.Run(ctx, sink)
		})
	}, env
}
