// Command kpng-userspace is the userspace proxier (backends/userspace) as
// a program of its own: it watches the Kubernetes API server, or a kpng
// controller with --api (the shape of the original project's Windows
// userspace proxier, fed by `kpng kube … to-api`), and proxies the
// services of one service-proxy-name. It runs on Linux and Windows.
//
//	kpng-userspace --api=unix:///run/kpng.sock --node-name=$NODE_NAME --cluster-cidr=10.244.0.0/16
//	kpng-userspace --kubeconfig=$KUBECONFIG --service-proxy-name=my-proxy
//
// It exits 0 on SIGINT or SIGTERM, 2 on bad flags, 1 on other errors.
package main

import (
	"context"
	"flag"
	"io"
	"os"

	"sigs.k8s.io/kpng/backends/userspace"
	"sigs.k8s.io/kpng/client"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

// run is main without the exit: it returns the exit status. kpng's
// client.MainWith does the lifecycle (flags, signals, exit statuses, the
// watch or the controller); this program only adds the proxier's flags
// and builds it.
func run(args []string, stderr io.Writer) int {
	var cfg userspace.Config
	var name, netnsPath string
	var cleanup bool
	bind := func(fs *flag.FlagSet) {
		cfg.BindFlags(fs)
		fs.StringVar(&name, "name", "", "the proxier's name, in its interface's default name (default: --service-proxy-name, or \"userspace\")")
		fs.StringVar(&netnsPath, "netns", "", "proxy in this network namespace (a path such as /run/netns/x) instead of the current one (Linux)")
		fs.BoolVar(&cleanup, "cleanup", false, "remove the interface and its addresses (Linux), or the addresses (Windows), and exit")
	}
	return client.MainWith(args, stderr, bind, func(ctx context.Context, f *client.Flags) (client.Sink, error) {
		if err := cfg.Validate(); err != nil {
			return nil, client.UsageError(err)
		}
		cfg.ServiceProxyName, cfg.NetNS = name, netnsPath
		if cfg.ServiceProxyName == "" {
			cfg.ServiceProxyName = f.ServiceProxyName
		}
		if cfg.ServiceProxyName == "" {
			cfg.ServiceProxyName = "userspace"
		}
		if cleanup {
			return nil, userspace.Cleanup(ctx, cfg)
		}
		// The proxier closes when ctx ends, at SIGINT or SIGTERM.
		p, err := userspace.New(ctx, cfg)
		if err != nil {
			return nil, err
		}
		return p, nil
	})
}
