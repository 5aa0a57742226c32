// Package testpki makes the TLS certificates of kpng's tests and load
// tools: a CA of their own and the certificates it signs (ECDSA P-256),
// in memory and as PEM files.
package testpki

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
	"sync"
	"time"
)

// CA is a certificate authority; its methods may be called at once.
type CA struct {
	// Cert is the CA's certificate, Pool a pool holding it alone.
	Cert *x509.Certificate
	Pool *x509.CertPool
	key  *ecdsa.PrivateKey

	mu     sync.Mutex
	serial int64
}

// validity is how long a certificate is valid: from an hour before it is
// made (clocks apart) for a day.
func validity() (notBefore, notAfter time.Time) {
	now := time.Now()
	return now.Add(-time.Hour), now.Add(24 * time.Hour)
}

// NewCA makes a CA named cn.
func NewCA(cn string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("the CA's key: %w", err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	tmpl.NotBefore, tmpl.NotAfter = validity()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("the CA's certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("the CA's certificate: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &CA{Cert: cert, Pool: pool, key: key, serial: 1}, nil
}

// Issue returns a certificate signed by ca for key (a new key when nil),
// whose subject is cn and orgs, for usage, naming ips (a server's).
func (ca *CA) Issue(key *ecdsa.PrivateKey, cn string, orgs []string, usage x509.ExtKeyUsage, ips ...net.IP) (tls.Certificate, error) {
	if key == nil {
		var err error
		if key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			return tls.Certificate{}, fmt.Errorf("key of %s: %w", cn, err)
		}
	}
	ca.mu.Lock()
	ca.serial++
	serial := ca.serial
	ca.mu.Unlock()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn, Organization: orgs},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips}
	tmpl.NotBefore, tmpl.NotAfter = validity()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("certificate %s: %w", cn, err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// WriteCA writes the CA's certificate to path.
func (ca *CA) WriteCA(path string) error { return writePEM(path, "CERTIFICATE", ca.Cert.Raw) }

// WriteKeyPair writes an issued certificate and its key to two files.
func WriteKeyPair(c tls.Certificate, certPath, keyPath string) error {
	key, ok := c.PrivateKey.(*ecdsa.PrivateKey)
	if !ok || len(c.Certificate) == 0 {
		return fmt.Errorf("write %s: not a certificate of this package", certPath)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("write %s: %w", keyPath, err)
	}
	if err := writePEM(certPath, "CERTIFICATE", c.Certificate[0]); err != nil {
		return err
	}
	return writePEM(keyPath, "EC PRIVATE KEY", keyDER)
}

// writePEM writes one PEM block to path, readable by its owner only.
func writePEM(path, typ string, der []byte) error {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
