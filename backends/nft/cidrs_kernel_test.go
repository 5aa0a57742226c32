//go:build linux

package nft

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/model"
)

// TestKernelServiceCIDRChanges checks the service CIDRs' drop rules
// through partial syncs: an address of 10.97.0.0/16 that no service holds
// (served by pod3) answers while the service CIDR is 10.96.0.0/16, is
// dropped once it grows to 10.96.0.0/15 (a partial sync rewriting
// cluster-ips-check), and answers again once the CIDRs are gone; a
// service keeps answering throughout, and after each round the kernel's
// listing is the tracker's Text.
func TestKernelServiceCIDRChanges(t *testing.T) {
	b := kernelTopology(t)
	spare := netip.MustParseAddr("10.97.0.50")
	pod3 := netns.New(t, "cidrpod")
	netns.Veth(t, b.Node, "vcidr", pod3, "eth0")
	b.Node.AddAddr("vcidr", netns.GatewayV4.String()+"/32")
	b.Node.AddRoute(spare.String()+"/32", "dev", "vcidr")
	pod3.AddAddr("eth0", spare.String()+"/32")
	pod3.AddRoute("default", "via", netns.GatewayV4.String(), "dev", "eth0", "onlink")
	pod3.Serve("spare", []netip.Addr{spare}, []uint16{80})

	s := newTestSink(t, b, "cidrs")
	items := manyServices(2)
	s.setAll(items...)
	cidrs := func(ps ...string) *model.Cluster {
		c := &model.Cluster{}
		for _, p := range ps {
			c.ServiceCIDRs = append(c.ServiceCIDRs, netip.MustParsePrefix(p))
		}
		return c
	}
	s.feeder.SetCluster(cidrs("10.96.0.0/16", "fd00:10:96::/108"))
	if r := s.sync(); !r.Full || r.Err != nil {
		t.Fatalf("first sync: %+v", r)
	}
	checkCheckChain(t, b, s, "10.96.0.0/16", []string{"ip daddr 10.96.0.0/16 drop", "ip6 daddr fd00:10:96::/108 drop"})
	ask(t, b.Client, "tcp", netip.AddrPortFrom(spare, 80), "spare")
	expectAnswers(t, b, "10.96.0.0/16", items[1], netns.PodID)

	s.feeder.SetCluster(cidrs("10.96.0.0/16", "10.97.0.0/16", "fd00:10:96::/108"))
	if r := s.sync(); r.Full || r.Err != nil {
		t.Fatalf("the CIDRs grown: %+v, want a partial sync", r)
	}
	checkCheckChain(t, b, s, "10.96.0.0/15", []string{"ip daddr 10.96.0.0/15 drop", "ip6 daddr fd00:10:96::/108 drop"})
	if a, err := b.Client.Ask("tcp", netip.AddrPortFrom(spare, 80), netns.AskOptions{Timeout: 500 * time.Millisecond}); err == nil {
		t.Errorf("%s inside the service CIDRs, no service: answered %v, want dropped", spare, a)
	}
	expectAnswers(t, b, "10.96.0.0/15", items[1], netns.PodID)

	s.feeder.SetCluster(nil)
	if r := s.sync(); r.Full || r.Err != nil {
		t.Fatalf("no CIDRs: %+v, want a partial sync", r)
	}
	checkCheckChain(t, b, s, "no CIDRs", nil)
	ask(t, b.Client, "tcp", netip.AddrPortFrom(spare, 80), "spare")
}

// checkCheckChain checks that the kernel's listing of s's table is its
// Text, that cluster-ips-check's rules after the two cluster-ips lookups
// are drops, and that the sink's check of the table finds it as it left
// it (the rewritten chain's rules counted).
func checkCheckChain(t *testing.T, b *netns.BlogTopology, s *testSink, when string, drops []string) {
	t.Helper()
	s.nft.mu.Lock()
	drift, err := s.nft.applier.Check(nil)
	s.nft.mu.Unlock()
	if err != nil || drift != "" {
		t.Errorf("%s: the sink's check: %q, %v; want nothing changed", when, drift, err)
	}
	got := expectListingIsText(t, b, s, when)
	var gotDrops []string
	for _, f := range []ipFamily{ipv4, ipv6} {
		c := got[f.info().nft+" chain "+chainClusterIPsCheck]
		if c == nil || len(c.Rules) < 1 {
			t.Fatalf("%s: chain %s of table %s: %+v", when, chainClusterIPsCheck, f.info().nft, c)
		}
		gotDrops = append(gotDrops, c.Rules[1:]...)
	}
	if !slices.Equal(gotDrops, drops) {
		t.Errorf("%s: %s drops %q, want %q", when, chainClusterIPsCheck, gotDrops, drops)
	}
}
