//go:build linux

package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"sigs.k8s.io/kpng/api/server"
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
	caKey  *ecdsa.PrivateKey
	ca     *x509.Certificate
	pool   *x509.CertPool
	serial int64
	// nodeKey is every node certificate's key: the handshake costs the
	// same whichever key a certificate holds.
	nodeKey *ecdsa.PrivateKey

	caFile, serverCert, serverKey, readerCert, readerKey string
}

// newPKI makes the CA, the controller's and the readers' certificates
// and writes them into dir.
func newPKI(dir string) (*pki, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("the CA's key: %w", err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kpng-scale CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("the CA's certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("the CA's certificate: %w", err)
	}
	nodeKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("the nodes' key: %w", err)
	}
	p := &pki{caKey: caKey, ca: ca, pool: x509.NewCertPool(), serial: 1, nodeKey: nodeKey,
		caFile: filepath.Join(dir, "ca.pem"), serverCert: filepath.Join(dir, "server.pem"), serverKey: filepath.Join(dir, "server-key.pem"),
		readerCert: filepath.Join(dir, "reader.pem"), readerKey: filepath.Join(dir, "reader-key.pem")}
	p.pool.AddCert(ca)
	if err := writePEM(p.caFile, "CERTIFICATE", der); err != nil {
		return nil, err
	}
	server := &x509.Certificate{Subject: pkix.Name{CommonName: "kpng"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	if err := p.writeCert(server, p.serverCert, p.serverKey); err != nil {
		return nil, err
	}
	reader := &x509.Certificate{Subject: pkix.Name{CommonName: readerCN}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if err := p.writeCert(reader, p.readerCert, p.readerKey); err != nil {
		return nil, err
	}
	return p, nil
}

// sign returns tmpl signed by the CA for key, valid for the day.
func (p *pki) sign(tmpl *x509.Certificate, key *ecdsa.PrivateKey) ([]byte, error) {
	p.serial++
	tmpl.SerialNumber = big.NewInt(p.serial)
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		return nil, fmt.Errorf("certificate %s: %w", tmpl.Subject.CommonName, err)
	}
	return der, nil
}

// writeCert signs tmpl with a key of its own and writes both.
func (p *pki) writeCert(tmpl *x509.Certificate, certFile, keyFile string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("key of %s: %w", tmpl.Subject.CommonName, err)
	}
	der, err := p.sign(tmpl, key)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("key of %s: %w", tmpl.Subject.CommonName, err)
	}
	if err := writePEM(certFile, "CERTIFICATE", der); err != nil {
		return err
	}
	return writePEM(keyFile, "EC PRIVATE KEY", keyDER)
}

// nodeTLS returns the client TLS configuration of node name's raw
// backend: its node certificate, the controller's CA, HTTP/2.
func (p *pki) nodeTLS(name string) (*tls.Config, error) {
	tmpl := &x509.Certificate{Subject: pkix.Name{CommonName: server.NodeUserPrefix + name, Organization: []string{server.NodesGroup}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := p.sign(tmpl, p.nodeKey)
	if err != nil {
		return nil, err
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12, RootCAs: p.pool, ServerName: "127.0.0.1", NextProtos: []string{"h2"},
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: p.nodeKey}},
	}, nil
}

// controllerFlags are to-api's TLS flags for these certificates.
func (p *pki) controllerFlags() []string {
	return []string{"--tls-cert=" + p.serverCert, "--tls-key=" + p.serverKey, "--tls-client-ca=" + p.caFile, "--tls-any-node-cn=" + readerCN}
}

// writePEM writes one PEM block to path, readable by its owner only.
func writePEM(path, typ string, der []byte) error {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
