package callout

import "sync"

// mailbox holds at most one value, the latest one put: putting replaces
// whatever was not taken yet. Put never blocks (beyond a short mutex), so
// a producer is never held up by a slow consumer.
type mailbox[T any] struct {
	mu    sync.Mutex
	value T
	full  bool          // value holds a value not taken yet (an empty state is a state)
	ready chan struct{} // one token while full, so the consumer can select on it
}

// newMailbox returns an empty mailbox.
func newMailbox[T any]() *mailbox[T] {
	return &mailbox[T]{ready: make(chan struct{}, 1)}
}

// put stores v, replacing any value not taken yet.
func (m *mailbox[T]) put(v T) {
	m.mu.Lock()
	m.value, m.full = v, true
	m.mu.Unlock()
	select {
	case m.ready <- struct{}{}:
	default: // a token is already waiting
	}
}

// take returns the value and empties the mailbox; ok is false when it was
// empty.
func (m *mailbox[T]) take() (v T, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var zero T
	v, ok = m.value, m.full
	m.value, m.full = zero, false
	return v, ok
}

// wait returns a channel that receives when a value may have been put since
// the last take. The consumer must still call take, which may find the
// mailbox empty (the value was taken without consuming the token).
func (m *mailbox[T]) wait() <-chan struct{} { return m.ready }
