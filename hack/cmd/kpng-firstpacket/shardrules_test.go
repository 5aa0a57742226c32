//go:build linux

package main

import (
	"bufio"
	"os"
	"strings"
	"testing"
)

// TestShardRules rewrites kpng's golden two-services listing (shard 1 of
// IPv4): each kind puts its rules before the shard's in the services
// chain, with their sets declared; guard moves the shard's rule to
// shards-v4, behind the cluster-IP check; a shard without a rule is an
// error, not a listing silently the same.
func TestShardRules(t *testing.T) {
	data, err := os.ReadFile("../../../backends/nft/testdata/two-services.golden")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	rewrite := func(kind string, shard int) (string, error) {
		var b strings.Builder
		w := bufio.NewWriter(&b)
		err := shardRules(w, lines, kind, 3, shard)
		_ = w.Flush()
		return b.String(), err
	}
	const real = "ip daddr . meta l4proto . th dport @shard-ips-v4-1 goto shard4-1"
	for kind := range shardRuleKinds {
		out, err := rewrite(kind, 1)
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		services := out[strings.Index(out, "\tchain services {"):]
		services = services[:strings.Index(services, "\t}")]
		switch kind {
		case "guard":
			shards := out[strings.Index(out, "\tchain shards-v4 {"):]
			shards = shards[:strings.Index(shards, "\t}")]
			if !strings.Contains(services, "ip daddr @cluster-ips-v4 jump shards-v4") || strings.Contains(services, real) ||
				!strings.HasPrefix(strings.Split(shards, "\n")[1], "\t\t"+real) || strings.Count(shards, "goto shard4-1") != 4 {
				t.Errorf("guard: services chain\n%s\nshards-v4\n%s", services, shards)
			}
		case "no-lookup":
			if strings.Count(services, "meta l4proto udp goto shard4-1") != 3 || strings.Index(services, "udp goto") > strings.Index(services, real) {
				t.Errorf("no-lookup: services chain\n%s", services)
			}
		default:
			if strings.Count(services, "@shard-ips-v4-x") != 3 || strings.Index(services, "@shard-ips-v4-x") > strings.Index(services, real) ||
				strings.Count(out, "\tset shard-ips-v4-x") != 3 || (kind == "empty") != !strings.Contains(out, "10.101.0.1 . tcp . 80") ||
				(kind == "sized") != strings.Contains(out, "size 1024\n\t\telements = { 10.101.0.1 ") {
				t.Errorf("%s: services chain\n%s\nlisting\n%.2000s", kind, services, out)
			}
		}
	}
	if _, err := rewrite("filled", 7); err == nil {
		t.Error("shard 7, which the listing has not: no error")
	}
	if _, err := rewrite("none", 1); err == nil {
		t.Error("kind none: no error")
	}
}
