//go:build linux

package nft

import (
	"fmt"
	"testing"

	"sigs.k8s.io/kpng/model"
)

// TestKernelShardsOutgrowTheirCount: the shard count is chosen when the
// table is written whole, and a partial sync writes it whole only when a
// cluster-ips or hairpin set outgrows its capacity. The documented bound
// (docs/backends/nft.md "Shards", shardBitsFor: "at most about 32
// service ports a shard in between", 4·shardTarget) then holds only while
// the shard maps' ports grow with the cluster IPs. Here 1,000 NodePort
// services (chains, no shard port: 256 shards) become plain ClusterIP
// services of 10 ports each, the same cluster IPs: 10,000 ports go into
// the 256 shards by a partial sync (about 40 a shard; a table written
// whole would have 2,048 shards), and stay there.
func TestKernelShardsOutgrowTheirCount(t *testing.T) {
	b := kernelTopology(t)
	s := newTestSink(t, b, "outgrow")
	items := manyChainServices(1000)
	s.setAll(items...)
	if r := s.sync(); !r.Full {
		t.Fatalf("first sync not full")
	}
	for _, se := range manyServices(1000) {
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
	if limit := 4 * shardTarget; int(most) > limit {
		t.Errorf("%s", fmt.Sprintf("a shard holds %d service ports, more than the documented %d, with %d shards where a whole write would choose %d", most, limit, 1<<bits, 1<<shardBitsFor(ports)))
	}
}
