//go:build linux

package iptables

import (
	"testing"

	"sigs.k8s.io/kpng/backends/conformance"
	"sigs.k8s.io/kpng/localsink"
)

// unsupported are the kit's rules the iptables backend does not follow
// yet, with what it lacks.
var unsupported = map[conformance.Feature]string{
	// TODO(issue 13): build the rules of a service's external and
	// load-balancer IPs from model.Service.ServedExternalIPs, as nft and
	// userspace do, instead of Service.IPs: an address of a family without
	// a cluster IP (but for headless services) must not be claimed.
	conformance.OtherFamilyAddresses: "claims (and rejects) external and load-balancer IPs of a family in which the service has no cluster IP",
	// TODO(issue 13): reject new connections (filter FORWARD and
	// OUTPUT, after the no-endpoint rejects, -m conntrack --ctstate NEW)
	// to every cluster IP of the services held, on the ports no service
	// defines (what was not DNATed), as nft's cluster-ips-check chain
	// does (TCP reset, ICMP port unreachable otherwise): they are routed
	// out today.
	conformance.UndefinedPorts: "routes out the traffic to a cluster IP on a port no service defines",
	// TODO(issue 13): implement localsink.ClusterSink and drop new
	// connections (filter FORWARD and OUTPUT, after the cluster-IP
	// rejects, -m conntrack --ctstate NEW) to the service CIDRs it is
	// given (model.Cluster.ServiceCIDRs: only the default proxier gets
	// them; none, nothing dropped), as nft's cluster-ips-check chain does;
	// a partial sync must follow a change of them.
	conformance.ServiceCIDRs: "routes out the traffic to the addresses of the service CIDRs that no service holds",
}

// TestConformance runs the conformance kit against the iptables backend,
// once per variant, but for the rules it declares unsupported.
func TestConformance(t *testing.T) {
	for _, variant := range []string{VariantLegacy, VariantNFT} {
		t.Run(variant, func(t *testing.T) {
			conformance.Run(t, conformance.Backend{Name: "iptables-" + variant, Start: startConformance(variant), Unsupported: unsupported})
		})
	}
}

// startConformance builds the sink of variant in the kit's node
// namespace, as `kpng … to-local to-iptables --netns` does; its chains are
// removed when the scenario ends (the namespace goes with it anyway).
func startConformance(variant string) func(t testing.TB, node conformance.Node) (localsink.Sink, error) {
	return func(t testing.TB, node conformance.Node) (localsink.Sink, error) {
		cfg := Config{
			ServiceProxyName: "conformance",
			NetNS:            node.NetNS,
			Variant:          variant,
			Options:          Options{NodeIPs: node.IPs, ClusterCIDRs: node.PodCIDRs},
		}
		t.Cleanup(func() {
			if err := Cleanup(cfg); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		})
		return NewSink(cfg)
	}
}
