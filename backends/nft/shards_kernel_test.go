//go:build linux

package nft

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/model"
)

// TestKernelShardsFollowEndpointCounts: 300 plain services of one
// endpoint are in shard 1, written whole; a partial sync giving 100 of
// them a second endpoint moves those to shard 2 (its chain, map and set
// created, the services chain written again with its rule, their keys
// going to its set), and both endpoints answer; with both shards there, a
// service added, one moved and one deleted are set elements only; a
// partial sync deleting the other 200 and leaving the 100 with one
// endpoint again empties shard 2, whose chain, map, set and rule go. After each
// round the kernel's listing is the tracker's Text, no transaction was
// written whole after the first, and the services answer from the pods
// their endpoints name.
func TestKernelShardsFollowEndpointCounts(t *testing.T) {
	b := kernelTopology(t)
	s := newTestSink(t, b, "shards")
	items := manyServices(300)
	s.setAll(items...)
	if r := s.sync(); !r.Full {
		t.Fatalf("first sync not full")
	}
	expectShardTable(t, b, s, "300 services of 1 endpoint", []string{"shard4-1"})
	expectAnswers(t, b, "300 services of 1 endpoint", items[0], netns.PodID)
	expectAnswers(t, b, "300 services of 1 endpoint", items[299], netns.PodID)

	// withEndpoints sets service i's endpoints (a copy: the feeder
	// holds what it was given).
	withEndpoints := func(i int, eps ...*model.Endpoint) {
		c := *items[i]
		c.Endpoints = eps
		items[i] = &c
		s.set(c.Service.Key(), &c)
	}
	pod, pod2 := podEndpoints(netns.PodID)[0], podEndpoints(netns.Pod2ID)[0] // IPv4
	for i := range 100 {
		withEndpoints(i, pod, pod2)
	}
	if r := s.sync(); r.Full || r.Err != nil {
		t.Fatalf("100 services with 2 endpoints: %+v, want a partial sync", r)
	}
	expectShardTable(t, b, s, "100 services with 2 endpoints", []string{"shard4-1", "shard4-2"})
	expectAnswers(t, b, "100 services with 2 endpoints", items[0], netns.PodID, netns.Pod2ID)
	expectAnswers(t, b, "100 services with 2 endpoints", items[99], netns.PodID, netns.Pod2ID)
	expectAnswers(t, b, "100 services with 2 endpoints", items[100], netns.PodID)

	// Both shards there: a service added to one, another moved from
	// shard 1 to shard 2 and one deleted are elements without a verdict
	// only (no rule, chain or set: the kernel does not walk the table).
	added := &model.ServiceEndpoints{Service: svc("default", "svc-added", ipset("10.96.9.9"), tcp(80, 6000)), Endpoints: []*model.Endpoint{pod2}}
	s.set(added.Service.Key(), added)
	withEndpoints(100, pod, pod2)
	s.deleteService(items[299].Service.Key())
	r := s.sync()
	if st := r.Stats; r.Full || r.Err != nil || st.Rules != 0 || st.ChainsAdded+st.ChainsFlushed+st.ChainsDeleted != 0 || st.SetsAdded+st.SetsDeleted != 0 || st.ElementsAdded == 0 {
		t.Fatalf("a service added, one moved to shard 2, one deleted: %+v, want a partial sync of elements only", r)
	}
	expectShardTable(t, b, s, "a service added, one moved, one deleted", []string{"shard4-1", "shard4-2"})
	expectAnswers(t, b, "a service added", added, netns.Pod2ID)
	expectAnswers(t, b, "a service moved to shard 2", items[100], netns.PodID, netns.Pod2ID)
	s.deleteService(added.Service.Key())
	items = slices.Delete(items, 299, 300)

	for _, se := range items[100:] {
		s.deleteService(se.Service.Key())
	}
	for i := range 100 {
		withEndpoints(i, pod2)
	}
	if r := s.sync(); r.Full || r.Err != nil {
		t.Fatalf("100 services back to 1 endpoint: %+v, want a partial sync", r)
	}
	expectShardTable(t, b, s, "100 services back to 1 endpoint", []string{"shard4-1"})
	// The services chain was written again without shard 2's rule: the
	// sink's check finds the table as it left it.
	s.nft.mu.Lock()
	drift, err := s.nft.applier.Check(nil)
	s.nft.mu.Unlock()
	if err != nil || drift != "" {
		t.Errorf("100 services back to 1 endpoint: the sink's check: %q, %v; want nothing changed", drift, err)
	}
	expectAnswers(t, b, "100 services back to 1 endpoint", items[0], netns.Pod2ID)
	expectAnswers(t, b, "100 services back to 1 endpoint", items[99], netns.Pod2ID)
}

// expectShardTable checks the table of s: the kernel's listing is the
// tracker's Text (expectListingIsText), and its shard chains are shards.
func expectShardTable(t *testing.T, b *netns.BlogTopology, s *testSink, when string, shards []string) {
	t.Helper()
	got := expectListingIsText(t, b, s, when)
	var chains []string
	for name := range got {
		_, obj, _ := strings.Cut(name, " ") // after the table's family
		if c, ok := strings.CutPrefix(obj, "chain shard"); ok && (strings.HasPrefix(c, "4-") || strings.HasPrefix(c, "6-")) {
			chains = append(chains, "shard"+c)
		}
	}
	slices.Sort(chains)
	if !slices.Equal(chains, shards) {
		t.Errorf("%s: shard chains %v, want %v", when, chains, shards)
	}
}

// expectListingIsText checks that the kernel's listing of s's table is
// the tracker's Text (but for the sized sets' capacities: Text gives
// those of a table written whole now, the kernel has those of the last
// full write, or of the partial sync that created a shard's set or map,
// capacity.go), and returns the listing's objects.
func expectListingIsText(t *testing.T, b *netns.BlogTopology, s *testSink, when string) map[string]*listedObject {
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
	for _, objs := range []map[string]*listedObject{want, got} {
		for _, o := range objs {
			o.Decl = slices.DeleteFunc(o.Decl, func(d string) bool { return strings.HasPrefix(d, "size ") })
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("%s: the kernel's listing differs from Text (-Text +kernel):\n%s", when, diff)
	}
	return got
}

// expectAnswers asks the service se's IPv4 cluster IP 20 times from the
// client and checks that exactly the pods servers answer.
func expectAnswers(t *testing.T, b *netns.BlogTopology, when string, se *model.ServiceEndpoints, servers ...string) {
	t.Helper()
	expectAnswersAt(t, b, when, netip.MustParseAddr(se.Service.IPs.ClusterIPs.V4[0]), servers...)
}

// expectAnswersAt asks ip (port 80) 20 times from the client and checks
// that exactly the pods servers answer.
func expectAnswersAt(t *testing.T, b *netns.BlogTopology, when string, ip netip.Addr, servers ...string) {
	t.Helper()
	seen := map[string]bool{}
	for range 20 {
		a, err := b.Client.Ask("tcp", netip.AddrPortFrom(ip, 80), netns.AskOptions{})
		if err != nil {
			t.Errorf("%s: %s: %v", when, ip, err)
			return
		}
		seen[a.Server] = true
	}
	var got []string
	for id := range seen {
		got = append(got, id)
	}
	slices.Sort(got)
	if want := slices.Sorted(slices.Values(servers)); !slices.Equal(got, want) {
		t.Errorf("%s: %s answered by %v, want %v", when, ip, got, want)
	}
}

// TestKernelShardsGuard: from shardGuardMin shards in a family, the
// services chain jumps to the family's shards chain only for a cluster
// IP. Dual-stack services of 1, 2 and 3 endpoints (three shards in each
// family) and a node-port one, written whole: the guard and shards-v4,
// shards-v6 in the kernel's listing, which is the tracker's Text; every
// service answers from its endpoints on both cluster IPs, the node-port
// one on its cluster IP too (its packets cross the shards' rules, then
// the services map). Then, in partial syncs: the 3-endpoint service taken
// to 2 (two shards: the shards' rules back in the services chain, the
// shards chains gone), back to 3 (the guard back), a new service with a
// new cluster IP in a fourth shard (guarded before and after), that
// service deleted (its shard's chain, which shards-v4 went to, gone), and
// the plain services deleted (three shards to none at once). After each
// round the sink's check finds the table as it left it, and the services
// answer.
func TestKernelShardsGuard(t *testing.T) {
	b := kernelTopology(t)
	s := newTestSink(t, b, "guard")
	pods := [][]string{{netns.PodID}, {netns.PodID, netns.Pod2ID}, {netns.PodID, netns.Pod2ID, pod3ID}}
	var items []*model.ServiceEndpoints
	for i, ids := range pods {
		v4, v6 := fmt.Sprintf("10.96.7.%d", 1+i), fmt.Sprintf("fd00:10:96::7:%d", 1+i)
		items = append(items, &model.ServiceEndpoints{
			Service:   svc("default", fmt.Sprintf("plain-%d", 1+i), ipset(v4, v6), tcp(80, 6000)),
			Endpoints: podEndpoints(ids...),
		})
	}
	nodePort := manyChainServices(1)[0]
	nodePort.Endpoints = podEndpoints(netns.Pod2ID)[:1]
	s.setAll(append(slices.Clone(items), nodePort)...)
	if r := s.sync(); !r.Full {
		t.Fatalf("first sync not full")
	}
	ask := func(when string, se *model.ServiceEndpoints, servers []string) {
		t.Helper()
		for _, ip := range append(slices.Clone(se.Service.IPs.ClusterIPs.V4), se.Service.IPs.ClusterIPs.V6...) {
			expectAnswersAt(t, b, when+" "+ip, netip.MustParseAddr(ip), servers...)
		}
	}
	// round syncs (but for the first, synced whole above), then checks
	// the listing, the guards and the answers of the plain services
	// live (their pods) and of the node-port one.
	round := func(when string, first bool, guarded bool, shards []string, live map[int][]string) (r SyncResult) {
		t.Helper()
		if !first {
			if r = s.sync(); r.Full || r.Err != nil {
				t.Fatalf("%s: %+v, want a partial sync", when, r)
			}
		}
		expectShardTable(t, b, s, when, shards)
		got := expectListingIsText(t, b, s, when)
		for _, f := range []ipFamily{ipv4, ipv6} {
			table := f.info().nft + " "
			services := got[table+"chain "+chainServices]
			if services == nil {
				t.Fatalf("%s: no services chain in table %s", when, table)
			}
			jump := slices.Contains(services.Rules, shardGuardText(f))
			if _, ok := got[table+"chain "+shardsChainName(f)]; jump != guarded || ok != guarded {
				t.Errorf("%s: the guard in the services chain %v, chain %s there %v; want %v:\n%s", when, jump, shardsChainName(f), ok, guarded, strings.Join(services.Rules, "\n"))
			}
		}
		s.nft.mu.Lock()
		drift, err := s.nft.applier.Check(nil)
		s.nft.mu.Unlock()
		if err != nil || drift != "" {
			t.Errorf("%s: the sink's check: %q, %v; want nothing changed", when, drift, err)
		}
		for i, servers := range live {
			ask(when, items[i], servers)
		}
		expectAnswers(t, b, when, nodePort, netns.Pod2ID)
		return r
	}
	withPods := func(i int, ids ...string) {
		c := *items[i]
		c.Endpoints = podEndpoints(ids...)
		items[i] = &c
		s.set(c.Service.Key(), &c)
	}
	all := map[int][]string{0: pods[0], 1: pods[1], 2: pods[2]}
	both := func(n ...int) []string {
		var out []string
		for _, f := range []string{"4", "6"} {
			for _, k := range n {
				out = append(out, fmt.Sprintf("shard%s-%d", f, k))
			}
		}
		slices.Sort(out)
		return out
	}
	round("three shards", true, true, both(1, 2, 3), all)

	withPods(2, netns.PodID, pod3ID)
	round("two shards", false, false, both(1, 2), map[int][]string{0: pods[0], 1: pods[1], 2: {netns.PodID, pod3ID}})

	withPods(2, pods[2]...)
	round("three shards again", false, true, both(1, 2, 3), all)

	// A fourth shard, with a new cluster IP (its element in cluster-ips
	// and its key in the shard's set in the same round); its fourth
	// endpoints answer nothing, so it is not asked.
	fourth := &model.ServiceEndpoints{
		Service:   svc("default", "plain-4", ipset("10.96.7.4", "fd00:10:96::7:4"), tcp(80, 6000)),
		Endpoints: append(podEndpoints(pods[2]...), ep("10.255.9.9", false), ep("fd00:99::9", false)),
	}
	// Both families behind the check before and after: their shards
	// chains are written again, the services chain is left as it is.
	s.set(fourth.Service.Key(), fourth)
	if r := round("a fourth shard", false, true, both(1, 2, 3, 4), all); r.Stats.ChainsFlushed != 2 {
		t.Errorf("a fourth shard: %d chains flushed, want 2 (shards-v4, shards-v6)", r.Stats.ChainsFlushed)
	}
	s.deleteService(fourth.Service.Key())
	if r := round("the fourth shard gone", false, true, both(1, 2, 3), all); r.Stats.ChainsFlushed != 2 {
		t.Errorf("the fourth shard gone: %d chains flushed, want 2 (shards-v4, shards-v6)", r.Stats.ChainsFlushed)
	}

	for _, se := range items {
		s.deleteService(se.Service.Key())
	}
	round("no shard", false, false, nil, nil)
}
