//go:build linux

package nft

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/model"
)

// conntrackIn returns a conntrack handle factory for the namespace ns.
func conntrackIn(t *testing.T, ns *netns.NS) func() (*netlink.Handle, error) {
	t.Helper()
	fd := nsFD(t, ns)
	return func() (*netlink.Handle, error) {
		return netlink.NewHandleAt(vnetns.NsHandle(fd), unix.NETLINK_NETFILTER)
	}
}

// noConntrack is a Config.Conntrack that always fails: the sink then
// leaves the conntrack entries alone (and logs the error).
func noConntrack() (*netlink.Handle, error) {
	return nil, errors.New("conntrack cleanup disabled by the test")
}

// udpWeb is a dual-stack ClusterIP service: UDP 80 to 6000.
func udpWeb() *model.Service {
	return svc("default", "udp-web", ipset(webV4.String(), webV6.String()), udp(80, 6000))
}

// askFrom sends one UDP request from the client's source port port to
// the service port of addr and returns the answering server, or "" when
// none answered (refused or timed out).
func askFrom(t *testing.T, b *netns.BlogTopology, addr netip.Addr, port uint16) string {
	t.Helper()
	a, err := b.Client.Ask("udp", netip.AddrPortFrom(addr, 80), netns.AskOptions{LocalPort: port, Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Logf("udp %s from port %d: %v", addr, port, err)
		return ""
	}
	return a.Server
}

// TestKernelConntrackEndpointReplaced sends UDP from one fixed source
// port (one conntrack entry) to a service, replaces its endpoint, and
// checks that the same source port reaches the new endpoint: the sink
// deleted the entry DNATed to the old one. With the cleanup disabled, the
// same flow keeps reaching the old endpoint: the test's control.
func TestKernelConntrackEndpointReplaced(t *testing.T) {
	for _, cleanup := range []bool{true, false} {
		name := map[bool]string{true: "cleanup", false: "no-cleanup"}[cleanup]
		t.Run(name, func(t *testing.T) {
			b := kernelTopology(t)
			s := newTestSink(t, b, "ct1")
			if !cleanup {
				s.nft.cfg.Conntrack = noConntrack
			}
			web := udpWeb()
			s.setAll(&model.ServiceEndpoints{Service: web, Endpoints: podEndpoints(netns.PodID)})
			s.sync()
			const port = 40001
			for _, addr := range []netip.Addr{webV4, webV6} {
				if got := askFrom(t, b, addr, port); got != netns.PodID {
					t.Fatalf("%s before the change: answered by %q, want %s", addr, got, netns.PodID)
				}
			}

			for _, e := range podEndpoints(netns.PodID) {
				s.deleteEndpoint(web.Key(), e.Key())
			}
			for _, e := range podEndpoints(netns.Pod2ID) {
				s.setEndpoint(web.Key(), e)
			}
			s.sync()
			want := netns.Pod2ID
			if !cleanup {
				want = netns.PodID // the stale entry still DNATs to pod
			}
			for _, addr := range []netip.Addr{webV4, webV6} {
				if got := askFrom(t, b, addr, port); got != want {
					t.Errorf("%s after replacing pod by pod2: answered by %q, want %s", addr, got, want)
				}
				// A new flow follows the rules either way.
				if got := askFrom(t, b, addr, port+1); got != netns.Pod2ID {
					t.Errorf("%s, new flow: answered by %q, want %s", addr, got, netns.Pod2ID)
				}
			}
		})
	}
}

// TestKernelConntrackFirstEndpoints covers service addresses that led to
// no endpoint and now do, sending UDP from one fixed source port before and
// after:
//   - "rejected": the service had no endpoints (its traffic was rejected)
//     and gets one;
//   - "not-yet-programmed": the proxier did not know the service yet, so
//     the node routed its traffic like any other (to its default route),
//     leaving a confirmed un-DNATed entry; then the service appears with an
//     endpoint.
//
// In both cases the same source port must reach the endpoint. The control
// runs without the cleanup: there, only the second case keeps the flow
// from the endpoint.
func TestKernelConntrackFirstEndpoints(t *testing.T) {
	// Another service, with endpoints: the kernel tracks connections of
	// a family in a namespace only once a rule there needs it (a dnat
	// rule of that family).
	other := &model.ServiceEndpoints{
		Service:   svc("default", "other", ipset("10.96.0.99", "fd00:10:96::99"), tcp(80, 6000)),
		Endpoints: podEndpoints(netns.PodID),
	}
	for _, tc := range []struct {
		name string
		// before is the state before the endpoint appears.
		before []*model.ServiceEndpoints
		// routeElsewhere routes the cluster IPs from the node to pod3
		// (which drops them), as a node routes any address it has no
		// rule for.
		routeElsewhere bool
		// staleWithoutCleanup is whether the first packets leave an
		// entry that keeps the flow from its endpoint without the
		// cleanup. A rejected packet does not: it is dropped before its
		// entry is confirmed (the kernel keeps no entry); a routed one
		// does.
		staleWithoutCleanup bool
	}{
		{name: "rejected", before: []*model.ServiceEndpoints{other, {Service: udpWeb()}}},
		{name: "not-yet-programmed", before: []*model.ServiceEndpoints{other}, routeElsewhere: true, staleWithoutCleanup: true},
	} {
		for _, cleanup := range []bool{true, false} {
			name := tc.name + map[bool]string{true: "/cleanup", false: "/no-cleanup"}[cleanup]
			t.Run(name, func(t *testing.T) {
				b := kernelTopology(t)
				s := newTestSink(t, b, "ct2")
				if tc.routeElsewhere {
					b.Node.AddRoute(webV4.String()+"/32", "dev", "vpod3")
					b.Node.AddRoute(webV6.String()+"/128", "dev", "vpod3")
				}
				if !cleanup {
					s.nft.cfg.Conntrack = noConntrack
				}
				s.setAll(tc.before...)
				s.sync()
				const port = 40011
				for _, addr := range []netip.Addr{webV4, webV6} {
					if got := askFrom(t, b, addr, port); got != "" {
						t.Fatalf("%s before any endpoint: answered by %q", addr, got)
					}
				}

				// A partial sync, as in a running proxier.
				web := udpWeb()
				s.setService(web)
				for _, e := range podEndpoints(netns.PodID) {
					s.setEndpoint(web.Key(), e)
				}
				if r := s.sync(); r.Full {
					t.Fatalf("the endpoint's sync was full")
				}
				for _, addr := range []netip.Addr{webV4, webV6} {
					want := netns.PodID
					if !cleanup && tc.staleWithoutCleanup {
						want = "" // the un-DNATed entry still routes the flow to pod3
					}
					if got := askFrom(t, b, addr, port); got != want {
						t.Errorf("%s after the endpoint appeared: answered by %q, want %q", addr, got, want)
					}
					if got := askFrom(t, b, addr, port+1); got != netns.PodID {
						t.Errorf("%s, new flow: answered by %q, want %s", addr, got, netns.PodID)
					}
				}
			})
		}
	}
}
