package server_test

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"

	"sigs.k8s.io/kpng/api/server"
	"sigs.k8s.io/kpng/client/remote"
	"sigs.k8s.io/kpng/internal/testpki"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/localsink/sinktest"
	"sigs.k8s.io/kpng/model"
)

// testServer is a controller serving a hub on a listener.
type testServer struct {
	hub  *server.Hub
	srv  *server.Server
	feed localsink.Handler // full states into the hub
	addr string
	g    *grpc.Server
	done chan struct{}
}

// startServer serves a hub on cfg with the given send timeout until the
// test ends.
func startServer(t *testing.T, cfg server.ListenConfig, sendTimeout time.Duration) *testServer {
	t.Helper()
	return startServerWith(t, cfg, server.Options{SendTimeout: sendTimeout})
}

// startServerWith is startServer with all the server's options.
func startServerWith(t *testing.T, cfg server.ListenConfig, o server.Options) *testServer {
	t.Helper()
	return startServerOn(t, cfg, o, server.NewHub(true))
}

// startServerOn is startServerWith serving a given hub.
func startServerOn(t *testing.T, cfg server.ListenConfig, o server.Options, hub *server.Hub) *testServer {
	t.Helper()
	lis, opts, err := cfg.Listen()
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	g := grpc.NewServer(opts...)
	srv := server.New(hub, o)
	srv.Register(g)
	s := &testServer{hub: hub, srv: srv, feed: localsink.FromFullState(hub), addr: cfg.Address, g: g, done: make(chan struct{})}
	if cfg.Address == "" || lis.Addr().Network() == "tcp" {
		s.addr = lis.Addr().String()
	}
	go func() { defer close(s.done); _ = g.Serve(lis) }()
	t.Cleanup(s.stop)
	return s
}

func (s *testServer) stop() {
	s.g.Stop()
	<-s.done
	s.srv.Stop() // after the connections: its senders end
}

func socketAddr(t *testing.T) string {
	return "unix://" + filepath.Join(t.TempDir(), "kpng.sock")
}

// runClient runs a remote client for node until the test ends, into a
// contract checker (the test fails if the client breaks the contract).
func runClient(t *testing.T, cfg remote.Config) *sinktest.Checker {
	t.Helper()
	return runClientInto(t, cfg, sinktest.NewChecker(nil))
}

// runClientInto is runClient into a given checker.
func runClientInto(t *testing.T, cfg remote.Config, r *sinktest.Checker) *sinktest.Checker {
	t.Helper()
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff, cfg.MaxBackoff = 50*time.Millisecond, 200*time.Millisecond
	}
	sinktest.RunSource(t, "remote.Run", r, func(ctx context.Context, sink localsink.Sink) error {
		return remote.Run(ctx, cfg, sink)
	})
	return r
}

// svc builds a service with endpoints "ip@node" (node optional).
func svc(ns, name string, eps ...*model.Endpoint) *model.ServiceEndpoints {
	return &model.ServiceEndpoints{
		Service:   &model.Service{Namespace: ns, Name: name, Type: "ClusterIP", IPs: model.ServiceIPs{ClusterIPs: model.IPSet{V4: []string{"10.96.0.1"}}}, Ports: []*model.PortMapping{{Protocol: model.TCP, Port: 80, TargetPort: 8080}}},
		Endpoints: eps,
	}
}

func ep(ip, node string) *model.Endpoint {
	return &model.Endpoint{IPs: model.IPSet{V4: []string{ip}}, Ready: true, Serving: true, NodeName: node}
}

// certs writes a CA, a server certificate for 127.0.0.1 and a client
// certificate of node-a (CN=system:node:node-a, O=system:nodes, as
// kubelet's), all signed by the CA, and returns their paths; client
// issues more client certificates.
type certFiles struct {
	ca, serverCert, serverKey, clientCert, clientKey string
	client                                           func(cn string, orgs ...string) (cert, key string)
}

func writeCerts(t *testing.T) certFiles {
	t.Helper()
	dir := t.TempDir()
	ca, err := testpki.NewCA("kpng test CA")
	if err != nil {
		t.Fatal(err)
	}
	f := certFiles{ca: filepath.Join(dir, "ca.pem")}
	if err := ca.WriteCA(f.ca); err != nil {
		t.Fatal(err)
	}
	n := 0
	issue := func(name string, orgs []string, usage x509.ExtKeyUsage, ips ...net.IP) (string, string) {
		t.Helper()
		c, err := ca.Issue(nil, name, orgs, usage, ips...)
		if err != nil {
			t.Fatal(err)
		}
		n++
		cert, key := filepath.Join(dir, fmt.Sprintf("%d.pem", n)), filepath.Join(dir, fmt.Sprintf("%d-key.pem", n))
		if err := testpki.WriteKeyPair(c, cert, key); err != nil {
			t.Fatal(err)
		}
		return cert, key
	}
	f.serverCert, f.serverKey = issue("server", nil, x509.ExtKeyUsageServerAuth, net.ParseIP("127.0.0.1"))
	f.client = func(cn string, orgs ...string) (string, string) {
		return issue(cn, orgs, x509.ExtKeyUsageClientAuth)
	}
	f.clientCert, f.clientKey = f.client("system:node:node-a", "system:nodes")
	return f
}

// dial opens a gRPC connection to the server as cfg's client would (the
// caller closes it).
func dial(t *testing.T, cfg remote.Config) *grpc.ClientConn {
	t.Helper()
	target, opts, err := cfg.DialOptions()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return conn
}
