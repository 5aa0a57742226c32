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

// queueLength bounds the streams waiting for a sender; past it, a stream's
// own goroutine sends.
const queueLength = 1 << 16

// senders is the pool.
type senders struct {
	hub   *Hub
	stop  <-chan struct{}
	stall time.Duration // stallAfter; tests change it
	work  chan *subscription
	start sync.Once
	n     int
}

func newSenders(hub *Hub, stop <-chan struct{}) *senders {
	return &senders{hub: hub, stop: stop, stall: stallAfter, work: make(chan *subscription, queueLength), n: runtime.GOMAXPROCS(0)}
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

// run is one sender, until the server stops or it leaves the pool.
func (p *senders) run() {
	for {
		select {
		case <-p.stop:
			return
		case sub := <-p.work:
			if !p.serve(sub) {
				return
			}
		}
	}
}

// serve sends what sub has to send, as long as it is signaled meanwhile;
// false when this sender left the pool (a send blocked).
func (p *senders) serve(sub *subscription) bool {
	sub.mu.Lock()
	sub.queued = false
	if !sub.pooled || sub.active {
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
		msgs := p.hub.nextShared(sub)
		size := 0
		for _, m := range msgs {
			size += m.size()
		}
		if size > pooledBytes {
			sub.handBack(msgs, nil)
			return true
		}
		for i, m := range msgs {
			blocked := time.AfterFunc(p.stall, func() { go p.run() })
			err := sub.out.send(m)
			if !blocked.Stop() {
				// Another sender took this one's place.
				sub.handBack(msgs[i+1:], err)
				return false
			}
			if err != nil {
				sub.handBack(nil, err)
				return true
			}
		}
		sub.mu.Lock()
		if !sub.again {
			sub.active = false
			sub.mu.Unlock()
			return true
		}
		sub.again = false
		sub.mu.Unlock()
	}
}

// enqueue queues a signal of a pooled stream for the senders; false when
// the stream's own goroutine is to be notified (not pooled, or the queue
// is full).
func (s *subscription) enqueue() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case !s.pooled:
		return false
	case s.active:
		s.again = true
		return true
	case s.queued:
		return true
	}
	select {
	case s.pool.work <- s:
		s.queued = true
		return true
	default:
		s.pooled = false // its own goroutine sends
		return false
	}
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
