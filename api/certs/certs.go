// Package certs loads the TLS material of the kpng API's TCP transport.
package certs

import (
	"crypto/x509"
	"fmt"
	"os"
)

// LoadPool reads a PEM file of CA certificates.
func LoadPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("CA file %s: no PEM certificate", path)
	}
	return pool, nil
}
