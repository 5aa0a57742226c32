package server

import (
	"runtime"
	"sync"
	"time"
)

// The senders: a few goroutines that send the rounds of the
// node-independent streams that are caught up. With thousands of
// backends, each round woke every stream's own goroutine to send a few
// hundred bytes and go back to sleep: measured at 5,000 backends, those
// wake-ups and the hub's signals to them were about a sixth of the
// controller's CPU a change. A caught-up stream is handed to the senders
// instead (its own goroutine waits), which send its rounds among the
// others' in turn. The stream's own goroutine keeps what can take long:
// its first state (a turn, megabytes), a catch-up of more than
// pooledBytes, and everything after one of the senders' sends to it
// blocked (its backend stopped reading): that sender leaves the pool to
// another it starts, hands the stream back, and ends.

// pooledBytes is the most a sender sends to one stream at a time; past
// it, the stream's own goroutine takes over.
const pooledBytes = 64 << 10

// stallAfter is how long a sender's send may block before another sender
// takes its place in the pool.
const stallAfter = 10 * time.Millisecond

// senders is the pool: the streams waiting for a sender, each at most
// once (subscription.queued), so that the queue holds at most as many as
// there are streams.
type senders struct {
	hub   *Hub
	stop  <-chan struct{}
	stall time.Duration // stallAfter; tests change it
	n     int
	start sync.Once

	mu    sync.Mutex
	queue []*subscription
	wake  chan struct{} // a token for each sender at most
}

func newSenders(hub *Hub, stop <-chan struct{}) *senders {
	n := runtime.GOMAXPROCS(0)
	return &senders{hub: hub, stop: stop, stall: stallAfter, n: n, wake: make(chan struct{}, n)}
}

// take hands sub, caught up, to the senders, which send on out until
// they hand it back (handBack).
func (p *senders) take(sub *subscription, out *rawSender) {
	p.start.Do(func() {
		for range p.n {
			go p.run()
		}
	})
	sub.mu.Lock()
	sub.pool, sub.out, sub.pooled = p, out, true
	sub.mu.Unlock()
	sub.signal() // what came while it was not pooled
}

// push queues sub for a sender.
func (p *senders) push(sub *subscription) {
	p.mu.Lock()
	p.queue = append(p.queue, sub)
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// pop takes the next stream waiting, nil when none is.
func (p *senders) pop() *subscription {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.queue) == 0 {
		return nil
	}
	sub := p.queue[0]
	p.queue[0] = nil
	p.queue = p.queue[1:]
	return sub
}

// run is one sender, until the server stops or it leaves the pool.
func (p *senders) run() {
	w := p.newSender()
	for {
		sub := p.pop()
		if sub == nil {
			select {
			case <-p.stop:
				return
			case <-p.wake:
			}
			continue
		}
		if !w.serve(sub) {
			return
		}
	}
}

// sender is one of the pool's goroutines; its timer starts another in
// its place when one of its sends blocks.
type sender struct {
	p     *senders
	timer *time.Timer
}

func (p *senders) newSender() *sender {
	w := &sender{p: p}
	w.timer = time.AfterFunc(time.Hour, func() { go p.run() })
	w.timer.Stop()
	return w
}

// serve sends what sub has to send, as long as it is signaled meanwhile;
// false when this sender left the pool (a send blocked).
func (w *sender) serve(sub *subscription) bool {
	sub.mu.Lock()
	sub.queued = false
	if !sub.pooled || sub.active || sub.closed {
		sub.mu.Unlock()
		return true
	}
	sub.active = true
	sub.mu.Unlock()
	for {
		if sub.wantsAll() {
			sub.handBack(nil, nil) // a whole state: a turn, megabytes
			return true
		}
		msgs := w.p.hub.nextShared(sub)
		size := 0
		for _, m := range msgs {
			size += m.size()
		}
		if size > pooledBytes {
			sub.handBack(msgs, nil)
			return true
		}
		for i, m := range msgs {
			w.timer.Reset(w.p.stall)
			err := sub.out.send(m)
			if !w.timer.Stop() {
				// Another sender took this one's place.
				sub.handBack(msgs[i+1:], err)
				return false
			}
			if err != nil {
				sub.handBack(nil, err)
				return true
			}
		}
		// Let the connection's writer run before the next stream's: gRPC's
		// writer (grpc-go v1.85's loopyWriter) takes a write buffer
		// (writeBufferBytes) from a pool the connections share, copies a
		// message of under 1,000 bytes (its minBatchSize) into it, and
		// yields to gather more before writing and giving it back. Woken
		// one after another with no turn to run, the writers of thousands
		// of streams each held a buffer at once: at 5,000 backends, the
		// first change after a GC (which empties the pool) took the heap
		// from 155 to 704 MB, and reached the first backend up to 389 ms
		// after the tool's watcher saw it. Yielding here keeps a buffer or
		// two in use per P, and the first writes start at once. Check it
		// again when gRPC changes how its writer batches.
		if len(msgs) > 0 {
			runtime.Gosched()
		}
		sub.mu.Lock()
		if !sub.again || sub.closed {
			sub.active = false
			sub.mu.Unlock()
			sub.senderDone.Broadcast()
			return true
		}
		sub.again = false
		sub.mu.Unlock()
	}
}

// enqueue queues a signal of a pooled stream for the senders; false when
// the stream's own goroutine is to be notified (it is not pooled).
func (s *subscription) enqueue() bool {
	s.mu.Lock()
	switch {
	case !s.pooled:
		s.mu.Unlock()
		return false
	case s.active:
		s.again = true
	case !s.queued && !s.closed:
		s.queued = true
		s.mu.Unlock()
		s.pool.push(s)
		return true
	}
	s.mu.Unlock()
	return true
}

// handBack gives a pooled stream back to its own goroutine, with the
// messages it is to send first, or the error that ended a send.
func (s *subscription) handBack(msgs []message, err error) {
	s.mu.Lock()
	s.pooled, s.active, s.again = false, false, false
	s.handed = append(s.handed, msgs...)
	if err != nil && s.failed == nil {
		s.failed = err
	}
	s.mu.Unlock()
	s.senderDone.Broadcast()
	s.wake()
}

// wake wakes the stream's own goroutine.
func (s *subscription) wake() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// fromPool returns what the senders handed back to the stream's own
// goroutine; pooled is true when the stream is still theirs.
func (s *subscription) fromPool() (msgs []message, pooled bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pooled {
		return nil, true, nil
	}
	msgs, err = s.handed, s.failed
	s.handed, s.failed = nil, nil
	return msgs, false, err
}

// close ends a stream's time in the pool when its own goroutine returns:
// no sender takes it up again, and close waits for the one sending to it,
// if any (gRPC does not allow a send after its handler returned).
func (s *subscription) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for s.active {
		s.senderDone.Wait()
	}
}
