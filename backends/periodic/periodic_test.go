package periodic

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

func TestStartRunsUntilCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var n atomic.Int32
	ran := make(chan struct{}, 10)
	done := Start(ctx, time.Millisecond, func() {
		n.Add(1)
		select {
		case ran <- struct{}{}:
		default:
		}
	})
	for range 3 {
		select {
		case <-ran:
		case <-time.After(10 * time.Second):
			t.Fatal("the check did not run")
		}
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the goroutine did not end with the context")
	}
}

// TestStartDoneWaitsForCheck: a check running when the context ends
// finishes before done is closed, so that a caller waiting on done knows
// no check is left running.
func TestStartDoneWaitsForCheck(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	running, release := make(chan struct{}), make(chan struct{})
	var once atomic.Bool
	done := Start(ctx, time.Millisecond, func() {
		if once.CompareAndSwap(false, true) {
			close(running)
			<-release
		}
	})
	<-running
	cancel()
	select {
	case <-done:
		t.Fatal("done closed while a check was still running")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the goroutine did not end after its check returned")
	}
}

func TestStartWithoutPeriod(t *testing.T) {
	for _, period := range []time.Duration{0, -time.Second} {
		done := Start(context.Background(), period, func() { t.Error("check ran") })
		select {
		case <-done:
		default:
			t.Errorf("period %v: done not closed", period)
		}
	}
}
