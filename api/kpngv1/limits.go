package kpngv1

// Transport limits shared by the controller and its backends.
const (
	// MaxBatchSize bounds the messages the controller sends (and backends
	// accept).
	MaxBatchSize = 16 << 20
	// MaxRequestSize bounds the messages the controller accepts (backends
	// only send a WatchRequest).
	MaxRequestSize = 64 << 10
	// WindowSize is the HTTP/2 flow-control window of streams and
	// connections, on both sides: large enough that a first state of
	// megabytes is not paced by window updates.
	WindowSize = 4 << 20
	// MaxPeers bounds the replica addresses of a Peers message: a
	// controller sends at most this many, a backend refuses a longer list.
	MaxPeers = 256
)
