package server

import (
	"context"
	"crypto/x509"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"sigs.k8s.io/kpng/model"
)

// Node identities in client certificates, as kubelet's: the subject's
// common name is NodeUserPrefix followed by the node's name, and its
// organizations include NodesGroup.
const (
	NodeUserPrefix = "system:node:"
	NodesGroup     = "system:nodes"
)

// MaxNodeName is the longest node name a backend may watch as: the
// longest name Kubernetes accepts for a node (a DNS-1123 subdomain).
const MaxNodeName = 253

// AnyCertificate in Options.AnyNodeCommonNames lets every client
// certificate without a node identity watch any node's view.
const AnyCertificate = "*"

// NodeOfCertificate returns the node a client certificate names: with a
// subject common name "system:node:NAME" and the organization
// "system:nodes", NAME. ok is false for a certificate without a node
// identity.
func NodeOfCertificate(cert *x509.Certificate) (node string, ok bool) {
	name, found := strings.CutPrefix(cert.Subject.CommonName, NodeUserPrefix)
	if !found || name == "" || !slices.Contains(cert.Subject.Organization, NodesGroup) {
		return "", false
	}
	return name, true
}

// authorize returns the node whose view the backend behind ctx may watch
// when it asks for requested's. Without a verified client certificate
// (a unix socket, plain TCP on loopback, TLS without client
// certificates) the request names the node. With one that names a node,
// that node: a request for another node's view is refused
// (PermissionDenied), an empty request gets the certificate's node. A
// certificate without a node identity may watch the view it asks for
// only when its common name is one of anyNode (or anyNode holds
// AnyCertificate); it is refused otherwise. A name longer than
// MaxNodeName is refused (InvalidArgument).
func authorize(ctx context.Context, requested string, anyNode []string) (string, error) {
	if len(requested) > MaxNodeName {
		return "", status.Errorf(codes.InvalidArgument, "node name %s is longer than %d bytes", model.Quote(requested), MaxNodeName)
	}
	cert := verifiedClientCert(ctx)
	if cert == nil {
		return requested, nil
	}
	if node, ok := NodeOfCertificate(cert); ok {
		if len(node) > MaxNodeName {
			return "", status.Errorf(codes.InvalidArgument, "client certificate's node name %s is longer than %d bytes", model.Quote(node), MaxNodeName)
		}
		if requested != "" && requested != node {
			return "", status.Errorf(codes.PermissionDenied, "client certificate of node %s may not watch node %s's view", model.Quote(node), model.Quote(requested))
		}
		return node, nil
	}
	if anyViewAllowed(cert, anyNode) {
		return requested, nil
	}
	return "", noNodeIdentity(cert, fmt.Sprintf("; it may not watch node %s's view", model.Quote(requested)))
}

// anyViewAllowed reports whether a certificate without a node identity
// may watch any node's view: its common name is one of anyNode, or
// anyNode holds AnyCertificate.
func anyViewAllowed(cert *x509.Certificate, anyNode []string) bool {
	cn := cert.Subject.CommonName
	return slices.Contains(anyNode, cn) || slices.Contains(anyNode, AnyCertificate)
}

// noNodeIdentity is the refusal (PermissionDenied) of a certificate
// without a node identity that may not watch any node's view; what ends
// the message with what it may not do.
func noNodeIdentity(cert *x509.Certificate, what string) error {
	return status.Errorf(codes.PermissionDenied,
		"client certificate %s has no node identity (CN=%sNAME, O=%s) and is not allowed to watch any node's view (the controller's --tls-any-node-cn)%s",
		model.Quote(cert.Subject.CommonName), NodeUserPrefix, NodesGroup, what)
}

// authorizePeers checks that the client behind ctx may learn the
// controller's replicas (the Peers call): any client that may watch a view,
// that is, without a verified client certificate (the listener decided),
// or with a node's, or one whose common name may watch any node's view.
func authorizePeers(ctx context.Context, anyNode []string) error {
	cert := verifiedClientCert(ctx)
	if cert == nil {
		return nil
	}
	if _, ok := NodeOfCertificate(cert); ok || anyViewAllowed(cert, anyNode) {
		return nil
	}
	return noNodeIdentity(cert, ": it may not learn the controller's replicas")
}

// verifiedClientCert returns the client certificate of the connection
// behind ctx when the server verified it against its client CA, else nil.
func verifiedClientCert(ctx context.Context) *x509.Certificate {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.PeerCertificates) == 0 {
		return nil
	}
	return info.State.PeerCertificates[0]
}
