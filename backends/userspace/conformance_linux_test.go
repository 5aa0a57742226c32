//go:build linux

package userspace

import (
	"context"
	"testing"

	"sigs.k8s.io/kpng/backends/conformance"
	"sigs.k8s.io/kpng/localsink"
)

// unsupported are the kit's features a userspace proxy cannot have, with
// the reason (docs/backends/userspace.md lists them too).
var unsupported = map[conformance.Feature]string{
	conformance.ClientAddress:   "the proxy opens its own connection to the endpoint, which sees the node's address",
	conformance.KeepConnections: "connections pass through the proxy's process and end with it",
}

// TestConformance runs the conformance kit against the userspace proxier,
// in the kit's node namespace, as `kpng … to-local to-userspace --netns`
// does.
func TestConformance(t *testing.T) {
	conformance.Run(t, conformance.Backend{Name: "userspace", Start: startConformance, Unsupported: unsupported})
}

// startConformance builds the proxier for the kit's node; it is closed and
// its interface removed when the scenario ends.
func startConformance(t testing.TB, node conformance.Node) (localsink.Sink, error) {
	cfg := Config{
		ServiceProxyName: "conformance",
		NetNS:            node.NetNS,
		Options:          Options{NodeIPs: node.IPs, ClusterCIDRs: node.PodCIDRs},
	}
	p, err := New(context.Background(), cfg)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() {
		p.Close()
		if err := Cleanup(context.Background(), cfg); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return p, nil
}
