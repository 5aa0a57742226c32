package server

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"sigs.k8s.io/kpng/api/address"
	"sigs.k8s.io/kpng/api/certs"
)

// ListenConfig says where and how the controller serves backends.
type ListenConfig struct {
	// Address is a unix socket (the default, see address.DefaultSocket) or
	// a TCP address.
	Address string
	// TLSCert and TLSKey are the server's certificate and key (PEM files),
	// required on TCP unless Insecure.
	TLSCert, TLSKey string
	// TLSClientCA makes the server require client certificates signed by
	// this CA (PEM file). On TCP with TLS it is required unless
	// NoClientAuth.
	TLSClientCA string
	// NoClientAuth serves TLS on TCP without client certificates: any
	// client that reaches the address can watch any node's view.
	NoClientAuth bool
	// Insecure allows plain TCP, only on a loopback address.
	Insecure bool
	// Limits bound the connections and their streams.
	Limits Limits
}

// Listen opens the listener and returns the gRPC options it needs (the
// message size limits, the Limits, and TLS credentials on TCP). A TCP
// listener is limited to Limits' connections. A unix socket is created
// with mode 0600 (its directory is created 0755 if missing); a stale socket
// file left by a previous run is replaced, any other file is not.
func (c ListenConfig) Listen() (net.Listener, []grpc.ServerOption, error) {
	addr, opts, err := c.Options()
	if err != nil {
		return nil, nil, err
	}
	if addr.Network == "unix" {
		l, err := listenUnix(addr.Addr)
		return l, opts, err
	}
	l, err := net.Listen("tcp", addr.Addr)
	if err != nil {
		return nil, nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	return c.Limits.listener(l), opts, nil
}

// Options checks the configuration (address, TLS files, --insecure only on
// loopback, client certificates on TCP unless NoClientAuth) without
// listening, and returns the parsed address and the gRPC
// options Listen would use.
func (c ListenConfig) Options() (address.Address, []grpc.ServerOption, error) {
	addr, err := address.Parse(c.Address)
	if err != nil {
		return addr, nil, err
	}
	if n := c.Limits.MaxStreamsPerConnection; n > 0 && n < MinStreamsPerConnection {
		return addr, nil, fmt.Errorf("listen %s: %d streams per connection: a backend needs %d (its Watch and its Peers streams)", addr, n, MinStreamsPerConnection)
	}
	opts := append(ServerOptions(), c.Limits.serverOptions()...)
	tlsSet := c.TLSCert != "" || c.TLSKey != "" || c.TLSClientCA != "" || c.NoClientAuth
	switch {
	case addr.Network == "unix" && (tlsSet || c.Insecure):
		return addr, nil, fmt.Errorf("listen %s: TLS, --insecure-no-client-auth and --insecure apply to TCP addresses only", addr)
	case addr.Network == "unix":
	case c.Insecure && tlsSet:
		return addr, nil, fmt.Errorf("listen %s: --insecure and TLS flags are exclusive", addr)
	case c.NoClientAuth && c.TLSClientCA != "":
		return addr, nil, fmt.Errorf("listen %s: --insecure-no-client-auth and --tls-client-ca are exclusive", addr)
	case c.Insecure && !addr.IsLoopback():
		return addr, nil, fmt.Errorf("listen %s: refusing --insecure on a non-loopback address; use TLS", addr)
	case !c.Insecure:
		creds, err := c.serverTLS()
		if err != nil {
			return addr, nil, fmt.Errorf("listen %s: %w", addr, err)
		}
		opts = append(opts, grpc.Creds(creds), grpc.ReadBufferSize(tlsReadBufferBytes))
	}
	return addr, opts, nil
}

// tlsReadBufferBytes is the read buffer of a TLS connection's HTTP/2
// framer: none. gRPC reads a bare unix or TCP socket through a buffer it
// takes from a pool only while bytes are waiting, but any other
// connection, a TLS one among them, through a buffer of its own for the
// connection's life (grpc-go v1.85: 32 KiB by default), 156 MiB of the
// controller's heap with 5,000 TLS backends connected. A controller
// reads little from its backends (the requests, flow-control window
// updates, pings), and the TLS connection already buffers what it
// decrypts, so the framer reads from it directly.
const tlsReadBufferBytes = 0

func (c ListenConfig) serverTLS() (credentials.TransportCredentials, error) {
	if c.TLSCert == "" || c.TLSKey == "" {
		return nil, errors.New("TCP needs --tls-cert and --tls-key (or --insecure on a loopback address)")
	}
	cert, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey)
	if err != nil {
		return nil, fmt.Errorf("load server certificate: %w", err)
	}
	if c.TLSClientCA == "" && !c.NoClientAuth {
		return nil, errors.New("TCP needs client certificates (--tls-client-ca), or --insecure-no-client-auth to serve every node's view to any client that reaches the address")
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if c.TLSClientCA != "" {
		pool, err := certs.LoadPool(c.TLSClientCA)
		if err != nil {
			return nil, err
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return lingerOnReject{credentials.NewTLS(cfg)}, nil
}

// rejectLinger is how long a connection whose TLS handshake the server
// refused stays open for reading, after the server's alert.
const rejectLinger = time.Second

// lingerOnReject gives a client the reason its handshake was refused. With
// TLS 1.3 a client without a certificate finishes its side of the
// handshake before the server checks it, and gRPC writes at once; when the
// server closed the connection right after its alert, that unread write
// made the kernel reset the connection and the client saw only "broken
// pipe". Instead the server ends its side of the connection and reads what
// the client sends until it closes (at most rejectLinger), so that the
// client reads "tls: certificate required".
type lingerOnReject struct {
	credentials.TransportCredentials
}

// ServerHandshake runs the TLS handshake and, when it fails, ends the
// server's side and drains the connection before closing it.
func (l lingerOnReject) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	held := &heldConn{Conn: raw}
	conn, info, err := l.TransportCredentials.ServerHandshake(held)
	if err != nil {
		if cw, ok := raw.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil &&
			raw.SetReadDeadline(time.Now().Add(rejectLinger)) == nil {
			_, _ = io.Copy(io.Discard, raw)
		}
		_ = raw.Close()
		return nil, nil, err
	}
	held.pass.Store(true)
	return conn, info, nil
}

// Clone keeps the wrapper.
func (l lingerOnReject) Clone() credentials.TransportCredentials {
	return lingerOnReject{l.TransportCredentials.Clone()}
}

// heldConn ignores Close until the handshake has succeeded: gRPC's TLS
// credentials close the connection as soon as the handshake fails, and
// lingerOnReject closes it itself after draining.
type heldConn struct {
	net.Conn
	pass atomic.Bool
}

// Close closes the connection once the handshake has succeeded.
func (c *heldConn) Close() error {
	if c.pass.Load() {
		return c.Conn.Close()
	}
	return nil
}
