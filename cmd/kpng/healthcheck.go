package main

import (
	"context"

	"sigs.k8s.io/kpng/backends/healthcheck"
	"sigs.k8s.io/kpng/cmd/kpng/app"
	"sigs.k8s.io/kpng/localsink"
)

// withHealthChecks returns backend teed with the health check node ports
// of cfg, which answer 503 while the proxier is unhealthy (env.Metrics)
// and stop serving when ctx ends.
func withHealthChecks(ctx context.Context, backend localsink.Sink, cfg healthcheck.Config, env app.BackendEnv) localsink.Sink {
	if env.Metrics != nil {
		cfg.Healthy = env.Metrics.Healthy
	}
	hc := healthcheck.New(cfg)
	go func() { <-ctx.Done(); hc.Close() }()
	return localsink.Tee(backend, hc)
}
