package sinktest

import (
	"context"
	"testing"
	"time"

	"sigs.k8s.io/kpng/localsink"
)

// RunSource runs a source (a function feeding sink until ctx ends, such as
// a watcher's Run or remote.Run) into c until tb ends. Then it cancels the
// source, waits for it to return, and fails tb if it does not within 20
// seconds, returns an error, or broke the Sink contract (c.Err). name
// names the source in the failures.
func RunSource(tb testing.TB, name string, c *Checker, run func(ctx context.Context, sink localsink.Sink) error) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, c) }()
	tb.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				tb.Errorf("%s: %v", name, err)
			}
		case <-time.After(20 * time.Second):
			tb.Errorf("%s did not return 20 s after its context was cancelled", name)
		}
		if err := c.Err(); err != nil {
			tb.Errorf("%s broke the Sink contract:\n%v", name, err)
		}
	})
}
