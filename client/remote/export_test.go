package remote

import (
	"context"
	"time"
)

// WithLookup returns cfg resolving host names with lookup instead of the
// system's resolver, every period (a test's seam: no real DNS).
func WithLookup(cfg Config, lookup func(ctx context.Context, host string) ([]string, error), period time.Duration) Config {
	cfg.resolve = resolveConfig{lookup: lookup, period: period}
	return cfg
}
