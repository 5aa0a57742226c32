// Package periodic runs a backend's periodic check (nft's check of its
// table, iptables' of its canary chains) every period until a context
// ends, in one goroutine that ends with the context.
package periodic

import (
	"context"
	"time"
)

// Start calls check every period, the first time one period from now,
// until ctx ends, from a goroutine of its own; a check that runs when ctx
// ends finishes first. The channel returned is closed when that goroutine
// has returned (at once when period is not positive: nothing runs).
func Start(ctx context.Context, period time.Duration, check func()) <-chan struct{} {
	done := make(chan struct{})
	if period <= 0 {
		close(done)
		return done
	}
	go func() {
		defer close(done)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if ctx.Err() != nil {
					return
				}
				check()
			}
		}
	}()
	return done
}
