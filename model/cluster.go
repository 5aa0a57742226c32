package model

import (
	"net/netip"
	"slices"
)

// Cluster holds the facts about the cluster that belong to no service:
// what a proxier may need beside its services. A source hands them to
// the sinks that implement localsink.ClusterSink, in the round where they
// change; they are never part of a ServiceEndpoints (whose JSON is the
// public contract).
type Cluster struct {
	// ServiceCIDRs are the ranges cluster IPs are allocated from: the
	// spec.cidrs of the cluster's ServiceCIDR objects
	// (networking.k8s.io/v1), in the form ParseCIDRs gives (masked,
	// sorted, each once). A source gives them only to the cluster's
	// default proxier, the one handling the services without a
	// service-proxy-name (kube-proxy's role): the addresses in them that
	// no service holds are that proxier's to drop, as kube-proxy does,
	// rather than route out. A specialized proxier, beside kube-proxy or
	// another default proxier, never gets them and must never drop them.
	ServiceCIDRs []netip.Prefix `json:",omitempty"`
}

// IsZero reports whether c holds no fact (nil, or empty).
func (c *Cluster) IsZero() bool { return c == nil || len(c.ServiceCIDRs) == 0 }

// Equal reports whether c and o hold the same facts (nil and an empty
// Cluster are equal).
func (c *Cluster) Equal(o *Cluster) bool {
	if c.IsZero() || o.IsZero() {
		return c.IsZero() == o.IsZero()
	}
	return slices.Equal(c.ServiceCIDRs, o.ServiceCIDRs)
}
