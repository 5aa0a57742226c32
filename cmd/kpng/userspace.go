package main

import (
	"context"
	"flag"
	"fmt"

	"sigs.k8s.io/kpng/backends/userspace"
	"sigs.k8s.io/kpng/cmd/kpng/app"
	"sigs.k8s.io/kpng/localsink"
)

// userspaceBackend is `to-local to-userspace`: the userspace proxier
// (backends/userspace), on Linux and Windows.
func userspaceBackend() app.Backend {
	return app.Backend{
		Name: "to-userspace",
		Help: "proxy in userspace: hold the service addresses on an interface, listen on them and copy each connection to an endpoint",
		Bind: func(fs *flag.FlagSet) func(context.Context, app.BackendEnv) (localsink.Sink, error) {
			var cfg userspace.Config
			cfg.BindFlags(fs)
			pf := bindProxierFlags(fs, "the proxier's name, in its interface's default name",
				"proxy in this network namespace (a path such as /run/netns/x) instead of the current one (Linux)",
				"remove the interface and its addresses (Linux), or the addresses (Windows), and exit")
			return func(ctx context.Context, env app.BackendEnv) (localsink.Sink, error) {
				if err := cfg.Validate(); err != nil {
					return nil, app.Usagef("to-userspace %v", err)
				}
				cfg.ServiceProxyName, cfg.NetNS = pf.serviceProxyName(env), *pf.netns
				if *pf.cleanup {
					if err := userspace.Cleanup(ctx, cfg); err != nil {
						return nil, fmt.Errorf("to-userspace --cleanup: %w", err)
					}
					return nil, app.ErrBackendDone
				}
				if env.Metrics != nil {
					env.Metrics.SetProxyMode("userspace")
				}
				hcCfg, err := healthCheckConfig(ctx, *pf.netns, cfg.Options.NodePortAddresses)
				if err != nil {
					return nil, err
				}
				p, err := userspace.New(ctx, cfg)
				if err != nil {
					return nil, err
				}
				return pf.withHealthChecks(ctx, p, hcCfg, env)
			}
		},
	}
}
