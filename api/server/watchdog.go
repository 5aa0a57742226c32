package server

import (
	"sync"
	"sync/atomic"
	"time"
)

// watchdog finds the streams whose send in progress has outlasted the send
// timeout (a backend that stopped reading: gRPC's Send blocks on flow
// control). One goroutine looks at every stream, and only while there are
// streams to look at: a ticker in each stream's own goroutine woke every
// stream's goroutine once a second, 5,000 wake-ups a second with 5,000
// idle backends connected.
type watchdog struct {
	timeout, period time.Duration

	mu      sync.Mutex
	watched map[*watchedSend]struct{}
	running bool // the goroutine of run is on
}

// watchedSend is one stream's sends as the watchdog sees them.
type watchedSend struct {
	// since is the start time (Unix ns) of the stream's send in
	// progress, 0 when none is: the stream's own.
	since *atomic.Int64
	// expired is closed when a send outlasted the timeout; the stream is
	// no longer watched then.
	expired chan struct{}
}

// newWatchdog returns a watchdog of timeout, which looks every quarter of
// it, at most every second.
func newWatchdog(timeout time.Duration) *watchdog {
	return &watchdog{timeout: timeout, period: min(timeout/4, time.Second), watched: map[*watchedSend]struct{}{}}
}

// watch starts watching the sends whose start time since holds; the
// caller calls forget with the result when the stream ends.
func (w *watchdog) watch(since *atomic.Int64) *watchedSend {
	ws := &watchedSend{since: since, expired: make(chan struct{})}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.watched[ws] = struct{}{}
	if !w.running {
		w.running = true
		go w.run()
	}
	return ws
}

// forget stops watching ws.
func (w *watchdog) forget(ws *watchedSend) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.watched, ws)
}

// run looks at the watched sends every period until none is watched.
func (w *watchdog) run() {
	tick := time.NewTicker(w.period)
	defer tick.Stop()
	for range tick.C {
		if !w.check(time.Now()) {
			return
		}
	}
}

// check closes the expired channel of every send started more than the
// timeout before now, and tells whether any stream is still watched
// (when none is, the goroutine of run ends: the next watch starts
// another).
func (w *watchdog) check(now time.Time) bool {
	limit := now.Add(-w.timeout).UnixNano()
	w.mu.Lock()
	defer w.mu.Unlock()
	for ws := range w.watched {
		if since := ws.since.Load(); since != 0 && since < limit {
			close(ws.expired)
			delete(w.watched, ws)
		}
	}
	if len(w.watched) == 0 {
		w.running = false
		return false
	}
	return true
}
