//go:build linux

package main

import (
	"bufio"
	"strings"
	"testing"
)

// twoTables is a listing of kpng's two tables, the IPv6 one first (the
// rewrites must not depend on the order), with a service chain of the
// layout before the shard maps, as pick-vmap and the layouts rewrite it.
const twoTables = `table ip6 kpng-x {
	map service-ips-v6 {
		type ipv6_addr . inet_proto . inet_service : verdict
	}

	chain filter-output {
		type filter hook output priority filter - 10; policy accept;
		ct state new jump cluster-ips-check
	}

	chain services {
		ip6 daddr . meta l4proto . th dport vmap @service-ips-v6
	}
}
table ip kpng-x {
	map service-ips-v4 {
		type ipv4_addr . inet_proto . inet_service : verdict
	}

	map endpoints-v4-0 {
		typeof numgen random mod 10000000 : ip daddr . th dport
		flags interval
	}

	set shard-ips-v4-1 {
		type ipv4_addr . inet_proto . inet_service
	}

	chain filter-output {
		type filter hook output priority filter - 10; policy accept;
		ct state new jump cluster-ips-check
	}

	chain services {
		ip daddr . meta l4proto . th dport @shard-ips-v4-1 goto shard4-1
		ip daddr . meta l4proto . th dport vmap @service-ips-v4
	}

	chain svc4-ABCDEFGH-bench/svc-00003/tcp/80 {
		ip daddr 10.96.1.4 ip saddr != 10.0.0.0/16 jump mark-for-masquerade
		meta l4proto tcp dnat ip to numgen random mod 10000000 offset 0 map @endpoints-v4-0
	}

	chain shard4-1 {
		dnat ip to ip daddr . meta l4proto . tcp dport . numgen random mod 1 map @shard-endpoints-v4-1
	}
}`

// tableOf returns the text of the table "family name" in a listing.
func tableOf(t *testing.T, listing, table string) string {
	t.Helper()
	i := strings.Index(listing, "table "+table+" {\n")
	if i < 0 {
		t.Fatalf("no table %s in:\n%s", table, listing)
	}
	rest := listing[i:]
	return rest[:strings.Index(rest, "\n}\n")+3]
}

// TestTwoTables: with kpng's table ip and table ip6 in one listing, the
// IPv4 rewrites go in the table ip, whatever the order; no-v6 leaves the
// table ip6 out.
func TestTwoTables(t *testing.T) {
	lines := strings.Split(twoTables, "\n")
	run := func(f func(w *bufio.Writer) error) string {
		t.Helper()
		var b strings.Builder
		w := bufio.NewWriter(&b)
		if err := f(w); err != nil {
			t.Fatal(err)
		}
		_ = w.Flush()
		return b.String()
	}

	out := run(func(w *bufio.Writer) error {
		return variant(w, lines, map[string]bool{"pick-vmap": true, "no-filter": true}, 2)
	})
	if v4 := tableOf(t, out, "ip kpng-x"); strings.Count(v4, "\tchain ep4-") != 2 || strings.Contains(v4, "jump cluster-ips-check") {
		t.Errorf("pick-vmap, no-filter: table ip\n%s", v4)
	}
	if v6 := tableOf(t, out, "ip6 kpng-x"); strings.Contains(v6, "ep4-") || strings.Contains(v6, "jump cluster-ips-check") {
		t.Errorf("pick-vmap, no-filter: table ip6\n%s", v6)
	}

	out = run(func(w *bufio.Writer) error { return variant(w, lines, map[string]bool{"no-v6": true}, 2) })
	if strings.Contains(out, "ip6") || !strings.HasPrefix(out, "table ip kpng-x {\n") || !strings.HasSuffix(out, "\n}\n") {
		t.Errorf("no-v6:\n%s", out)
	}

	out = run(func(w *bufio.Writer) error { return relayout(w, lines, "sharded", 2, 0) })
	v4 := tableOf(t, out, "ip kpng-x")
	if !strings.Contains(v4, "\tmap shards-v4 {") || !strings.Contains(v4, "\tchain shard4-255 {") || !strings.Contains(v4, "ip daddr & 0.0.0.255 vmap @shards-v4") ||
		!strings.Contains(out, "\nadd element ip kpng-x shards-v4 {") || !strings.Contains(out, "\nadd element ip kpng-x eps4-4 { 10.96.1.4 . 80 . 0-4999999 : ") {
		t.Errorf("sharded: table ip\n%.3000s\nelements\n%.500s", v4, out[strings.Index(out, "add element"):])
	}
	if v6 := tableOf(t, out, "ip6 kpng-x"); v6 != tableOf(t, twoTables+"\n", "ip6 kpng-x") {
		t.Errorf("sharded: table ip6 changed:\n%s", v6)
	}

	out = run(func(w *bufio.Writer) error { return shardRules(w, lines, "filled", 2, 1) })
	if v4 := tableOf(t, out, "ip kpng-x"); strings.Count(v4, "\tset shard-ips-v4-x") != 2 || strings.Count(v4, "@shard-ips-v4-x") != 2 {
		t.Errorf("shard-rules: table ip\n%s", v4)
	}
	if v6 := tableOf(t, out, "ip6 kpng-x"); strings.Contains(v6, "shard-ips-v4") {
		t.Errorf("shard-rules: table ip6\n%s", v6)
	}
}
