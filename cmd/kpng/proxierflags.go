package main

import (
	"context"
	"flag"

	"sigs.k8s.io/kpng/backends/healthcheck"
	"sigs.k8s.io/kpng/cmd/kpng/app"
	"sigs.k8s.io/kpng/localsink"
)

// proxierFlags are the flags every proxier backend (to-nft, to-iptables,
// to-userspace) has: --name, --netns, --cleanup and --healthcheck.
type proxierFlags struct {
	name, netns           *string
	cleanup, healthChecks *bool
}

// bindProxierFlags binds the proxier flags on fs, with the backend's own
// words for what --name names, what --netns does and what --cleanup
// removes.
func bindProxierFlags(fs *flag.FlagSet, nameHelp, netnsHelp, cleanupHelp string) proxierFlags {
	return proxierFlags{
		name:         fs.String("name", "", nameHelp+" (default: the kube input's --service-proxy-name)"),
		netns:        fs.String("netns", "", netnsHelp),
		cleanup:      fs.Bool("cleanup", false, cleanupHelp),
		healthChecks: fs.Bool("healthcheck", true, "serve the health check node ports of LoadBalancer services with externalTrafficPolicy: Local (200 with local endpoints, 503 without)"),
	}
}

// serviceProxyName is --name, or the kube input's --service-proxy-name
// when it is not given.
func (f proxierFlags) serviceProxyName(env app.BackendEnv) string {
	if *f.name != "" {
		return *f.name
	}
	return env.ServiceProxyName
}

// withHealthChecks returns sink teed with the health check node ports of
// cfg (withHealthChecks), or sink alone with --healthcheck=false.
func (f proxierFlags) withHealthChecks(ctx context.Context, sink localsink.Sink, cfg healthcheck.Config, env app.BackendEnv) (localsink.Sink, error) {
	if !*f.healthChecks {
		return sink, nil
	}
	return withHealthChecks(ctx, sink, cfg, env)
}
