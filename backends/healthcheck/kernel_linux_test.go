//go:build linux

package healthcheck

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/model"
)

// askIn sends GET /healthz to dst from ns; status 0 with a refused
// connection means no server there.
func askIn(t *testing.T, ns *netns.NS, dst netip.AddrPort) int {
	t.Helper()
	var code int
	err := ns.Do(func() error {
		c, err := net.DialTimeout("tcp", dst.String(), time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := fmt.Fprintf(c, "GET /healthz HTTP/1.0\r\nHost: %s\r\n\r\n", dst); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return err
		}
		resp.Body.Close()
		code = resp.StatusCode
		return nil
	})
	if err != nil && !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("GET %s from %s: %v", dst, ns, err)
	}
	return code
}

// TestKernelListensOnNodePortAddresses runs the health check server in
// the node of netns.Blog (addresses 10.0.0.2 and fd00::2 toward the
// client, 11.0.2.1 and 1100::201 toward the pods, loopback) and checks,
// from the client, the pods and the node itself, on which addresses a
// health check node port answers: those --nodeport-addresses selects, in
// the service's families, never loopback by default (kube-proxy's rule).
func TestKernelListensOnNodePortAddresses(t *testing.T) {
	netns.RequirePrivileged(t)
	b := netns.Blog(t)
	listen := func(network, address string) (ln net.Listener, err error) {
		err = b.Node.Do(func() error { ln, err = net.Listen(network, address); return err })
		return ln, err
	}
	addrs := func() (out []netip.Addr, err error) {
		err = b.Node.Do(func() error { out, err = interfaceAddresses(); return err })
		return out, err
	}
	const port = 32123
	service := func(clusterIPs ...string) *model.ServiceEndpoints {
		set, _ := model.NewIPSet(clusterIPs...)
		svc := lbService("lb", port, true)
		svc.IPs.ClusterIPs = set
		return withEndpoints(svc, endpoint("11.0.2.2", true, true))
	}
	at := func(a netip.Addr) netip.AddrPort { return netip.AddrPortFrom(a, port) }
	lo4, lo6 := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")
	type probe struct {
		from *netns.NS
		dst  netip.Addr
	}
	probes := []probe{
		{b.Client, netns.NodeV4}, {b.Client, netns.NodeV6},
		{b.Pod, netns.GatewayV4}, {b.Pod, netns.GatewayV6},
		{b.Node, lo4}, {b.Node, lo6},
	}
	for _, tc := range []struct {
		name     string
		prefixes []netip.Prefix
		se       *model.ServiceEndpoints
		answers  []netip.Addr
	}{
		{"IPv4 service, every address", nil, service("10.96.0.1"), []netip.Addr{netns.NodeV4, netns.GatewayV4}},
		{"dual-stack service, every address", nil, service("10.96.0.1", "fd00:10:96::1"), []netip.Addr{netns.NodeV4, netns.NodeV6, netns.GatewayV4, netns.GatewayV6}},
		{"IPv6 service, IPv4 prefix only: every IPv6 address", []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}, service("fd00:10:96::1"), []netip.Addr{netns.NodeV6, netns.GatewayV6}},
		{"dual-stack service, prefixes of both families", []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24"), netip.MustParsePrefix("1100::200/120")},
			service("10.96.0.1", "fd00:10:96::1"), []netip.Addr{netns.NodeV4, netns.GatewayV6}},
		{"loopback asked for", []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, service("10.96.0.1"), []netip.Addr{lo4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSink(t, Config{Listen: listen, Addresses: addrs, NodePortAddresses: tc.prefixes})
			defer s.Close()
			s.Reset()
			s.Update(tc.se.Service.Key(), nil, tc.se)
			if err := s.Sync(); err != nil {
				t.Fatal(err)
			}
			for _, p := range probes {
				code := askIn(t, p.from, at(p.dst))
				want := 0
				for _, a := range tc.answers {
					if a == p.dst {
						want = http.StatusOK
					}
				}
				if code != want {
					t.Errorf("%s from %s: status %d, want %d (0: refused)", at(p.dst), p.from, code, want)
				}
			}
		})
	}
}
