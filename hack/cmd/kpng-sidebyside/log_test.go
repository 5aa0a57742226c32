//go:build linux

package main

import (
	"regexp"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestMatchLog checks the patterns against lines the proxiers wrote (kpng
// -v=2 in nftables and iptables mode, kube-proxy v1.36.3 -v=2): a change
// of their wording must show here, not as a benchmark without breakdown.
func TestMatchLog(t *testing.T) {
	read := time.Date(2026, 11, 25, 12, 12, 18, 0, time.Local)
	for _, tc := range []struct {
		name   string
		re     *regexp.Regexp
		line   string
		want   map[string]string
		took   time.Duration
		logged time.Time
	}{{
		name: "kpng nft sync",
		re:   kpngNFTSync,
		line: `I1125 12:12:17.724746   16763 sink.go:178] "nftables table synced" table="kpng" full=true services=301 messages=714 objects=10257 duration="67.240298ms"`,
		want: map[string]string{"full": "true", "services": "301", "messages": "714", "took": "67.240298ms"},
		took: 67240298 * time.Nanosecond, logged: time.Date(2026, 11, 25, 12, 12, 17, 724746000, time.Local),
	}, {
		name: "kpng round",
		re:   kpngRound,
		line: `I1125 12:12:17.724800   16763 watcher.go:490] "Delivered state" dirtyServices=1 services=301 failed=false waited="12.5µs" duration="1.2ms"`,
		want: map[string]string{"dirty": "1", "failed": "false", "waited": "12.5µs", "took": "1.2ms"},
		took: 1200 * time.Microsecond, logged: time.Date(2026, 11, 25, 12, 12, 17, 724800000, time.Local),
	}, {
		name: "kube-proxy sync",
		re:   kubeProxySync,
		line: `I1125 12:12:26.499410   17645 proxier.go:1088] "SyncProxyRules complete" ipFamily="IPv4" elapsed="166.283479ms"`,
		want: map[string]string{"took": "166.283479ms"},
		took: 166283479 * time.Nanosecond, logged: time.Date(2026, 11, 25, 12, 12, 26, 499410000, time.Local),
	}, {
		name: "kpng iptables sync",
		re:   kpngIPTablesSync,
		line: `I1125 12:12:26.499410   17645 sink.go:99] "iptables chains synced" prefix="KPNG-1A2B3C4D" variant="nft" full=false services=10000 changed=1 chainsWritten=2 chainsDeleted=0 bytes=812 restores=1 duration="3.5ms"`,
		want: map[string]string{"took": "3.5ms"},
		took: 3500 * time.Microsecond, logged: time.Date(2026, 11, 25, 12, 12, 26, 499410000, time.Local),
	}} {
		t.Run(tc.name, func(t *testing.T) {
			ev, ok := matchLog(tc.re, tc.line, read)
			if !ok {
				t.Fatalf("no match: %s", tc.line)
			}
			if diff := cmp.Diff(tc.want, ev.fields); diff != "" {
				t.Errorf("fields (-want +got):\n%s", diff)
			}
			if ev.took != tc.took || !ev.logged.Equal(tc.logged) || !ev.at.Equal(read) {
				t.Errorf("took %s, logged %s, read %s; want %s, %s, %s", ev.took, ev.logged, ev.at, tc.took, tc.logged, read)
			}
		})
	}
	if _, ok := matchLog(kubeProxySync, `I1125 12:12:26.559906   17645 proxier.go:1088] "SyncProxyRules complete" ipFamily="IPv6" elapsed="60.395248ms"`, read); ok {
		t.Error("kube-proxy's IPv6 sync matched")
	}
}
