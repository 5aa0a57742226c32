//go:build linux

package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"strings"
)

// shardRuleKinds are the rules shard-rules puts before a shard's rule in
// kpng's services chain, to time what a packet pays for each rule it
// crosses without matching (docs/benchmarks.md, "The shards' sets").
var shardRuleKinds = map[string]string{
	"no-lookup": "`meta l4proto udp goto shardX` (a rule without a lookup)",
	"empty":     "a lookup in an empty set of the shards' key type",
	"sized":     "a lookup in a set of 100 keys with `size 1024` (the kernel's fixed hash)",
	"filled":    "a lookup in a set of 100 keys, unsized (rhash), as kpng's shard sets",
	"guard":     "no rule: the shard's rule moved to a chain shards-v4 (followed by --count rules of empty sets) behind `ip daddr @cluster-ips-v4 jump shards-v4`, as kpng writes it from three shards",
}

// shardRulesCmd rewrites a listing of kpng's tables (--in) with --count
// rules of --kind before the IPv4 rule of shard --shard in the services
// chain, and writes it to stdout.
func shardRulesCmd(args []string) error {
	fs := flag.NewFlagSet("shard-rules", flag.ExitOnError)
	in := fs.String("in", "", "a listing of kpng's tables (nft list table ip, then ip6; or nft list ruleset)")
	kind := fs.String("kind", "filled", "the rules put before the shard's: no-lookup, empty, sized, filled, or guard")
	count := fs.Int("count", 63, "the rules put before the shard's (with guard: after it, in shards-v4)")
	shard := fs.Int("shard", 10, "the shard of the probed services (their number of endpoints)")
	_ = fs.Parse(args)
	data, err := os.ReadFile(*in)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(os.Stdout)
	if err := shardRules(w, strings.Split(strings.TrimRight(string(data), "\n"), "\n"), *kind, *count, *shard); err != nil {
		return err
	}
	return w.Flush()
}

// shardRules writes lines with the rules of kind before the rule of shard
// in the services chain (shardRulesCmd); the sets they look up are
// declared before the first chain of the table holding that rule (table
// ip, or an earlier kpng's table inet).
func shardRules(w *bufio.Writer, lines []string, kind string, count, shard int) error {
	if _, ok := shardRuleKinds[kind]; !ok {
		return fmt.Errorf("shard-rules: kind %q unknown", kind)
	}
	target := fmt.Sprintf("shard4-%d", shard)
	rule := fmt.Sprintf("\t\tip daddr . meta l4proto . th dport @shard-ips-v4-%d goto %s", shard, target)
	at, head := -1, -1 // the rule's line, and its table's first line
	for i, l := range lines {
		if tableHead.MatchString(l) {
			head = i
		}
		if l == rule {
			at = i
			break
		}
	}
	if at < 0 {
		return fmt.Errorf("shard-rules: no rule %q in the listing", strings.TrimSpace(rule))
	}
	set := func(k int) string {
		text := fmt.Sprintf("\tset shard-ips-v4-x%d {\n\t\ttype ipv4_addr . inet_proto . inet_service\n", k)
		if kind == "sized" {
			text += "\t\tsize 1024\n"
		}
		if kind == "sized" || kind == "filled" {
			var els []string
			for j := range 100 {
				els = append(els, fmt.Sprintf("10.%d.%d.%d . tcp . 80", 100+k%150, k/150*2+j/250, j%250+1))
			}
			text += "\t\telements = { " + strings.Join(els, ", ") + " }\n"
		}
		return text + "\t}\n"
	}
	lookup := func(k int) string {
		if kind == "no-lookup" {
			return "\t\tmeta l4proto udp goto " + target
		}
		return fmt.Sprintf("\t\tip daddr . meta l4proto . th dport @shard-ips-v4-x%d goto %s", k, target)
	}
	declared := false
	for i, l := range lines {
		if !declared && i > head && strings.HasPrefix(l, "\tchain ") {
			declared = true
			if kind != "no-lookup" {
				for k := 1; k <= count; k++ {
					fmt.Fprintln(w, set(k))
				}
			}
			if kind == "guard" {
				fmt.Fprintln(w, "\tchain shards-v4 {\n"+rule)
				for k := 1; k <= count; k++ {
					fmt.Fprintln(w, lookup(k))
				}
				fmt.Fprint(w, "\t}\n\n")
			}
		}
		if l != rule {
			fmt.Fprintln(w, l)
			continue
		}
		if kind == "guard" {
			fmt.Fprintln(w, "\t\tip daddr @cluster-ips-v4 jump shards-v4")
			continue
		}
		for k := 1; k <= count; k++ {
			fmt.Fprintln(w, lookup(k))
		}
		fmt.Fprintln(w, l)
	}
	return nil
}
