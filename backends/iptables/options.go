package iptables

import (
	"fmt"
	"net/netip"

	"sigs.k8s.io/kpng/backends/nodeflags"
)

// DefaultMasqueradeBit is the packet mark bit asking for masquerading
// when Options does not set one: kube-proxy's (0x4000), so that both mean
// the same on a node running both; the same for every backend.
const DefaultMasqueradeBit = nodeflags.DefaultMasqueradeBit

// Options are the node-wide settings that shape the rules (those of
// kube-proxy's iptables mode).
type Options struct {
	// ClusterCIDRs are the pod networks. Traffic to a cluster IP from a
	// source outside them is masqueraded (kube-proxy's --cluster-cidr),
	// and pods reaching an external address of a service with
	// externalTrafficPolicy: Local are sent to all its endpoints.
	ClusterCIDRs []netip.Prefix
	// MasqueradeAll masquerades all traffic to cluster IPs.
	MasqueradeAll bool
	// MasqueradeBit is the mark bit (1-31) that asks for masquerading; 0
	// means DefaultMasqueradeBit (so bit 0 cannot be chosen).
	MasqueradeBit int
	// NodePortAddresses restricts node ports to the local addresses in
	// these prefixes; empty means every local address but 127.0.0.0/8
	// and ::1 (kube-proxy's route_localnet is not set).
	NodePortAddresses []netip.Prefix
	// NodeIPs are the node's addresses: when a loadBalancerSourceRanges
	// prefix contains one, the service's load-balancer IPs are allowed as
	// sources too (a load-balancer IP routed locally makes the node's own
	// requests to it come from it), as kube-proxy does.
	NodeIPs []netip.Addr
}

// mark returns the masquerade mark, as iptables writes it ("0x4000").
func (o Options) mark() string {
	bit := o.MasqueradeBit
	if bit == 0 {
		bit = DefaultMasqueradeBit
	}
	return fmt.Sprintf("%#x", uint32(1)<<uint(bit))
}

// Validate reports options that cannot be programmed.
func (o Options) Validate() error {
	return nodeflags.CheckOptions(o.ClusterCIDRs, o.NodePortAddresses, o.NodeIPs, o.MasqueradeBit)
}
