package userspace

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/client/endpoints"
)

// maxDatagram is the largest UDP payload.
const maxDatagram = 65535

// flow is the UDP traffic of one client (address and port) through one
// frontend: a socket connected to the flow's endpoint carries the
// client's datagrams there, and its replies go back from the frontend's
// socket, so that they leave from the service address.
type flow struct {
	client netip.AddrPort
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
			klog.V(2).InfoS("UDP read failed", "frontend", f.key, "err", err)
			continue
		}
		client = netip.AddrPortFrom(client.Addr().Unmap(), client.Port())
		fl := f.flowOf(pc, client)
		if fl == nil {
			continue // dropped
		}
		fl.last.Store(time.Now().UnixNano())
		if _, err := fl.up.Write(buf[:n]); err != nil {
			// The endpoint refused an earlier datagram (ICMP): the next
			// datagram starts a new flow, maybe to another endpoint.
			klog.V(2).InfoS("UDP flow ended", "frontend", f.key, "client", client, "endpoint", fl.up.RemoteAddr(), "err", err)
			f.endFlow(fl)
		}
	}
}

// flowOf returns the flow of client, making it if there is none; nil
// means the datagram is dropped.
func (f *frontend) flowOf(pc *net.UDPConn, client netip.AddrPort) *flow {
	f.mu.Lock()
	fl := f.flows[client]
	f.mu.Unlock()
	if fl != nil {
		return fl
	}
	r, v, targets := f.decide(client.Addr())
	if v != endpoints.Forward {
		// Reject happens only while the socket is being closed: the
		// kernel refuses what comes after.
		f.logDenied(r, client.Addr(), v)
		return nil
	}
	t, ok := f.lb.pick(client.Addr(), targets, r.affinity, nil, time.Now())
	if !ok {
		return nil
	}
	if !f.limit.acquire() {
		klog.V(2).InfoS("Connection limit reached: UDP flow dropped", "service", r.service, "frontend", f.key, "client", client, "limit", f.limit.max)
		return nil
	}
	up, err := f.p.sock.dialUDP(t)
	if err != nil {
		f.limit.release()
		klog.ErrorS(err, "UDP flow to endpoint failed", "service", r.service, "port", r.port, "endpoint", t)
		return nil
	}
	fl = &flow{client: client, up: up}
	fl.last.Store(time.Now().UnixNano())
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		f.limit.release()
		_ = up.Close()
		return nil
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
			if errors.Is(err, os.ErrDeadlineExceeded) && time.Since(time.Unix(0, fl.last.Load())) < idle {
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

// endFlow removes fl from the frontend and closes it; the second call
// does nothing.
func (f *frontend) endFlow(fl *flow) {
	f.mu.Lock()
	mine := f.flows[fl.client] == fl
	if mine {
		delete(f.flows, fl.client)
	}
	f.mu.Unlock()
	if mine {
		_ = fl.up.Close()
		f.limit.release()
	}
}
