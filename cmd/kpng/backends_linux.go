//go:build linux

package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/google/nftables"

	"sigs.k8s.io/kpng/backends/nft"
	"sigs.k8s.io/kpng/cmd/kpng/app"
	"sigs.k8s.io/kpng/localsink"
)

// platformBackends are the Linux-only backends.
func platformBackends() []app.Backend { return []app.Backend{nftBackend()} }

// nftBackend is `to-local to-nft`: the nftables backend (backends/nft).
func nftBackend() app.Backend {
	return app.Backend{
		Name: "to-nft",
		Help: "program nftables over netlink (table inet kpng-<service-proxy-name>)",
		Bind: func(fs *flag.FlagSet) func(context.Context, app.BackendEnv) (localsink.Sink, error) {
			name := fs.String("name", "", "the name in the table's name (default: the kube input's --service-proxy-name)")
			netnsPath := fs.String("netns", "", "program the rules in this network namespace (a path such as /run/netns/x) instead of the current one")
			return func(ctx context.Context, env app.BackendEnv) (localsink.Sink, error) {
				cfg := nft.Config{ServiceProxyName: env.ServiceProxyName}
				if *name != "" {
					cfg.ServiceProxyName = *name
				}
				if *netnsPath != "" {
					f, err := os.Open(*netnsPath)
					if err != nil {
						return nil, fmt.Errorf("to-nft --netns: %w", err)
					}
					// The namespace stays open for the process's life.
					fd := int(f.Fd())
					cfg.Conn = func() (*nftables.Conn, error) { return nftables.New(nftables.WithNetNSFd(fd)) }
					go func() { <-ctx.Done(); f.Close() }()
				}
				return nft.NewSink(cfg)
			}
		},
	}
}
