package server_test

import (
	"crypto/tls"
	"net"
	"runtime"
	"testing"
	"time"

	"golang.org/x/net/http2"

	apicerts "sigs.k8s.io/kpng/api/certs"
	"sigs.k8s.io/kpng/api/server"
	"sigs.k8s.io/kpng/internal/racebuild"
)

// TestTLSConnectionsHoldNoReadBuffer opens 200 TLS connections to a
// controller (each with its client certificate, the HTTP/2 preface and
// settings, until the server's settings arrive) and checks what each
// holds of the heap (both ends: the test is the clients too). gRPC gave a
// TLS connection a read buffer of its own for its life (32 KiB): 156 MiB
// of a controller with 5,000 backends (kpng-scale --tls).
func TestTLSConnectionsHoldNoReadBuffer(t *testing.T) {
	const n = 200
	certs := writeCerts(t)
	s := startServer(t, server.ListenConfig{Address: "127.0.0.1:0", TLSCert: certs.serverCert, TLSKey: certs.serverKey, TLSClientCA: certs.ca,
		Limits: server.Limits{MaxConnections: -1, MaxConnectionsPerClient: -1}}, 0)
	cert, err := tls.LoadX509KeyPair(certs.clientCert, certs.clientKey)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := apicerts.LoadPool(certs.ca)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, ServerName: "127.0.0.1", NextProtos: []string{"h2"}, Certificates: []tls.Certificate{cert}}

	open := func() net.Conn {
		t.Helper()
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", s.addr, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
			t.Fatal(err)
		}
		fr := http2.NewFramer(c, c)
		if err := fr.WriteSettings(); err != nil {
			t.Fatal(err)
		}
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				t.Fatalf("the server's settings: %v", err)
			}
			if sf, ok := f.(*http2.SettingsFrame); ok && !sf.IsAck() {
				return c // the server's transport is set up
			}
		}
	}
	open() // one first: the server's pools and tables
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	for range n {
		open()
	}
	after := heap()
	per := (int64(after) - int64(before)) / n
	t.Logf("%d TLS connections: %d bytes of heap each (both ends)", n, per)
	if racebuild.Enabled {
		return // the race detector's shadow allocations
	}
	if limit := int64(40 << 10); per >= limit {
		t.Errorf("a TLS connection holds %d bytes of heap (both ends), want under %d: a read buffer of its own?", per, limit)
	}
}
