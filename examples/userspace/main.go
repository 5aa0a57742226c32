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
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/backends/userspace"
	"sigs.k8s.io/kpng/client"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

// run is main without the exit: it returns the exit status.
func run(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("kpng-userspace", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var watch client.Flags
	watch.Bind(fs)
	var opts userspace.Options
	opts.BindFlags(fs)
	name := fs.String("name", "", "the proxier's name, in its interface's default name (default: --service-proxy-name, or \"userspace\")")
	netnsPath := fs.String("netns", "", "proxy in this network namespace (a path such as /run/netns/x) instead of the current one (Linux)")
	cleanup := fs.Bool("cleanup", false, "remove the interface and its addresses (Linux), or the addresses (Windows), and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if err := opts.Validate(); err != nil {
		fmt.Fprintf(stderr, "kpng-userspace: %v\n", err)
		return 2
	}
	cfg := userspace.Config{ServiceProxyName: *name, NetNS: *netnsPath, Options: opts}
	if cfg.ServiceProxyName == "" {
		cfg.ServiceProxyName = watch.ServiceProxyName
	}
	if cfg.ServiceProxyName == "" {
		cfg.ServiceProxyName = "userspace"
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	defer klog.Flush()
	if *cleanup {
		if err := userspace.Cleanup(ctx, cfg); err != nil {
			fmt.Fprintf(stderr, "kpng-userspace: %v\n", err)
			return 1
		}
		return 0
	}
	p, err := userspace.New(ctx, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "kpng-userspace: %v\n", err)
		return 1
	}
	defer p.Close()
	if err := watch.Run(ctx, p); err != nil {
		fmt.Fprintf(stderr, "kpng-userspace: %v\n", err)
		if client.IsUsageError(err) {
			return 2
		}
		return 1
	}
	return 0
}
