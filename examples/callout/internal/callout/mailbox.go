package callout

import "sync"

// mailbox holds at most one value, the latest one put: putting replaces
// whatever was not taken yet. Put never blocks (beyond a short mutex), so
// a producer is never held up by a slow consumer.
type mailbox struct {
	mu    sync.Mutex
	value []byte
	full  bool          // value holds a state not taken yet (an empty state is a state)
	ready chan struct{} // one token while full, so the consumer can select on it
}

// newMailbox returns an empty mailbox.
func newMailbox() *mailbox {
	return &mailbox{ready: make(chan struct{}, 1)}
}

// put stores v, replacing any value not taken yet.
func (m *mailbox) put(v []byte) {
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
func (m *mailbox) take() (v []byte, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok = m.value, m.full
	m.value, m.full = nil, false
	return v, ok
}

// wait returns a channel that receives when a value may have been put since
// the last take. The consumer must still call take, which may find the
// mailbox empty (the value was taken without consuming the token).
func (m *mailbox) wait() <-chan struct{} { return m.ready }
