//go:build linux

package nft

import (
	"context"
	"os"
	"testing"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"sigs.k8s.io/kpng/backends/conformance"
	"sigs.k8s.io/kpng/localsink"
)

// TestConformance runs the whole conformance kit against the nft backend:
// it declares no feature unsupported.
func TestConformance(t *testing.T) {
	var stop context.CancelFunc
	conformance.Run(t, conformance.Backend{Name: "nft", Start: func(t testing.TB, node conformance.Node) (localsink.Sink, error) {
		return startConformance(t, node, &stop)
	}})
}

// startConformance builds the nft sink in the kit's node namespace, as
// `kpng … to-local to-nft --netns` does; the table is removed when the
// scenario ends. The sink started before (*stop) stops first, as the
// process a restart replaces would have (its monitor would otherwise
// rewrite what the new sink writes).
func startConformance(t testing.TB, node conformance.Node, stop *context.CancelFunc) (localsink.Sink, error) {
	if *stop != nil {
		(*stop)()
	}
	f, err := os.Open(node.NetNS)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { f.Close() })
	fd := int(f.Fd())
	ctx, cancel := context.WithCancel(context.Background())
	*stop = cancel
	t.Cleanup(cancel)
	cfg := Config{
		ServiceProxyName: "conformance",
		Conn:             ConnInNetNS(fd),
		Conntrack: func() (*netlink.Handle, error) {
			return netlink.NewHandleAt(vnetns.NsHandle(fd), unix.NETLINK_NETFILTER)
		},
		Options: Options{NodeIPs: node.IPs, ClusterCIDRs: node.PodCIDRs},
	}
	t.Cleanup(func() {
		cancel() // the monitor would write the table again
		_ = Cleanup(context.Background(), Config{ServiceProxyName: cfg.ServiceProxyName, Conn: ConnInNetNS(fd)})
	})
	s, err := New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return s, nil
}
