package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"sigs.k8s.io/kpng/api/kpngv1"
	"sigs.k8s.io/kpng/api/server"
	"sigs.k8s.io/kpng/client/remote"
	"sigs.k8s.io/kpng/model"
)

// waitFor polls cond until it holds, failing the test after 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("still waiting for %s", what)
		}
	}
}

// dialFrom returns a gRPC connection to addr (plain TCP) from the local
// address ip.
func dialFrom(t *testing.T, addr, ip string) *grpc.ClientConn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	conn, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// watchFirst watches as node on conn and returns the stream once its
// first batch came, or the error.
func watchFirst(ctx context.Context, conn *grpc.ClientConn, node string) (grpc.ServerStreamingClient[kpngv1.Batch], error) {
	stream, err := kpngv1.NewControllerClient(conn).Watch(ctx, &kpngv1.WatchRequest{NodeName: node})
	if err != nil {
		return nil, err
	}
	if _, err := stream.Recv(); err != nil {
		return nil, err
	}
	return stream, nil
}

// TestStreamsPerConnectionAreLimited: with two streams per connection, a
// third Watch on the same connection is not served (gRPC's client waits
// for a stream slot) until one of the first two ends; another connection
// is served meanwhile. Without the limit, the third gets its state at
// once.
func TestStreamsPerConnectionAreLimited(t *testing.T) {
	s := startServerWith(t, server.ListenConfig{Address: "127.0.0.1:0", Insecure: true, Limits: server.Limits{MaxStreamsPerConnection: 2}}, server.Options{})
	s.feed([]*model.ServiceEndpoints{svc("ns", "a", ep("10.1.0.1", "node-a"))})
	conn := dialFrom(t, s.addr, "127.0.0.1")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first, second := context.WithCancel(ctx)
	defer second()
	if _, err := watchFirst(first, conn, "node-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := watchFirst(ctx, conn, "node-b"); err != nil {
		t.Fatal(err)
	}
	third := make(chan error, 1)
	go func() { _, err := watchFirst(ctx, conn, "node-c"); third <- err }()
	if _, err := watchFirst(ctx, dialFrom(t, s.addr, "127.0.0.1"), "node-d"); err != nil {
		t.Fatalf("another connection: %v", err)
	}
	select {
	case err := <-third:
		t.Fatalf("a third stream on a connection limited to two was served: %v", err)
	case <-time.After(time.Second):
	}
	if n := s.hub.Subscribers(); n != 3 {
		t.Errorf("%d backends watching, want 3 (two on the first connection, one on the second)", n)
	}
	second() // the first stream ends: the third gets its slot
	if err := <-third; err != nil {
		t.Errorf("the third stream once the first ended: %v", err)
	}
}

// TestConnectionsPerClientAndInAllAreLimited: with at most 2 connections
// from one address and 3 in all, the third connection from 127.0.0.1 is
// closed at once (its watch fails with Unavailable) and so is the second
// from 127.0.0.2 once 3 are open; when one closes, a new one is served.
// Without the limits, all are served.
func TestConnectionsPerClientAndInAllAreLimited(t *testing.T) {
	s := startServerWith(t, server.ListenConfig{Address: "127.0.0.1:0", Insecure: true,
		Limits: server.Limits{MaxConnections: 3, MaxConnectionsPerClient: 2}}, server.Options{})
	s.feed([]*model.ServiceEndpoints{svc("ns", "a", ep("10.1.0.1", "node-a"))})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watch := func(ip, node string) (*grpc.ClientConn, error) {
		conn := dialFrom(t, s.addr, ip)
		wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
		t.Cleanup(wcancel)
		_, err := watchFirst(wctx, conn, node)
		return conn, err
	}
	refused := func(what string, err error) {
		t.Helper()
		if status.Code(err) != codes.Unavailable {
			t.Errorf("%s: %v, want Unavailable (the connection closed at once)", what, err)
		}
	}
	a1, err := watch("127.0.0.1", "a1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := watch("127.0.0.1", "a2"); err != nil {
		t.Fatal(err)
	}
	_, err = watch("127.0.0.1", "a3")
	refused("a third connection from 127.0.0.1", err)
	if _, err := watch("127.0.0.2", "b1"); err != nil {
		t.Fatalf("a connection from 127.0.0.2: %v", err)
	}
	_, err = watch("127.0.0.2", "b2")
	refused("a fourth connection in all", err)
	a1.Close()
	waitFor(t, "a1's stream to end", func() bool { return s.hub.Subscribers() == 2 })
	if _, err := watch("127.0.0.2", "b3"); err != nil {
		t.Errorf("a connection once another closed: %v", err)
	}
}

// TestIdleAndSlowConnectionsAreClosed: a connection that sends the
// HTTP/2 preface and its settings, then no stream, is closed after the
// idle timeout (GOAWAY, then the server's close); one that sends nothing
// (no TLS handshake) is closed after the handshake timeout. Without
// either, the server keeps them open (gRPC's defaults: never, 120 s).
func TestIdleAndSlowConnectionsAreClosed(t *testing.T) {
	certs := writeCerts(t)
	s := startServerWith(t, server.ListenConfig{Address: "127.0.0.1:0", TLSCert: certs.serverCert, TLSKey: certs.serverKey, TLSClientCA: certs.ca,
		Limits: server.Limits{ConnectionIdleTimeout: 300 * time.Millisecond, HandshakeTimeout: 300 * time.Millisecond}}, server.Options{})
	plain := startServerWith(t, server.ListenConfig{Address: "127.0.0.1:0", Insecure: true,
		Limits: server.Limits{ConnectionIdleTimeout: 300 * time.Millisecond, HandshakeTimeout: 300 * time.Millisecond}}, server.Options{})

	// closedWithin reads c until the server closes it.
	closedWithin := func(what string, c net.Conn, d time.Duration) (goAway bool) {
		t.Helper()
		c.SetReadDeadline(time.Now().Add(d))
		fr := http2.NewFramer(io.Discard, c)
		for {
			f, err := fr.ReadFrame()
			if _, ok := f.(*http2.GoAwayFrame); ok {
				goAway = true
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Errorf("%s: still open after %v", what, d)
				return goAway
			}
			if err != nil {
				return goAway
			}
		}
	}

	silent, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	silent.SetReadDeadline(time.Now().Add(20 * time.Second))
	n, err := silent.Read(make([]byte, 1))
	if err == nil {
		t.Errorf("a connection without a handshake read %d bytes, want it closed", n)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Errorf("a connection without a handshake: still open after 20 s")
	}

	idle, err := net.Dial("tcp", plain.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	if _, err := io.WriteString(idle, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	if err := http2.NewFramer(idle, nil).WriteSettings(); err != nil {
		t.Fatal(err)
	}
	if !closedWithin("an idle connection after the preface", idle, 20*time.Second) {
		t.Errorf("an idle connection was closed without a GOAWAY")
	}
}

// TestFirstStatesAreSentAFewAtATime: with one whole state at a time, a
// backend that stops reading in the middle of its first state (larger
// than the flow-control windows) holds the turn, and a second backend
// waits, holding nothing but its subscription, until the first is gone;
// then it gets its state. Without the bound, the second is served at once
// (and N stalled backends hold N encoded states).
func TestFirstStatesAreSentAFewAtATime(t *testing.T) {
	addr := socketAddr(t)
	s := startServerWith(t, server.ListenConfig{Address: addr}, server.Options{SendTimeout: 10 * time.Minute, MaxConcurrentFirstStates: 1})
	node := strings.Repeat("n", 600) // large endpoints: a state over the windows
	var state []*model.ServiceEndpoints
	for i := range 2000 {
		var eps []*model.Endpoint
		for j := range 8 {
			eps = append(eps, ep(net.IPv4(10, byte(i>>8), byte(i), byte(j+1)).String(), node))
		}
		state = append(state, svc("ns", fmt.Sprintf("s%05d", i), eps...))
	}
	s.feed(state)

	stalledCtx, stall := context.WithCancel(context.Background())
	defer stall()
	if _, err := kpngv1.NewControllerClient(dialUnix(t, addr)).Watch(stalledCtx, &kpngv1.WatchRequest{NodeName: "stalled"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the stalled backend's first batch", func() bool { return s.srv.Stats().SentBatches > 0 })

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	second := make(chan error, 1)
	go func() { _, err := watchFirst(ctx, dialUnix(t, addr), "node-b"); second <- err }()
	waitFor(t, "the second backend to subscribe", func() bool { return s.hub.Subscribers() == 2 })
	select {
	case err := <-second:
		t.Fatalf("a second first state was sent while the stalled one held the only turn: %v", err)
	case <-time.After(time.Second):
	}
	stall()
	if err := <-second; err != nil {
		t.Errorf("the second backend once the stalled one was gone: %v", err)
	}
}

// dialUnix returns a gRPC connection to the unix socket address addr.
func dialUnix(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn := dial(t, remote.Config{Address: addr})
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestStreamsPerNodeAreLimited: with two streams per node, a third
// watching node-a is refused with ResourceExhausted naming the node and
// the flag; once one of node-a's streams ends, a new one is served. With node-a's client certificate the count is the
// certificate's node, whatever the request names. Without the limit, the
// third is served.
func TestStreamsPerNodeAreLimited(t *testing.T) {
	certs := writeCerts(t)
	s := tlsServer(t, certs, server.Options{MaxStreamsPerNode: 2})
	nodeA := remote.Config{Address: s.addr, TLSCA: certs.ca, TLSCert: certs.clientCert, TLSKey: certs.clientKey}
	conn := dial(t, nodeA)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	firstCtx, endFirst := context.WithCancel(ctx)
	defer endFirst()
	if _, err := watchFirst(firstCtx, conn, "node-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := watchFirst(ctx, conn, ""); err != nil {
		t.Fatal(err)
	}
	_, err := watchFirst(ctx, conn, "node-a")
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), `node "node-a" already has 2 streams`) {
		t.Errorf("a third stream of node-a: %v, want ResourceExhausted naming the node", err)
	}
	endFirst()
	waitFor(t, "node-a's first stream to end", func() bool { return s.hub.Subscribers() == 1 })
	if _, err := watchFirst(ctx, conn, "node-a"); err != nil {
		t.Errorf("a stream of node-a once another ended: %v", err)
	}
}
