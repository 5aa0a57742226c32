package nft

import "testing"

// TestShardBitsFor: the shard count of a table written whole follows its
// size, shardTarget service ports a shard, within 256 and 4,096 shards.
func TestShardBitsFor(t *testing.T) {
	for _, c := range []struct {
		ports int
		want  uint8
	}{
		{0, minShardBits},
		{1, minShardBits},
		{1000, 8},
		{256 * shardTarget, 8},
		{256*shardTarget + 1, 9},
		{10000, 11},
		{50000, 12},
		{maxShards * shardTarget, maxShardBits},
		{1 << 30, maxShardBits},
	} {
		if got := shardBitsFor(c.ports); got != c.want {
			t.Errorf("shardBitsFor(%d) = %d, want %d", c.ports, got, c.want)
		}
	}
}
