package model

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"
)

// ServiceEndpoints is one selected service with all of its endpoints. It is
// the unit of the full-state callback.
type ServiceEndpoints struct {
	Service   *Service
	Endpoints []*Endpoint
}

// ServiceKey names a service.
type ServiceKey struct {
	Namespace string
	Name      string
}

// String returns "namespace/name".
func (k ServiceKey) String() string { return k.Namespace + "/" + k.Name }

// Compare orders keys by namespace, then name.
func (k ServiceKey) Compare(o ServiceKey) int {
	if c := cmp.Compare(k.Namespace, o.Namespace); c != 0 {
		return c
	}
	return cmp.Compare(k.Name, o.Name)
}

// Service is a Kubernetes Service as a proxier needs it.
type Service struct {
	Namespace string
	Name      string
	// Type is the Service type: ClusterIP, NodePort or LoadBalancer.
	Type string
	// Labels are the Service's labels.
	Labels map[string]string `json:",omitempty"`
	IPs    ServiceIPs
	Ports  []*PortMapping
	// ClientIPAffinity is set when the service has sessionAffinity ClientIP.
	ClientIPAffinity *ClientIPAffinity `json:",omitempty"`
	// ExternalTrafficToLocal is true for externalTrafficPolicy: Local.
	ExternalTrafficToLocal bool `json:",omitempty"`
	// InternalTrafficToLocal is true for internalTrafficPolicy: Local.
	InternalTrafficToLocal bool `json:",omitempty"`
	// HealthCheckNodePort is the node port serving the service's health
	// check (LoadBalancer services with externalTrafficPolicy: Local).
	HealthCheckNodePort int32 `json:",omitempty"`
	// LoadBalancerSourceRanges are the CIDRs allowed to reach the
	// load-balancer IPs, in the form ParseCIDRs gives (masked, IPv4-mapped
	// prefixes as IPv4, sorted, each once); empty means no restriction.
	// Their JSON form is a list of strings ("198.51.100.0/24").
	LoadBalancerSourceRanges []netip.Prefix `json:",omitempty"`
	// TrafficDistribution is spec.trafficDistribution (e.g. PreferClose).
	TrafficDistribution string `json:",omitempty"`
}

// Key returns the service's key.
func (s *Service) Key() ServiceKey { return ServiceKey{Namespace: s.Namespace, Name: s.Name} }

// ServiceIPs are the addresses a service is reached on.
type ServiceIPs struct {
	// ClusterIPs are the service's cluster IPs; empty for headless services.
	ClusterIPs IPSet
	// ExternalIPs are spec.externalIPs.
	ExternalIPs IPSet
	// LoadBalancerIPs are the IPs of status.loadBalancer.ingress.
	LoadBalancerIPs IPSet `json:",omitzero"`
	// Headless is true when spec.clusterIP is None.
	Headless bool `json:",omitempty"`
}

// IPSet is a set of addresses split by family. Both lists are sorted and
// hold each address once, in canonical text form.
type IPSet struct {
	V4 []string `json:",omitempty"`
	V6 []string `json:",omitempty"`
}

// NewIPSet builds a set from addresses in any order and any text form.
// Strings that are not IP addresses are skipped and returned in bad.
func NewIPSet(addrs ...string) (set IPSet, bad []string) {
	var parsed []netip.Addr
	for _, a := range addrs {
		ip, err := netip.ParseAddr(a)
		if err != nil || ip.Zone() != "" {
			bad = append(bad, a) // a zone names a link: no service address has one
			continue
		}
		parsed = append(parsed, ip.Unmap())
	}
	slices.SortFunc(parsed, netip.Addr.Compare)
	parsed = slices.Compact(parsed)
	for _, ip := range parsed {
		if ip.Is4() {
			set.V4 = append(set.V4, ip.String())
		} else {
			set.V6 = append(set.V6, ip.String())
		}
	}
	return set, bad
}

// ParseCIDRs parses CIDRs in any order and text form, as kube-proxy reads
// loadBalancerSourceRanges: spaces around a CIDR are ignored and the
// address bits past the prefix length are cleared ("10.0.0.1/8" is
// 10.0.0.0/8). An IPv4-mapped IPv6 prefix of 96 bits or more is the IPv4
// prefix it maps ("::ffff:192.0.2.0/120" is 192.0.2.0/24), as NewIPSet
// unmaps addresses. The result is sorted (by address, then length) and
// holds each prefix once; it is nil when empty. Strings that are not
// CIDRs, and IPv4-mapped prefixes shorter than /96 (which name no IPv4
// network), are skipped and returned in bad.
func ParseCIDRs(texts ...string) (cidrs []netip.Prefix, bad []string) {
	parsed := make([]netip.Prefix, 0, len(texts))
	for _, t := range texts {
		p, err := netip.ParsePrefix(strings.TrimSpace(t))
		if err != nil {
			bad = append(bad, t)
			continue
		}
		parsed = append(parsed, p)
	}
	cidrs, badPrefixes := CanonicalCIDRs(parsed)
	for _, p := range badPrefixes {
		bad = append(bad, p.String())
	}
	return cidrs, bad
}

// CanonicalCIDRs returns prefixes in the form ParseCIDRs gives them:
// masked, IPv4-mapped ones as IPv4, sorted, each once (nil when empty).
// Invalid prefixes (the zero Prefix) and IPv4-mapped prefixes shorter than
// /96 are skipped and returned in bad.
func CanonicalCIDRs(prefixes []netip.Prefix) (cidrs []netip.Prefix, bad []netip.Prefix) {
	for _, p := range prefixes {
		if !p.IsValid() {
			bad = append(bad, p)
			continue
		}
		if a := p.Addr(); a.Is4In6() {
			if p.Bits() < 96 {
				bad = append(bad, p)
				continue
			}
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
		cidrs = append(cidrs, p.Masked())
	}
	slices.SortFunc(cidrs, netip.Prefix.Compare)
	return slices.Compact(cidrs), bad
}

// All returns the IPv4 addresses followed by the IPv6 ones.
func (s IPSet) All() []string {
	return append(slices.Clip(s.V4), s.V6...)
}

// IsEmpty reports whether the set holds no address.
func (s IPSet) IsEmpty() bool { return len(s.V4) == 0 && len(s.V6) == 0 }

// Protocol is an L4 protocol. Its JSON form is a number, as in kpng's
// original API: 1 TCP, 2 UDP, 3 SCTP.
type Protocol int32

// The protocols a service port may use.
const (
	ProtocolUnknown Protocol = 0
	TCP             Protocol = 1
	UDP             Protocol = 2
	SCTP            Protocol = 3
)

// String returns the protocol's Kubernetes name.
func (p Protocol) String() string {
	switch p {
	case TCP:
		return "TCP"
	case UDP:
		return "UDP"
	case SCTP:
		return "SCTP"
	}
	return "Unknown"
}

// PortMapping is one service port.
type PortMapping struct {
	Name     string `json:",omitempty"`
	Protocol Protocol
	Port     int32
	NodePort int32 `json:",omitempty"`
	// TargetPort is the numeric target port; 0 when the target port is
	// named (see TargetPortName and Endpoint.PortOverrides).
	TargetPort     int32
	TargetPortName string `json:",omitempty"`
}

// ClientIPAffinity is sessionAffinity: ClientIP.
type ClientIPAffinity struct {
	// TimeoutSeconds is how long a client sticks to its endpoint; the
	// watcher fills in DefaultAffinityTimeoutSeconds when the Service
	// gives none.
	TimeoutSeconds int32
}

// DefaultAffinityTimeoutSeconds is Kubernetes' default
// sessionAffinityConfig.clientIP.timeoutSeconds (3 hours), for a ClientIP
// affinity without a timeout.
const DefaultAffinityTimeoutSeconds = 10800

// Endpoint is one backend address of a service.
type Endpoint struct {
	// IPs holds the endpoint's address (one address of one family: a
	// dual-stack pod appears as two endpoints).
	IPs IPSet
	// Local is true when the endpoint runs on this node.
	Local bool `json:",omitempty"`
	// Ready, Serving and Terminating are the EndpointSlice conditions with
	// their defaults applied (nil ready or serving means true).
	Ready       bool `json:",omitempty"`
	Serving     bool `json:",omitempty"`
	Terminating bool `json:",omitempty"`
	// NodeName is the node the endpoint runs on, if known.
	NodeName string `json:",omitempty"`
	// Zone is the endpoint's zone, if known.
	Zone string `json:",omitempty"`
	// Hints are the EndpointSlice topology hints, if any.
	Hints *Hints `json:",omitempty"`
	// PortOverrides maps a service port name to the port this endpoint
	// serves it on, for each port where that differs from the PortMapping's
	// TargetPort (named target ports). A value of 0 means the endpoint does
	// not serve that port. Use PortFor rather than reading it directly.
	PortOverrides map[string]int32 `json:",omitempty"`
}

// Hints are an endpoint's topology hints, with whether they name this node.
type Hints struct {
	// Zones are the zones this endpoint should serve (hints.forZones).
	Zones []string `json:",omitempty"`
	// Nodes are the nodes this endpoint should serve (hints.forNodes).
	Nodes []string `json:",omitempty"`
	// SameZone is true when Zones holds this node's zone.
	SameZone bool `json:",omitempty"`
	// SameNode is true when Nodes holds this node's name.
	SameNode bool `json:",omitempty"`
}

// PortFor returns the port this endpoint serves the service port p on, and
// false when it does not serve p.
func (e *Endpoint) PortFor(p *PortMapping) (int32, bool) {
	port := p.TargetPort
	if o, ok := e.PortOverrides[p.Name]; ok {
		port = o
	}
	return port, port != 0
}

// Key returns the endpoint's identity within its service: its first address.
func (e *Endpoint) Key() string {
	if len(e.IPs.V4) > 0 {
		return e.IPs.V4[0]
	}
	if len(e.IPs.V6) > 0 {
		return e.IPs.V6[0]
	}
	return ""
}

// CompareEndpoints orders endpoints by address, IPv4 before IPv6.
func CompareEndpoints(a, b *Endpoint) int {
	return compareAddrText(a.Key(), b.Key())
}

func compareAddrText(a, b string) int {
	pa, errA := netip.ParseAddr(a)
	pb, errB := netip.ParseAddr(b)
	if errA != nil || errB != nil {
		return cmp.Compare(a, b)
	}
	return pa.Compare(pb)
}
