package userspace

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"sigs.k8s.io/kpng/model/endpoints"
)

// maxDatagram is the largest UDP payload.
const maxDatagram = 65535

// flow is the UDP traffic of one client (address and port) through one
// frontend: a socket connected to the flow's endpoint carries the
// client's datagrams there, and its replies go back from the frontend's
// socket, so that they leave from the service address.
type flow struct {
	client netip.AddrPort
	target netip.AddrPort
	up     *net.UDPConn
	// last is when the flow last carried a datagram either way
	// (UnixNano).
	last atomic.Int64
}

// serveUDP reads the datagrams sent to pc until it is closed, and passes
// each to its client's flow, made on the client's first datagram.
func (f *frontend) serveUDP(pc *net.UDPConn) {
	defer f.p.wg.Done()
	buf := make([]byte, maxDatagram)
	for {
		n, client, err := pc.ReadFromUDPAddrPort(buf)
		if err != nil {
			if isClosed(err) {
				return
			}
			f.p.logger.V(2).Info("UDP read failed", "frontend", f.key, "err", err)
			continue
		}
		client = netip.AddrPortFrom(client.Addr().Unmap(), client.Port())
		// A flow ended meanwhile (idle, or its endpoint removed) gets
		// the datagram through a new one.
		for range 2 {
			fl := f.flowOf(pc, client)
			if fl == nil {
				break // dropped
			}
			_, err := fl.up.Write(buf[:n])
			if err == nil {
				break
			}
			// Closed meanwhile, or the endpoint refused an earlier
			// datagram (ICMP): end the flow; a new one may go to
			// another endpoint.
			f.p.logger.V(2).Info("UDP flow ended", "frontend", f.key, "client", client, "endpoint", fl.target, "err", err)
			f.endFlow(fl)
		}
	}
}

// flowOf returns the flow of client, making it if there is none; nil
// means the datagram is dropped.
func (f *frontend) flowOf(pc *net.UDPConn, client netip.AddrPort) *flow {
	f.mu.Lock()
	fl := f.flows[client]
	if fl != nil {
		// Under the lock that expiry takes: a flow in use is not idle.
		fl.last.Store(time.Now().UnixNano())
	}
	f.mu.Unlock()
	if fl != nil {
		return fl
	}
	r, v, targets := f.decide(client.Addr())
	if v != endpoints.Forward {
		// Drop (the Local policy, source ranges), or Reject while the
		// socket is being closed (the kernel refuses what comes after).
		f.logDenied(r, client.Addr(), v)
		return nil
	}
	t, ok := f.lb.pick(client.Addr(), targets, r.affinity, nil, time.Now())
	if !ok {
		return nil
	}
	if !f.limit.acquire() {
		f.p.logger.V(2).Info("Connection limit reached: UDP flow dropped", "service", r.service, "frontend", f.key, "client", client, "limit", f.limit.max)
		return nil
	}
	up, err := f.p.sock.dialUDP(t)
	if err != nil {
		f.limit.release()
		f.p.logger.Error(err, "UDP flow to endpoint failed", "service", r.service, "port", r.port, "endpoint", t)
		return nil
	}
	fl = &flow{client: client, target: t, up: up}
	fl.last.Store(time.Now().UnixNano())
	f.mu.Lock()
	if other := f.flows[client]; f.closed || other != nil {
		// Closed meanwhile, or another reader (of a socket opened again)
		// made the client's flow first.
		f.mu.Unlock()
		f.limit.release()
		_ = up.Close()
		return other
	}
	if f.flows == nil {
		f.flows = map[netip.AddrPort]*flow{}
	}
	f.flows[client] = fl
	f.mu.Unlock()
	f.p.wg.Add(1)
	go f.replies(pc, fl)
	return fl
}

// replies sends the endpoint's datagrams of fl back to its client, until
// the flow has been idle for Options.UDPIdleTimeout or is closed.
func (f *frontend) replies(pc *net.UDPConn, fl *flow) {
	defer f.p.wg.Done()
	defer f.endFlow(fl)
	idle := f.p.opts.UDPIdleTimeout
	buf := make([]byte, maxDatagram)
	for {
		_ = fl.up.SetReadDeadline(time.Now().Add(idle))
		n, err := fl.up.Read(buf)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) && !f.expire(fl, idle) {
				continue // the client spoke meanwhile
			}
			return
		}
		fl.last.Store(time.Now().UnixNano())
		if _, err := pc.WriteToUDPAddrPort(buf[:n], fl.client); err != nil {
			return
		}
	}
}

// expire ends fl if it has been idle for idle, and reports whether it
// did; it decides under f.mu, where flowOf marks a flow in use.
func (f *frontend) expire(fl *flow, idle time.Duration) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if time.Since(time.Unix(0, fl.last.Load())) < idle {
		return false
	}
	f.dropFlow(fl)
	return true
}

// endFlow removes fl from the frontend and closes it; the second call
// does nothing.
func (f *frontend) endFlow(fl *flow) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dropFlow(fl)
}

// dropFlow removes fl from the frontend, if it is there, closes it and
// gives its place back. f.mu is held.
func (f *frontend) dropFlow(fl *flow) {
	if f.flows[fl.client] != fl {
		return
	}
	delete(f.flows, fl.client)
	_ = fl.up.Close()
	f.limit.release()
}

// endStaleFlows ends the flows whose endpoint r no longer uses, as
// kube-proxy deletes the conntrack entries of a removed UDP endpoint: the
// client's next datagram starts a flow to a current endpoint. f.mu is
// held.
func (f *frontend) endStaleFlows(r *route) {
	for _, fl := range f.flows {
		if !slices.Contains(r.targets, fl.target) && !slices.Contains(r.clusterTargets, fl.target) {
			f.dropFlow(fl) // its replies goroutine then ends
		}
	}
}
