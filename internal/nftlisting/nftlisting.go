// Package nftlisting reads what tests and benchmarks need from `nft list
// table` of kpng's nft tables (backends/nft): how many service ports they
// serve, whatever the layout of each one. A listing may hold kpng's
// `table ip` (IPv4), its `table ip6` (IPv6), both one after the other, or
// the one `table inet` of a kpng before the table per family.
package nftlisting

import "strings"

// ServicePortsV4 returns the number of IPv4 service ports the listing of
// kpng's tables serves (those of its table ip, or of an earlier kpng's
// table inet): the goto elements of the map service-ips-v4 to
// chains other than the shards' (the ports with a chain of their own) and
// the distinct keys (address . protocol . port) of the shard maps of IPv4
// (the plain ones; in the layouts that had them, their goto elements to
// their shard's chain are not counted twice; their keys in the shards'
// sets, since, are not counted either).
func ServicePortsV4(listing string) int {
	n, keys, inMap := 0, map[string]bool{}, ""
	for _, line := range strings.Split(listing, "\n") {
		if m, ok := strings.CutPrefix(line, "\tmap "); ok {
			inMap = strings.TrimSuffix(m, " {")
			continue
		}
		if strings.HasPrefix(line, "\t") && !strings.HasPrefix(line, "\t\t") && line != "\t}" {
			inMap = "" // a set or chain
			continue
		}
		switch {
		case inMap == "service-ips-v4":
			n += strings.Count(line, " : goto ") - strings.Count(line, " : goto shard4-")
		case strings.HasPrefix(inMap, "shard-endpoints-v4-"):
			line = strings.TrimSpace(line)
			if strings.HasPrefix(line, "typeof ") {
				continue
			}
			line = strings.TrimPrefix(line, "elements = { ")
			for _, el := range strings.Split(line, ", ") {
				if f := strings.SplitN(strings.TrimSpace(el), " . ", 4); len(f) == 4 && strings.Contains(f[3], " : ") {
					keys[strings.Join(f[:3], " . ")] = true
				}
			}
		}
	}
	return n + len(keys)
}
