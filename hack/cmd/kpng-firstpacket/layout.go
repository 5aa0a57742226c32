//go:build linux

package main

import (
	"bufio"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// layouts are the candidate layouts relayout writes from a listing of
// kpng's tables: ways to add a service without a new chain, rule or goto
// element (any of which makes the kernel validate the whole table at
// commit), each keeping an endpoint change element-only.
var layouts = map[string]string{
	"shared": "no service chains: one DNAT rule in `services` through one map keyed by " +
		"`ip daddr . th dport . numgen random mod 10000000` (a concatenation with a range: the kernel's pipapo set)",
	"sharded": "the same map split in 256 shards by the cluster IP's last byte: " +
		"`ip daddr & 0.0.0.255 vmap @shards-v4` jumps to one of 256 fixed chains, each with the DNAT through its own map",
	"pool": "kpng's service chains as a pool of pre-created chains, reached through the packet mark: " +
		"`meta mark set ip daddr . meta l4proto . th dport map @slot-v4` (slot << 16), then `meta mark vmap @pool-v4`; " +
		"a service add takes a spare chain (elements only), but the packet's mark is overwritten",
}

// shards is the number of shard chains of the sharded layout: a pipapo
// set's insertions cost more the more elements it holds (loading 100,000
// into one took 3.6 minutes of kernel time), so many small ones.
const shards = 256

// shardOf returns the shard of a cluster IP in the sharded layout.
func shardOf(i int) int { return int(clusterIP(i).As4()[3]) % shards }

// epElems returns the elements of service i's endpoints in a map keyed by
// `ip daddr . th dport . numgen random mod 10000000`: endpoint k owns
// [k·10⁷/e, (k+1)·10⁷/e).
func epElems(i, e int) []string {
	var out []string
	for k := range e {
		out = append(out, fmt.Sprintf("%s . 80 . %d-%d : %s . 8080", clusterIP(i), k*10000000/e, (k+1)*10000000/e-1, endpointIP(i, k, e)))
	}
	return out
}

// relayout writes the listing lines of kpng's tables in the given layout
// (see layouts), for services of e endpoints, spare pool chains for the
// pool layout. The layout is IPv4's: it goes in the table holding IPv4
// (`table ip X`, or an earlier kpng's `table inet X`); a table ip6 is
// copied as it is.
func relayout(w *bufio.Writer, lines []string, layout string, e, spare int) error {
	if _, ok := layouts[layout]; !ok {
		return fmt.Errorf("layout %q: unknown (want one of shared, sharded, pool)", layout)
	}
	const eps = "typeof ip daddr . th dport . numgen random mod 10000000 : ip daddr . th dport; flags interval;"
	const dnat = "meta l4proto tcp dnat ip to ip daddr . th dport . numgen random mod 10000000 map @"
	var services []int // the services whose chains the listing holds
	chainOf := map[int]string{}
	var maxMap int    // the highest endpoint map number
	family := ""      // the family of the table being read
	var table4 string // the table holding IPv4: "ip X" or "inet X"
	skip, skipElems, inSvcMap := false, false, false
	for _, line := range lines {
		if skip {
			if line == "\t}" {
				skip = false
			}
			continue
		}
		if skipElems {
			if strings.HasSuffix(line, "}") {
				skipElems = false
			}
			continue
		}
		if m := svcChain.FindStringSubmatch(line); m != nil {
			i, err := strconv.Atoi(m[2])
			if err != nil {
				return fmt.Errorf("chain %s: %w", m[1], err)
			}
			services = append(services, i)
			chainOf[i] = m[1]
			if layout != "pool" {
				skip = true
				continue
			}
		}
		if strings.HasPrefix(line, "\tmap endpoints-v4-") {
			k, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(line, "\tmap endpoints-v4-"), " {"))
			if err != nil {
				return fmt.Errorf("map line %q: %w", line, err)
			}
			maxMap = max(maxMap, k)
			if layout != "pool" {
				skip = true
				continue
			}
		}
		switch {
		case line == "\tmap service-ips-v4 {":
			inSvcMap = true
		case inSvcMap && strings.Contains(line, "elements = {"):
			skipElems = !strings.HasSuffix(line, "}")
			continue
		case inSvcMap && line == "\t}":
			inSvcMap = false
		}
		if m := tableHead.FindStringSubmatch(line); m != nil {
			family = m[1]
			fmt.Fprintln(w, line)
			if family == "ip6" {
				continue
			}
			table4 = m[1] + " " + m[2]
			switch layout {
			case "shared":
				fmt.Fprintf(w, "\tmap eps-v4 { %s }\n", eps)
			case "sharded":
				for s := range shards {
					fmt.Fprintf(w, "\tmap eps4-%d { %s }\n", s, eps)
				}
				fmt.Fprintln(w, "\tmap shards-v4 { type ipv4_addr : verdict; }")
			case "pool":
				fmt.Fprintln(w, "\tmap slot-v4 { typeof ip daddr . meta l4proto . th dport : meta mark; }")
				fmt.Fprintln(w, "\tmap pool-v4 { typeof meta mark : verdict; }")
			}
			continue
		}
		if family == "ip6" {
			if line == "}" {
				family = ""
			}
			fmt.Fprintln(w, line)
			continue
		}
		if line == "\tchain services {" {
			fmt.Fprintln(w, line)
			switch layout {
			case "shared":
				fmt.Fprintln(w, "\t\tip daddr @cluster-ips-v4 ip saddr != 10.0.0.0/16 jump mark-for-masquerade")
				fmt.Fprintln(w, "\t\t"+dnat+"eps-v4")
			case "sharded":
				fmt.Fprintln(w, "\t\tip daddr @cluster-ips-v4 ip saddr != 10.0.0.0/16 jump mark-for-masquerade")
				fmt.Fprintln(w, "\t\tip daddr & 0.0.0.255 vmap @shards-v4")
			case "pool":
				fmt.Fprintln(w, "\t\tmeta mark set ip daddr . meta l4proto . th dport map @slot-v4")
				fmt.Fprintln(w, "\t\tmeta mark vmap @pool-v4")
			}
			continue
		}
		if line == "}" {
			family = ""
			switch layout {
			case "sharded":
				for s := range shards {
					fmt.Fprintf(w, "\tchain shard4-%d {\n\t\t%seps4-%d\n\t}\n", s, dnat, s)
				}
			case "pool":
				// Spare chains, in blocks after the last service's.
				for j := range spare {
					slot := len(services) + j
					fmt.Fprintf(w, "\tchain pool4-%d {\n\t\tip saddr != 10.0.0.0/16 jump mark-for-masquerade\n"+
						"\t\tmeta l4proto tcp dnat ip to numgen random mod 10000000 offset %d map @endpoints-v4-%d\n\t}\n",
						slot, slot%64*10000000, slot/64)
					if slot/64 > maxMap {
						for k := maxMap + 1; k <= slot/64; k++ {
							fmt.Fprintf(w, "\tmap endpoints-v4-%d { typeof numgen random mod 10000000 : ip daddr . th dport; flags interval; }\n", k)
						}
						maxMap = slot / 64
					}
				}
				// The elements here, in the table's one transaction, after
				// the chains they name: each statement adding goto elements
				// would walk the whole table.
				var slots, pool []string
				for _, i := range services {
					slots = append(slots, fmt.Sprintf("%s . tcp . 80 : 0x%08x", clusterIP(i), (i+1)<<16))
					pool = append(pool, fmt.Sprintf("0x%08x : goto %s", (i+1)<<16, chainOf[i]))
				}
				for j := range spare {
					slot := len(services) + j
					pool = append(pool, fmt.Sprintf("0x%08x : goto pool4-%d", (slot+1)<<16, slot))
				}
				fmt.Fprintf(w, "\tmap slot-v4 { typeof ip daddr . meta l4proto . th dport : meta mark; elements = { %s }; }\n", strings.Join(slots, ", "))
				fmt.Fprintf(w, "\tmap pool-v4 { typeof meta mark : verdict; elements = { %s }; }\n", strings.Join(pool, ", "))
			}
			fmt.Fprintln(w, line)
			continue
		}
		fmt.Fprintln(w, line)
	}
	if table4 == "" {
		return errors.New("no table ip (or inet) in the listing")
	}
	// The elements, in batches of 200 services (2,000 endpoints: nft
	// 1.0.6 fails with ENOBUFS on 10,000 elements of a concatenated
	// interval map in one statement).
	if layout == "sharded" {
		var els []string
		for s := range shards {
			els = append(els, fmt.Sprintf("0.0.0.%d : jump shard4-%d", s, s))
		}
		fmt.Fprintf(w, "add element %s shards-v4 { %s }\n", table4, strings.Join(els, ", "))
	}
	for lo := 0; lo < len(services); lo += 200 {
		batch := services[lo:min(lo+200, len(services))]
		switch layout {
		case "shared":
			var els []string
			for _, i := range batch {
				els = append(els, epElems(i, e)...)
			}
			fmt.Fprintf(w, "add element %s eps-v4 { %s }\n", table4, strings.Join(els, ", "))
		}
	}
	if layout == "sharded" {
		// One statement per shard (all its services).
		byShard := map[int][]string{}
		for _, i := range services {
			byShard[shardOf(i)] = append(byShard[shardOf(i)], epElems(i, e)...)
		}
		for s := range shards {
			if els := byShard[s]; len(els) > 0 {
				fmt.Fprintf(w, "add element %s eps4-%d { %s }\n", table4, s, strings.Join(els, ", "))
			}
		}
	}
	return nil
}
