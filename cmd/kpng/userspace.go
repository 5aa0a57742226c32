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
			name := fs.String("name", "", "the proxier's name, in its interface's default name (default: the kube input's --service-proxy-name)")
			netnsPath := fs.String("netns", "", "proxy in this network namespace (a path such as /run/netns/x) instead of the current one (Linux)")
			cleanup := fs.Bool("cleanup", false, "remove the interface and its addresses (Linux), or the addresses (Windows), and exit")
			healthChecks := fs.Bool("healthcheck", true, "serve the health check node ports of LoadBalancer services with externalTrafficPolicy: Local (200 with local endpoints, 503 without)")
			return func(ctx context.Context, env app.BackendEnv) (localsink.Sink, error) {
				if err := cfg.Validate(); err != nil {
					return nil, app.Usagef("to-userspace %v", err)
				}
				cfg.ServiceProxyName, cfg.NetNS = env.ServiceProxyName, *netnsPath
				if *name != "" {
					cfg.ServiceProxyName = *name
				}
				if *cleanup {
					if err := userspace.Cleanup(ctx, cfg); err != nil {
						return nil, fmt.Errorf("to-userspace --cleanup: %w", err)
					}
					return nil, app.ErrBackendDone
				}
				if env.Metrics != nil {
					env.Metrics.SetProxyMode("userspace")
				}
				hcCfg, err := healthCheckConfig(ctx, *netnsPath, cfg.Options.NodePortAddresses)
				if err != nil {
					return nil, err
				}
				p, err := userspace.New(ctx, cfg)
				if err != nil {
					return nil, err
				}
				if !*healthChecks {
					return p, nil
				}
				return withHealthChecks(ctx, p, hcCfg, env)
			}
		},
	}
}
