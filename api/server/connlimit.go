package server

import (
	"errors"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"k8s.io/klog/v2"
)

// Defaults of Limits.
const (
	// DefaultMaxStreamsPerConnection is the number of streams a
	// connection may have open at once: a backend watches with one and
	// learns the controller's replicas with another (its Peers call).
	DefaultMaxStreamsPerConnection = 8
	// MinStreamsPerConnection is the least MaxStreamsPerConnection a
	// listener takes (0 aside, the default): with one, a backend's Peers
	// stream, which never ends, would hold its Watch back for good.
	MinStreamsPerConnection = 2
	// DefaultMaxConnections is the number of TCP connections served at
	// once: two backends on each of 5,000 nodes.
	DefaultMaxConnections = 10000
	// DefaultMaxConnectionsPerClient is the number of TCP connections
	// served at once from one client address (a node).
	DefaultMaxConnectionsPerClient = 16
	// DefaultConnectionIdleTimeout is how long a connection without a
	// stream stays open.
	DefaultConnectionIdleTimeout = 5 * time.Minute
	// DefaultHandshakeTimeout is how long a new connection has for its
	// TLS handshake and HTTP/2 preface.
	DefaultHandshakeTimeout = 10 * time.Second
)

// Limits bound what clients can hold of the controller. A field's zero
// value means its default; a negative value, no limit.
type Limits struct {
	// MaxStreamsPerConnection bounds the streams open at once on one
	// connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS: a client's
	// further streams wait).
	MaxStreamsPerConnection int
	// MaxConnections and MaxConnectionsPerClient bound the TCP
	// connections served at once, in all and from one client IP address.
	// A connection past either is closed as soon as it is accepted. A
	// unix socket is not limited: its mode keeps others out.
	MaxConnections, MaxConnectionsPerClient int
	// ConnectionIdleTimeout is how long a connection without a stream is
	// kept (it is then closed gracefully: HTTP/2 GOAWAY).
	ConnectionIdleTimeout time.Duration
	// HandshakeTimeout is how long a new connection has for its TLS
	// handshake and HTTP/2 preface before it is closed.
	HandshakeTimeout time.Duration
}

func orDefault[T int | time.Duration](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

// withDefaults returns l with its zero fields set to their defaults.
func (l Limits) withDefaults() Limits {
	l.MaxStreamsPerConnection = orDefault(l.MaxStreamsPerConnection, DefaultMaxStreamsPerConnection)
	l.MaxConnections = orDefault(l.MaxConnections, DefaultMaxConnections)
	l.MaxConnectionsPerClient = orDefault(l.MaxConnectionsPerClient, DefaultMaxConnectionsPerClient)
	l.ConnectionIdleTimeout = orDefault(l.ConnectionIdleTimeout, DefaultConnectionIdleTimeout)
	l.HandshakeTimeout = orDefault(l.HandshakeTimeout, DefaultHandshakeTimeout)
	return l
}

// serverOptions returns the gRPC options enforcing the per-connection
// limits.
func (l Limits) serverOptions() []grpc.ServerOption {
	l = l.withDefaults()
	var opts []grpc.ServerOption
	if l.MaxStreamsPerConnection > 0 {
		opts = append(opts, grpc.MaxConcurrentStreams(uint32(l.MaxStreamsPerConnection)))
	}
	if l.ConnectionIdleTimeout > 0 {
		opts = append(opts, grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: l.ConnectionIdleTimeout}))
	}
	if l.HandshakeTimeout > 0 {
		opts = append(opts, grpc.ConnectionTimeout(l.HandshakeTimeout))
	}
	return opts
}

// listener returns inner limited to l's connections in all and per client
// address.
func (l Limits) listener(inner net.Listener) net.Listener {
	l = l.withDefaults()
	if l.MaxConnections < 0 && l.MaxConnectionsPerClient < 0 {
		return inner
	}
	return &limitListener{Listener: inner, max: l.MaxConnections, perClient: l.MaxConnectionsPerClient, byClient: map[string]int{}}
}

// limitListener is a net.Listener that counts the connections it accepted
// and has not seen closed, in all and per client IP address, and closes a
// new connection past either limit at once.
type limitListener struct {
	net.Listener
	max, perClient int // < 0: no limit

	mu       sync.Mutex
	total    int
	byClient map[string]int
	refused  uint64
}

// Accept returns the next connection within the limits; the others are
// closed and logged (V(2): a flood of them should not flood the log), and
// counted.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		client := clientHost(c.RemoteAddr())
		l.mu.Lock()
		over := (l.max >= 0 && l.total >= l.max) || (l.perClient >= 0 && l.byClient[client] >= l.perClient)
		if over {
			l.refused++
			total, fromClient := l.total, l.byClient[client]
			l.mu.Unlock()
			klog.V(2).InfoS("Refusing a connection past the limits", "client", client,
				"connections", total, "maxConnections", l.max, "clientConnections", fromClient, "maxConnectionsPerClient", l.perClient)
			_ = c.Close()
			continue
		}
		l.total++
		l.byClient[client]++
		l.mu.Unlock()
		return &countedConn{Conn: c, release: func() { l.release(client) }}, nil
	}
}

func (l *limitListener) release(client string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if l.byClient[client]--; l.byClient[client] <= 0 {
		delete(l.byClient, client)
	}
}

// clientHost is the IP address of a TCP peer, or the whole address of
// another kind.
func clientHost(a net.Addr) string {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

// countedConn gives its slot back on its first Close.
type countedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

// Close closes the connection and releases its slot once.
func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// CloseWrite shuts the writing side of a TCP connection down (as the
// handshake's refusal does, see lingerOnReject).
func (c *countedConn) CloseWrite() error {
	cw, ok := c.Conn.(interface{ CloseWrite() error })
	if !ok {
		return errors.New("the connection cannot close its writing side alone")
	}
	return cw.CloseWrite()
}
