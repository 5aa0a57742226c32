package userspace

import (
	"io"
	"net"
	"net/netip"
	"time"

	"sigs.k8s.io/kpng/model"
	"sigs.k8s.io/kpng/model/endpoints"
)

// tcpProto is the protocol of TCP frontends.
const tcpProto = model.TCP

// serveTCP accepts the connections of ln until it is closed.
func (f *frontend) serveTCP(ln *net.TCPListener) {
	defer f.p.wg.Done()
	var delay time.Duration
	for {
		c, err := ln.AcceptTCP()
		if err != nil {
			if isClosed(err) {
				return
			}
			// Out of file descriptors, say: wait a little, as
			// net/http does, rather than spin.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			f.p.logger.Error(err, "Accept failed", "frontend", f.key, "retryIn", delay)
			time.Sleep(delay)
			continue
		}
		delay = 0
		if !f.track(c) {
			_ = c.Close()
			continue
		}
		f.p.wg.Add(1)
		go f.handleTCP(c)
	}
}

// handleTCP proxies one accepted connection: it picks an endpoint, dials
// it (trying the next one when it does not answer), and copies both ways
// until both are done.
func (f *frontend) handleTCP(c *net.TCPConn) {
	defer f.p.wg.Done()
	defer f.untrack(c)
	defer c.Close()
	client := addrOf(c.RemoteAddr())
	r, v, targets := f.decide(client)
	switch v {
	case endpoints.Reject:
		f.logDenied(r, client, v)
		_ = c.SetLinger(0) // a reset, as the kernel would send
		return
	case endpoints.Drop:
		f.logDenied(r, client, v)
		f.hold(c)
		return
	}
	if !f.limit.acquire() {
		f.p.logger.V(2).Info("Connection limit reached: reset", "service", r.service, "frontend", f.key, "client", client, "limit", f.limit.max)
		_ = c.SetLinger(0)
		return
	}
	defer f.limit.release()
	up, ok := f.dialTCP(r, client, targets)
	if !ok {
		_ = c.SetLinger(0)
		return
	}
	defer up.Close()
	if !f.track(up) {
		return
	}
	defer f.untrack(up)
	splice(c, up)
}

// dropHold is how long a dropped connection is held in silence, and
// maxHeld how many the proxier holds at once (beyond, they are closed at
// once): held connections come from clients the service refuses, so they
// do not count against the service's own limit.
const (
	dropHold = 30 * time.Second
	maxHeld  = 1024
)

// hold is what a userspace proxy can do closest to dropping a connection:
// the kernel completed the handshake, so the client is kept waiting
// without a byte, its data read and discarded, until it gives up or
// dropHold passes; then the connection is closed without a reset.
func (f *frontend) hold(c *net.TCPConn) {
	if !f.p.held.acquire() {
		return
	}
	defer f.p.held.release()
	_ = c.SetReadDeadline(time.Now().Add(dropHold))
	_, _ = io.Copy(io.Discard, c)
}

// dialTCP connects to an endpoint for client, trying up to
// Options.DialAttempts endpoints.
func (f *frontend) dialTCP(r *route, client netip.Addr, targets []netip.AddrPort) (*net.TCPConn, bool) {
	var tried []netip.AddrPort
	for range f.p.opts.DialAttempts {
		t, ok := f.lb.pick(client, targets, r.affinity, tried, time.Now())
		if !ok {
			break
		}
		up, err := f.p.sock.dialTCP(t, f.p.opts.DialTimeout)
		if err == nil {
			return up, true
		}
		f.p.logger.V(2).Info("Endpoint did not answer, trying another", "service", r.service, "port", r.port, "endpoint", t, "err", err)
		tried = append(tried, t)
	}
	f.p.logger.V(2).Info("No endpoint answered: reset", "service", r.service, "port", r.port, "frontend", f.key, "client", client, "tried", tried)
	return nil, false
}

// splice copies a to b and b to a (with splice(2) on Linux, as io.Copy
// between TCP connections does) until both directions are done. The end of
// one direction is passed on as a half-close; an error on either closes
// both.
func splice(a, b *net.TCPConn) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		oneWay(b, a)
	}()
	oneWay(a, b)
	<-done
}

// oneWay copies from src to dst, then half-closes dst, or closes both on
// an error.
func oneWay(dst, src *net.TCPConn) {
	if _, err := io.Copy(dst, src); err != nil {
		_ = src.Close()
		_ = dst.Close()
		return
	}
	_ = dst.CloseWrite()
}

// addrOf returns the address of a TCP or UDP net.Addr, unmapped.
func addrOf(a net.Addr) netip.Addr {
	switch a := a.(type) {
	case *net.TCPAddr:
		ip, _ := netip.AddrFromSlice(a.IP)
		return ip.Unmap()
	case *net.UDPAddr:
		ip, _ := netip.AddrFromSlice(a.IP)
		return ip.Unmap()
	}
	return netip.Addr{}
}
