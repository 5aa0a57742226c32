//go:build linux

package nft

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/model"
)

// TestKernelReshard: a table written whole with 100 plain services has
// 256 shards; growing to 1,000 by a partial sync keeps them; the round
// that takes the cluster IPs over their set's capacity writes the table
// whole with 512 shards (shardBitsFor 2,100). After each
// round the kernel's listing is the tracker's Text (but for the sized
// sets' capacities after a partial sync), and services of the first and
// the last rounds answer.
func TestKernelReshard(t *testing.T) {
	b := kernelTopology(t)
	s := newTestSink(t, b, "reshard")
	items := manyServices(2100)
	round := func(when string, full bool, mask string) {
		t.Helper()
		if r := s.sync(); r.Full != full {
			t.Errorf("%s: full sync %v, want %v", when, r.Full, full)
		}
		expectShardTable(t, b, s, when, mask, full, items, []int{0, 99, len(s.state) - 1})
	}
	s.setAll(items[:100]...)
	round("100 services", true, "0.0.0.255")
	for _, se := range items[100:1000] {
		s.set(se.Service.Key(), se)
	}
	round("1,000 services", false, "0.0.0.255")
	for _, se := range items[1000:] {
		s.set(se.Service.Key(), se)
	}
	round("2,100 services: over the cluster-ips capacity", true, "0.0.1.255")
}

// expectShardTable checks the table of s: the kernel's listing is the
// tracker's Text (but for the sized sets' capacities unless sizes: Text
// gives those of a table written whole now, the kernel has those of the
// last full write, capacity.go), its shards lookup masks with mask, and
// the services items[i], i in answer, are answered by the pod.
func expectShardTable(t *testing.T, b *netns.BlogTopology, s *testSink, when, mask string, sizes bool, items []*model.ServiceEndpoints, answer []int) {
	t.Helper()
	s.nft.mu.Lock()
	rs := s.nft.tracker.Ruleset(s.nft.table)
	s.nft.mu.Unlock()
	want, err := parseListing(rs.Text())
	if err != nil {
		t.Fatalf("%s: Text: %v", when, err)
	}
	listing := nftList(t, b.Node, rs.Table)
	got, err := parseListing(listing)
	if err != nil {
		t.Fatalf("%s: nft list table: %v", when, err)
	}
	if !sizes {
		for _, objs := range []map[string]*listedObject{want, got} {
			for _, o := range objs {
				o.Decl = slices.DeleteFunc(o.Decl, func(d string) bool { return strings.HasPrefix(d, "size ") })
			}
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("%s: the kernel's listing differs from Text (-Text +kernel):\n%s", when, diff)
	}
	if !strings.Contains(listing, "ip daddr & "+mask+" vmap @shards-v4") {
		t.Errorf("%s: the shards lookup does not mask with %s:\n%s", when, mask, got["chain services"])
	}
	for _, i := range answer {
		ip := netip.MustParseAddr(items[i].Service.IPs.ClusterIPs.V4[0])
		if a, err := b.Client.Ask("tcp", netip.AddrPortFrom(ip, 80), netns.AskOptions{}); err != nil || a.Server != netns.PodID {
			t.Errorf("%s: service %d (%s): %v, %v; want the pod", when, i, ip, a, err)
		}
	}
}
