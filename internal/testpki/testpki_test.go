package testpki

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"path/filepath"
	"slices"
	"testing"

	"sigs.k8s.io/kpng/api/certs"
)

// TestIssueVerifiesAndWrites checks that a server and a client
// certificate verify against the CA for their usage and names, and that
// what is written loads back as a key pair and a CA pool.
func TestIssueVerifiesAndWrites(t *testing.T) {
	ca, err := NewCA("test CA")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ca.Issue(nil, "server", nil, x509.ExtKeyUsageServerAuth, net.ParseIP("127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(srv.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: ca.Pool, DNSName: "127.0.0.1", KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("the server certificate does not verify for 127.0.0.1: %v", err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: ca.Pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Error("the server certificate verifies as a client's")
	}
	node, err := ca.Issue(nil, "system:node:a", []string{"system:nodes"}, x509.ExtKeyUsageClientAuth)
	if err != nil {
		t.Fatal(err)
	}
	nodeLeaf, err := x509.ParseCertificate(node.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if nodeLeaf.Subject.CommonName != "system:node:a" || !slices.Equal(nodeLeaf.Subject.Organization, []string{"system:nodes"}) || nodeLeaf.SerialNumber.Cmp(leaf.SerialNumber) == 0 {
		t.Errorf("node certificate: subject %v, serial %v (the server's %v)", nodeLeaf.Subject, nodeLeaf.SerialNumber, leaf.SerialNumber)
	}

	dir := t.TempDir()
	caFile, certFile, keyFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "n.pem"), filepath.Join(dir, "n-key.pem")
	if err := ca.WriteCA(caFile); err != nil {
		t.Fatal(err)
	}
	if err := WriteKeyPair(node, certFile, keyFile); err != nil {
		t.Fatal(err)
	}
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatalf("the written key pair: %v", err)
	}
	if !slices.Equal(pair.Certificate[0], node.Certificate[0]) {
		t.Error("the written certificate is not the issued one")
	}
	pool, err := certs.LoadPool(caFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nodeLeaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("the node certificate does not verify against the written CA: %v", err)
	}
}
