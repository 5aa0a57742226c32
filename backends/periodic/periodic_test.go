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
	after := n.Load()
	time.Sleep(10 * time.Millisecond)
	if n.Load() != after {
		t.Error("the check ran after the goroutine ended")
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
