package userspace

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"sigs.k8s.io/kpng/model/endpoints"
)

// frontend serves one frontendKey: the socket listening on it (none while
// its route rejects everything), and the connections and flows it opened.
// Its route is replaced atomically on a change: connections already open
// keep their endpoint, new ones follow the new route.
type frontend struct {
	key   frontendKey
	p     *Sink
	limit *limiter
	route atomic.Pointer[route]
	lb    balancer

	mu     sync.Mutex
	ln     *net.TCPListener
	pc     *net.UDPConn
	conns  map[io.Closer]struct{}
	flows  map[netip.AddrPort]*flow
	closed bool
}

// limiter counts the connections and flows of one service.
type limiter struct {
	n   atomic.Int64
	max int64
}

// acquire takes a place, and reports false when the service is full.
func (l *limiter) acquire() bool {
	if l.n.Add(1) > l.max {
		l.n.Add(-1)
		return false
	}
	return true
}

// release gives a place back.
func (l *limiter) release() { l.n.Add(-1) }

// setRoute makes r the frontend's route and opens or closes its socket
// accordingly. An error means the socket could not be opened: the route is
// set all the same, and the caller tries again later.
func (f *frontend) setRoute(r *route) error {
	f.route.Store(r)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil
	}
	f.endStaleFlows(r)
	open := f.ln != nil || f.pc != nil
	switch {
	case r.listens() && !open:
		return f.listen()
	case !r.listens() && open:
		// Rejected from now on by the kernel itself; open connections
		// finish.
		f.closeSocket()
	}
	return nil
}

// listen opens the frontend's socket and starts serving it. f.mu is held.
func (f *frontend) listen() error {
	switch f.key.proto {
	case tcpProto:
		ln, err := f.p.sock.listenTCP(f.key.addr)
		if err != nil {
			return fmt.Errorf("service %s port %q: listen on %s: %w", f.route.Load().service, f.route.Load().port, f.key, err)
		}
		f.ln = ln
		f.p.wg.Add(1)
		go f.serveTCP(ln)
	default:
		pc, err := f.p.sock.listenUDP(f.key.addr)
		if err != nil {
			return fmt.Errorf("service %s port %q: listen on %s: %w", f.route.Load().service, f.route.Load().port, f.key, err)
		}
		f.pc = pc
		f.p.wg.Add(1)
		go f.serveUDP(pc)
	}
	return nil
}

// closeSocket stops accepting on the frontend. f.mu is held.
func (f *frontend) closeSocket() {
	if f.ln != nil {
		_ = f.ln.Close()
		f.ln = nil
	}
	if f.pc != nil {
		_ = f.pc.Close()
		f.pc = nil
	}
}

// close stops the frontend: its socket, and every connection and flow it
// opened (the service, or this address of it, is gone).
func (f *frontend) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	f.closeSocket()
	for c := range f.conns {
		_ = c.Close()
	}
	for _, fl := range f.flows {
		_ = fl.up.Close()
	}
}

// track records c as open on the frontend, to be closed with it; it
// reports false (and c is not recorded) when the frontend is closed.
func (f *frontend) track(c io.Closer) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	if f.conns == nil {
		f.conns = map[io.Closer]struct{}{}
	}
	f.conns[c] = struct{}{}
	return true
}

// untrack forgets c.
func (f *frontend) untrack(c io.Closer) {
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
}

// decide returns what to do with a new connection or flow from client.
func (f *frontend) decide(client netip.Addr) (*route, endpoints.Verdict, []netip.AddrPort) {
	r := f.route.Load()
	v, targets := decide(r, client, f.p.opts.ClusterCIDRs, f.p.isLocal)
	return r, v, targets
}

// logDenied logs, at verbosity 4, a connection or flow not proxied.
func (f *frontend) logDenied(r *route, client netip.Addr, v endpoints.Verdict) {
	f.p.logger.V(4).Info("Not proxied", "service", r.service, "port", r.port, "frontend", f.key, "client", client, "verdict", v)
}

// isClosed reports whether err is the error of a closed socket.
func isClosed(err error) bool { return errors.Is(err, net.ErrClosed) }
