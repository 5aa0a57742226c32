package main

import (
	"context"
	"fmt"

	"sigs.k8s.io/kpng/backends/healthcheck"
	"sigs.k8s.io/kpng/cmd/kpng/app"
	"sigs.k8s.io/kpng/localsink"
)

// withHealthChecks returns backend teed with the health check node ports
// of cfg, which answer 503 while the proxier is unhealthy (env.Metrics)
// and stop serving when ctx ends.
func withHealthChecks(ctx context.Context, backend localsink.Sink, cfg healthcheck.Config, env app.BackendEnv) (localsink.Sink, error) {
	if env.Metrics != nil {
		cfg.Healthy = env.Metrics.Healthy
	}
	hc, err := healthcheck.New(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("--healthcheck: %w", err)
	}
	return localsink.Tee(backend, hc), nil
}
