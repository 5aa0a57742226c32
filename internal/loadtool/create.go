package loadtool

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// createAttempts bounds the tries of one object when the API server times
// out (etcd's "request timed out" on a loaded machine) or is throttling.
const createAttempts = 5

// CreateAll calls create(ctx, i) for i in [0, n) with workers concurrent
// calls, logging every 2,000, and returns the first error (the others are
// then not started). A call that fails as the API server's timeout or
// throttling is tried again, up to 5 times with a growing pause: a write
// that timed out may still have been made, so create should count
// AlreadyExists as done (IgnoreExists).
func CreateAll(ctx context.Context, n, workers int, logf func(string, ...any), create func(ctx context.Context, i int) error) error {
	workers = max(workers, 1)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range next {
				if err := Retry(ctx, func() error { return create(ctx, i) }); err != nil {
					cancel(err)
					return
				}
			}
		})
	}
loop:
	for i := range n {
		select {
		case next <- i:
			if i > 0 && i%2000 == 0 {
				logf("%d services created", i)
			}
		case <-ctx.Done():
			break loop
		}
	}
	close(next)
	wg.Wait()
	return context.Cause(ctx)
}

// Retry calls f until it succeeds, fails otherwise than as the API
// server timing out or throttling, or has been tried 5 times (CreateAll
// does so for each object).
func Retry(ctx context.Context, f func() error) error {
	var err error
	for attempt := range createAttempts {
		if err = f(); err == nil || !transient(err) {
			return err
		}
		if attempt == createAttempts-1 {
			break
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(attempt+1) * 500 * time.Millisecond):
		}
	}
	return fmt.Errorf("after %d attempts: %w", createAttempts, err)
}

// transient reports whether err is the API server timing out or
// throttling, worth trying again: an internal error only when it says it
// timed out (etcd's "request timed out"; others, as a full service IP
// range, would fail again).
func transient(err error) bool {
	if apierrors.IsInternalError(err) {
		return strings.Contains(err.Error(), "timed out") || strings.Contains(err.Error(), "timeout")
	}
	return apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsServiceUnavailable(err)
}

// IgnoreExists returns err, or nil when it says the object exists (made
// by an earlier try that timed out).
func IgnoreExists(err error) error {
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}
