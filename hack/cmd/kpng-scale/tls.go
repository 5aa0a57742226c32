//go:build linux

package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"path/filepath"

	"sigs.k8s.io/kpng/api/server"
	"sigs.k8s.io/kpng/internal/testpki"
)

// With --tls the controller serves the backends as deploy/ runs it: TCP
// with TLS and client certificates, each raw backend presenting its own
// node's (CN=system:node:NAME, O=system:nodes) and doing a whole handshake
// of its own, as a node's backend does. The backends that read through
// grpc-go (the probe, those reading every field) share one certificate
// without a node identity, which the controller lets watch any node's
// view (--tls-any-node-cn).

// readerCN is the common name of the grpc-go backends' certificate.
const readerCN = "kpng-scale-reader"

// pki is a run's certificates: a CA, the controller's for 127.0.0.1 and
// the grpc-go backends', in PEM files in a directory; the raw backends'
// are made in memory (nodeTLS).
type pki struct {
	ca *testpki.CA
	// nodeKey is every node certificate's key: the handshake costs the
	// same whichever key a certificate holds.
	nodeKey *ecdsa.PrivateKey

	caFile, serverCert, serverKey, readerCert, readerKey string
}

// newPKI makes the CA, the controller's and the readers' certificates
// and writes them into dir.
func newPKI(dir string) (*pki, error) {
	ca, err := testpki.NewCA("kpng-scale CA")
	if err != nil {
		return nil, err
	}
	nodeKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("the nodes' key: %w", err)
	}
	p := &pki{ca: ca, nodeKey: nodeKey,
		caFile: filepath.Join(dir, "ca.pem"), serverCert: filepath.Join(dir, "server.pem"), serverKey: filepath.Join(dir, "server-key.pem"),
		readerCert: filepath.Join(dir, "reader.pem"), readerKey: filepath.Join(dir, "reader-key.pem")}
	if err := ca.WriteCA(p.caFile); err != nil {
		return nil, err
	}
	srv, err := ca.Issue(nil, "kpng", nil, x509.ExtKeyUsageServerAuth, net.IPv4(127, 0, 0, 1))
	if err != nil {
		return nil, err
	}
	if err := testpki.WriteKeyPair(srv, p.serverCert, p.serverKey); err != nil {
		return nil, err
	}
	reader, err := ca.Issue(nil, readerCN, nil, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return nil, err
	}
	if err := testpki.WriteKeyPair(reader, p.readerCert, p.readerKey); err != nil {
		return nil, err
	}
	return p, nil
}

// nodeTLS returns the client TLS configuration of node name's raw
// backend: its node certificate, the controller's CA, HTTP/2.
func (p *pki) nodeTLS(name string) (*tls.Config, error) {
	cert, err := p.ca.Issue(p.nodeKey, server.NodeUserPrefix+name, []string{server.NodesGroup}, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12, RootCAs: p.ca.Pool, ServerName: "127.0.0.1", NextProtos: []string{"h2"},
		Certificates: []tls.Certificate{cert},
	}, nil
}

// controllerFlags are to-api's TLS flags for these certificates.
func (p *pki) controllerFlags() []string {
	return []string{"--tls-cert=" + p.serverCert, "--tls-key=" + p.serverKey, "--tls-client-ca=" + p.caFile, "--tls-any-node-cn=" + readerCN}
}
