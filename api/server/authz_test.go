package server_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/api/kpngv1"
	"sigs.k8s.io/kpng/api/server"
	"sigs.k8s.io/kpng/client/remote"
	"sigs.k8s.io/kpng/internal/testio"
	"sigs.k8s.io/kpng/model"
)

// firstBatch watches as node with cfg's credentials (its Address is the
// server's) and returns the first batch received, or the stream's error.
func firstBatch(t *testing.T, cfg remote.Config, node string) (*kpngv1.Batch, error) {
	t.Helper()
	conn := dial(t, cfg)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := kpngv1.NewControllerClient(conn).Watch(ctx, &kpngv1.WatchRequest{NodeName: node})
	if err != nil {
		return nil, err
	}
	return stream.Recv()
}

// localEndpoints are the endpoints a batch sets as local, "service/ip".
func localEndpoints(b *kpngv1.Batch) []string {
	var out []string
	for _, op := range b.GetOps() {
		if se := op.GetSetEndpoint(); se != nil && se.GetEndpoint().GetLocal() {
			out = append(out, se.GetService().GetName()+"/"+se.GetKey())
		}
	}
	return out
}

// tlsServer serves a state with endpoints on node-a and node-z over TLS
// with client certificates.
func tlsServer(t *testing.T, certs certFiles, o server.Options) *testServer {
	t.Helper()
	s := startServerWith(t, server.ListenConfig{Address: "127.0.0.1:0", TLSCert: certs.serverCert, TLSKey: certs.serverKey, TLSClientCA: certs.ca}, o)
	s.feed([]*model.ServiceEndpoints{svc("ns", "a", ep("10.0.0.1", "node-a"), ep("10.0.0.26", "node-z"))})
	return s
}

// TestNodeIdentityFromClientCertificate: with node-a's certificate
// (CN=system:node:node-a, O=system:nodes), a backend watching as node-a,
// or naming no node, gets node-a's view; watching as node-z is refused
// with PermissionDenied naming both nodes, quoted, and counted. Without
// the check, the certificate read node-z's view.
func TestNodeIdentityFromClientCertificate(t *testing.T) {
	certs := writeCerts(t)
	s := tlsServer(t, certs, server.Options{})
	nodeA := remote.Config{Address: s.addr, TLSCA: certs.ca, TLSCert: certs.clientCert, TLSKey: certs.clientKey}
	for _, asked := range []string{"node-a", ""} {
		b, err := firstBatch(t, nodeA, asked)
		if err != nil {
			t.Fatalf("node-a's certificate watching as %q: %v", asked, err)
		}
		if diff := cmp.Diff([]string{"a/10.0.0.1"}, localEndpoints(b)); diff != "" {
			t.Errorf("node-a's certificate watching as %q, local endpoints (-want +got):\n%s", asked, diff)
		}
	}
	_, err := firstBatch(t, nodeA, "node-z")
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `node "node-a" may not watch node "node-z"'s view`) {
		t.Errorf("node-a's certificate watching as node-z: %v, want PermissionDenied naming both nodes", err)
	}
	if n := s.srv.Stats().Refused; n != 1 {
		t.Errorf("%d refusals counted, want 1", n)
	}
}

// TestCertificateWithoutNodeIdentity: a certificate whose common name is
// not system:node:NAME, or that is not in the system:nodes organization,
// is refused by default with PermissionDenied saying what a node identity
// is; with its common name in AnyNodeCommonNames (--tls-any-node-cn) it
// may watch any node's view, and with AnyCertificate so may every
// certificate the CA signed. A node's certificate stays bound to its node
// whatever AnyNodeCommonNames holds.
func TestCertificateWithoutNodeIdentity(t *testing.T) {
	certs := writeCerts(t)
	readerCert, readerKey := certs.client("kpng-reader")
	noOrgCert, noOrgKey := certs.client("system:node:node-z")
	refused := server.Options{}
	readers := server.Options{AnyNodeCommonNames: []string{"kpng-reader"}}
	anyCert := server.Options{AnyNodeCommonNames: []string{server.AnyCertificate}}
	for _, tc := range []struct {
		name       string
		opts       server.Options
		cert, key  string
		wantLocal  []string // nil: refused
		wantRefuse string
	}{
		{"reader, default", refused, readerCert, readerKey, nil, `client certificate "kpng-reader" has no node identity (CN=system:node:NAME, O=system:nodes)`},
		{"node CN without the nodes organization, default", refused, noOrgCert, noOrgKey, nil, `client certificate "system:node:node-z" has no node identity`},
		{"reader, allowed", readers, readerCert, readerKey, []string{"a/10.0.0.26"}, ""},
		{"node CN without the organization, readers allowed", readers, noOrgCert, noOrgKey, nil, "has no node identity"},
		{"node CN without the organization, any certificate", anyCert, noOrgCert, noOrgKey, []string{"a/10.0.0.26"}, ""},
		{"node-a's certificate, any certificate", anyCert, certs.clientCert, certs.clientKey, nil, `node "node-a" may not watch node "node-z"'s view`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tlsServer(t, certs, tc.opts)
			b, err := firstBatch(t, remote.Config{Address: s.addr, TLSCA: certs.ca, TLSCert: tc.cert, TLSKey: tc.key}, "node-z")
			if tc.wantLocal == nil {
				if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), tc.wantRefuse) {
					t.Errorf("watching as node-z: %v, want PermissionDenied saying %q", err, tc.wantRefuse)
				}
				return
			}
			if err != nil {
				t.Fatalf("watching as node-z: %v", err)
			}
			if diff := cmp.Diff(tc.wantLocal, localEndpoints(b)); diff != "" {
				t.Errorf("local endpoints (-want +got):\n%s", diff)
			}
		})
	}
}

// TestTCPRequiresClientCertificates: TLS on TCP without --tls-client-ca
// is refused unless --insecure-no-client-auth says so (then a client
// without a certificate watches any node it names); the opt-out is
// refused with a client CA, on a unix socket and with --insecure.
func TestTCPRequiresClientCertificates(t *testing.T) {
	certs := writeCerts(t)
	tcp := server.ListenConfig{Address: "127.0.0.1:0", TLSCert: certs.serverCert, TLSKey: certs.serverKey}
	for _, tc := range []struct {
		cfg  server.ListenConfig
		want string
	}{
		{tcp, "TCP needs client certificates (--tls-client-ca), or --insecure-no-client-auth"},
		{server.ListenConfig{Address: tcp.Address, TLSCert: tcp.TLSCert, TLSKey: tcp.TLSKey, TLSClientCA: certs.ca, NoClientAuth: true}, "are exclusive"},
		{server.ListenConfig{Address: socketAddr(t), NoClientAuth: true}, "apply to TCP addresses only"},
		{server.ListenConfig{Address: tcp.Address, Insecure: true, NoClientAuth: true}, "are exclusive"},
	} {
		if _, _, err := tc.cfg.Options(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error saying %q", tc.cfg, err, tc.want)
		}
	}
	open := tcp
	open.NoClientAuth = true
	s := startServerWith(t, open, server.Options{})
	s.feed([]*model.ServiceEndpoints{svc("ns", "a", ep("10.0.0.1", "node-a"), ep("10.0.0.26", "node-z"))})
	b, err := firstBatch(t, remote.Config{Address: s.addr, TLSCA: certs.ca}, "node-z")
	if err != nil {
		t.Fatalf("no client certificate with --insecure-no-client-auth: %v", err)
	}
	if diff := cmp.Diff([]string{"a/10.0.0.26"}, localEndpoints(b)); diff != "" {
		t.Errorf("local endpoints (-want +got):\n%s", diff)
	}
}

// TestNodeNameLengthIsBounded: a node name of MaxNodeName bytes is
// served; one byte more is refused with InvalidArgument, the name quoted
// and cut in the error, and logged on one bounded line.
func TestNodeNameLengthIsBounded(t *testing.T) {
	var logs testio.SyncBuffer
	klog.LogToStderr(false)
	klog.SetOutput(&logs)
	defer func() { klog.SetOutput(os.Stderr); klog.LogToStderr(true) }()

	s := startServer(t, server.ListenConfig{Address: socketAddr(t)}, 0)
	s.feed([]*model.ServiceEndpoints{svc("ns", "a", ep("10.1.0.2", "node-a"))})
	if _, err := firstBatch(t, remote.Config{Address: s.addr}, strings.Repeat("n", server.MaxNodeName)); err != nil {
		t.Errorf("a node name of %d bytes: %v", server.MaxNodeName, err)
	}
	long := "node-a\n" + strings.Repeat("x", 60<<10)
	_, err := firstBatch(t, remote.Config{Address: s.addr}, long)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "is longer than 253 bytes") ||
		!strings.Contains(err.Error(), `"node-a\nxxx`) || len(err.Error()) > 1000 {
		t.Errorf("a node name of %d bytes: %.1000v, want InvalidArgument, the name quoted and cut", len(long), err)
	}
	klog.Flush()
	// An error record is written once per severity at and below its own
	// (klog.SetOutput): counted once.
	var refusals int
	seen := map[string]bool{}
	for _, line := range strings.Split(logs.String(), "\n") {
		if seen[line] {
			continue
		}
		seen[line] = true
		if len(line) > 1500 {
			t.Errorf("a log line of %d bytes: %.300s…", len(line), line)
		}
		if strings.Contains(line, "Refusing a backend") {
			refusals++
		}
	}
	if refusals != 1 {
		t.Errorf("%d log records of the refusal, want 1:\n%.3000s", refusals, logs.String())
	}
}
