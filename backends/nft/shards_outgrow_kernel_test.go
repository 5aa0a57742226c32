//go:build linux

package nft

import (
	"net/netip"
	"testing"

	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/model"
)

// TestKernelShardsOutgrowTheirCount: the shard count is chosen when the
// table is written whole, and the cluster-ips capacity alone would not
// write it whole when ports become plain under the same cluster IPs.
// Here 1,000 NodePort services (chains, no shard port: 256 shards) become
// plain ClusterIP services of 10 ports each, the same cluster IPs: 10,000
// ports, about 40 a shard in 256 shards. The round must be written whole
// (tracker.shardsOutgrown) with the count a whole write chooses (2,048),
// so that the documented bound of 4·shardTarget ports a shard holds.
func TestKernelShardsOutgrowTheirCount(t *testing.T) {
	b := kernelTopology(t)
	s := newTestSink(t, b, "outgrow")
	items := manyChainServices(1000)
	s.setAll(items...)
	if r := s.sync(); !r.Full {
		t.Fatalf("first sync not full")
	}
	plain := manyServices(1000)
	for _, se := range plain {
		svc := *se.Service
		svc.Ports = nil
		for p := range int32(10) {
			svc.Ports = append(svc.Ports, tcp(80+p, 6000))
		}
		s.set(svc.Key(), &model.ServiceEndpoints{Service: &svc, Endpoints: se.Endpoints})
	}
	r := s.sync()
	s.nft.mu.Lock()
	bits, ports := s.nft.tracker.shardBits, max(s.nft.tracker.shardPorts[ipv4], s.nft.tracker.shardPorts[ipv6])
	var most int32
	for _, n := range s.nft.tracker.shardBlocks[ipv4][:1<<bits] {
		most = max(most, n)
	}
	s.nft.mu.Unlock()
	t.Logf("after the round: full %v, %d shard ports in %d shards (shardBitsFor: %d), the fullest %d", r.Full, ports, 1<<bits, 1<<shardBitsFor(ports), most)
	if limit := 4 * shardTarget; ports > limit<<bits {
		t.Errorf("%d service ports in %d shards (the fullest %d), more than the documented %d a shard; a whole write would choose %d shards", ports, 1<<bits, most, limit, 1<<shardBitsFor(ports))
	}
	if !r.Full {
		t.Errorf("the round that took the shard maps over %d ports a shard was not written whole", 4*shardTarget)
	}
	for _, i := range []int{0, 999} {
		ip := netip.MustParseAddr(plain[i].Service.IPs.ClusterIPs.V4[0])
		for _, port := range []uint16{80, 89} {
			if a, err := b.Client.Ask("tcp", netip.AddrPortFrom(ip, port), netns.AskOptions{}); err != nil || a.Server != netns.PodID {
				t.Errorf("service %d (%s) port %d: %v, %v; want the pod", i, ip, port, a, err)
			}
		}
	}
}
