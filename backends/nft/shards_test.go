package nft

import "testing"

// TestShardBitsFor: the shard count of a table written whole follows its
// size, shardTarget service ports a shard, within 16 and 4,096 shards.
func TestShardBitsFor(t *testing.T) {
	for _, c := range []struct {
		ports int
		want  uint8
	}{
		{0, minShardBits},
		{1, minShardBits},
		{16 * shardTarget, 4},
		{16*shardTarget + 1, 5},
		{1000, 6},
		{10000, 10},
		{50000, 12},
		{maxShards * shardTarget, maxShardBits},
		{1 << 30, maxShardBits},
	} {
		if got := shardBitsFor(c.ports); got != c.want {
			t.Errorf("shardBitsFor(%d) = %d, want %d", c.ports, got, c.want)
		}
	}
}
