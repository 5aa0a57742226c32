package server

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestWatchdogExpiresOnlyLongSends checks that the watchdog closes the
// expired channel of a send older than the timeout only, stops watching
// it, and that its goroutine ends when no stream is watched and starts
// again with the next one.
func TestWatchdogExpiresOnlyLongSends(t *testing.T) {
	w := newWatchdog(time.Hour)
	w.period = time.Hour // its goroutine's ticks never come in this test
	now := time.Now()
	var stalled, busy, idle atomic.Int64
	stalled.Store(now.Add(-2 * time.Hour).UnixNano())
	busy.Store(now.Add(-time.Minute).UnixNano())
	wStalled, wBusy, wIdle := w.watch(&stalled), w.watch(&busy), w.watch(&idle)

	if !w.check(now) {
		t.Fatal("check says no stream is watched, want two")
	}
	select {
	case <-wStalled.expired:
	default:
		t.Error("a send started two hours ago with a one-hour timeout did not expire")
	}
	for name, ws := range map[string]*watchedSend{"a send started a minute ago": wBusy, "a stream not sending": wIdle} {
		select {
		case <-ws.expired:
			t.Errorf("%s expired", name)
		default:
		}
	}
	// Expired once: no longer watched (closing it again would panic).
	if !w.check(now.Add(3 * time.Hour)) {
		t.Fatal("check says no stream is watched, want the busy one and the idle one")
	}
	select {
	case <-wBusy.expired:
	default:
		t.Error("the busy send did not expire an hour later")
	}
	w.forget(wIdle)
	w.forget(wStalled) // forgetting an expired one is harmless
	if w.check(now) {
		t.Error("check says a stream is still watched after all were forgotten or expired")
	}
}

// TestWatchdogGoroutineEnds checks that the watchdog's goroutine ends
// once the last stream is forgotten, and that watching again starts it.
func TestWatchdogGoroutineEnds(t *testing.T) {
	w := newWatchdog(40 * time.Millisecond) // looks every 10 ms
	var since atomic.Int64
	isRunning := func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.running
	}
	waitStopped := func() {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); isRunning(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the watchdog's goroutine still runs 10 s after its last stream was forgotten")
			}
		}
	}
	ws := w.watch(&since)
	if !isRunning() {
		t.Fatal("watching a stream did not start the watchdog")
	}
	w.forget(ws)
	waitStopped()

	// Watching again starts it again, and it expires a stalled send.
	since.Store(time.Now().UnixNano())
	ws = w.watch(&since)
	select {
	case <-ws.expired:
	case <-time.After(10 * time.Second):
		t.Fatal("a send in progress for 10 s with a 40 ms timeout did not expire")
	}
	waitStopped() // its only stream expired
}
