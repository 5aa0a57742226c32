//go:build linux

package iptables

import (
	"context"
	"testing"

	"sigs.k8s.io/kpng/backends/conformance"
	"sigs.k8s.io/kpng/localsink"
)

// TestConformance runs the whole conformance kit against the iptables
// backend, once per variant: it declares no feature unsupported.
func TestConformance(t *testing.T) {
	for _, variant := range []string{VariantLegacy, VariantNFT} {
		t.Run(variant, func(t *testing.T) {
			var stop context.CancelFunc
			conformance.Run(t, conformance.Backend{Name: "iptables-" + variant, Start: startConformance(variant, &stop)})
		})
	}
}

// startConformance builds the sink of variant in the kit's node
// namespace, as `kpng … to-local to-iptables --netns` does; its chains are
// removed when the scenario ends (the namespace goes with it anyway). The
// sink started before (*stop) stops first, as the process a restart
// replaces would have (its monitor would otherwise rewrite what the new
// sink writes).
func startConformance(variant string, stop *context.CancelFunc) func(t testing.TB, node conformance.Node) (localsink.Sink, error) {
	return func(t testing.TB, node conformance.Node) (localsink.Sink, error) {
		if *stop != nil {
			(*stop)()
		}
		ctx, cancel := context.WithCancel(context.Background())
		*stop = cancel
		cfg := Config{
			ServiceProxyName: "conformance",
			NetNS:            node.NetNS,
			Variant:          variant,
			Options:          Options{NodeIPs: node.IPs, ClusterCIDRs: node.PodCIDRs},
		}
		t.Cleanup(func() {
			cancel() // the monitor would write the chains again
			if err := Cleanup(context.Background(), cfg); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		})
		s, err := New(ctx, cfg)
		if err != nil {
			return nil, err
		}
		return s, nil
	}
}
