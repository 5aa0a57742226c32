package server

// SetLogLimit sets the bound of h's log of encoded rounds (maxLogBytes).
func SetLogLimit(h *Hub, bytes int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.logLimit = bytes
}

// WriteBufferBytes is the size of a connection's write buffer.
const WriteBufferBytes = writeBufferBytes
