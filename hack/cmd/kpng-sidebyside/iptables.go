//go:build linux

package main

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// result is what one proxier showed with one variant.
type result struct {
	proxier, variant string
	cold             time.Duration
	coldDone         bool
	coldBytes        int64
	changeAPI        []time.Duration // API call → sync complete
	changeSync       []time.Duration // the sync's own duration (its log)
	changeBytes      []int64
	addAPI, delAPI   time.Duration
	latSmall, latBig time.Duration
	rssKiB, hwmKiB   int64
	rules            int
}

// runIPTables is --mode=iptables: for each variant, both proxiers on the
// small state (first packet), then, with the full state loaded, each on it
// (cold start, endpoint changes, a service added and deleted, first
// packet, memory), and the table.
func runIPTables(b *bench) error {
	cfg := b.cfg
	logf("loading %d services × %d endpoints", cfg.small, cfg.endpoints)
	if err := b.populate(0, cfg.small); err != nil {
		return err
	}
	results := map[string]*result{}
	order := []string{}
	for _, variant := range cfg.variants {
		for _, proxier := range []string{"kube-proxy", "kpng"} {
			key := proxier + "/" + variant
			order = append(order, key)
			r := &result{proxier: proxier, variant: variant}
			results[key] = r
			lat, err := b.smallPhase(proxier, variant)
			if err != nil {
				return fmt.Errorf("%s, %d services: %w", key, cfg.small, err)
			}
			r.latSmall = lat
		}
	}
	start := time.Now()
	logf("loading up to %d services × %d endpoints", cfg.services, cfg.endpoints)
	if err := b.populate(cfg.small, cfg.services); err != nil {
		return err
	}
	logf("loaded in %s", time.Since(start).Round(time.Second))
	for _, key := range order {
		r := results[key]
		if err := b.bigPhase(r); err != nil {
			return fmt.Errorf("%s, %d services: %w", key, cfg.services, err)
		}
	}
	printTable(cfg, order, results)
	return nil
}

// smallPhase runs the proxier on the small state in a fresh namespace
// and returns the median first-packet latency.
func (b *bench) smallPhase(proxier, variant string) (time.Duration, error) {
	n, err := b.newNode(proxier + "-" + variant + "-small")
	if err != nil {
		return 0, err
	}
	defer n.close()
	p, err := b.start(proxier, variant, n)
	if err != nil {
		return 0, err
	}
	defer p.stop()
	if _, err := p.waitSync(time.Now(), b.cfg.coldTimeout); err != nil {
		return 0, fmt.Errorf("first sync: %w", err)
	}
	lat, err := b.firstPacket(n, p)
	logf("%s %s, %d services: first packet %s", proxier, variant, b.cfg.small, lat)
	return lat, err
}

// bigPhase runs the proxier on the full state in a fresh namespace.
func (b *bench) bigPhase(r *result) error {
	n, err := b.newNode(r.proxier + "-" + r.variant + "-big")
	if err != nil {
		return err
	}
	defer n.close()
	p, err := b.start(r.proxier, r.variant, n)
	if err != nil {
		return err
	}
	defer p.stop()
	ev, err := p.waitSync(p.started, b.cfg.coldTimeout)
	if err != nil {
		logf("%s %s: no complete sync after %s: %v", r.proxier, r.variant, b.cfg.coldTimeout, err)
		r.cold = b.cfg.coldTimeout
		r.rssKiB, r.hwmKiB = memory(p.cmd.Process.Pid)
		return nil
	}
	r.cold, r.coldDone = ev.at.Sub(p.started), true
	r.coldBytes = n.restoreBytes(p.started, ev.at)
	logf("%s %s: cold start %s, %d bytes restored", r.proxier, r.variant, r.cold, r.coldBytes)
	r.rules = n.countRules(r.variant)
	if r.latBig, err = b.firstPacket(n, p); err != nil {
		return err
	}
	ctx := context.Background()
	// change returns the service and first endpoint of change i: each
	// service is changed twice, its first endpoint replaced, then back.
	change := func(i int) (svc int, addr netip.Addr) {
		svc = b.cfg.small + (i/2*7919)%(b.cfg.services-b.cfg.small)
		if i%2 == 1 {
			return svc, endpointIP(svc, 0)
		}
		return svc, netip.AddrFrom4([4]byte{10, 254, byte(i / 250), byte(1 + i%250)})
	}
	for i := range b.cfg.changes {
		// Let a minimum sync period run out, so that each change is
		// measured alone.
		time.Sleep(1500 * time.Millisecond)
		svc, addr := change(i)
		if err := b.checkChange(ctx, svc, addr); err != nil {
			return fmt.Errorf("endpoint change %d: %w", i, err)
		}
		alt := addr
		if i%2 == 1 {
			alt = netip.Addr{}
		}
		call := time.Now()
		if _, err := b.c.DiscoveryV1().EndpointSlices(ns).Update(ctx, b.slice(svc, alt), metav1.UpdateOptions{}); err != nil {
			return err
		}
		ev, err := p.waitSync(call, time.Minute)
		if err != nil {
			return fmt.Errorf("endpoint change %d: %w", i, err)
		}
		r.changeAPI = append(r.changeAPI, ev.at.Sub(call))
		r.changeSync = append(r.changeSync, ev.took)
		r.changeBytes = append(r.changeBytes, n.restoreBytes(call, ev.at))
	}
	// After an odd number of changes the last one is not reverted yet:
	// revert it (unmeasured), so that the next proxier starts from the
	// same state and its last change is a change too.
	if last := b.cfg.changes - 1; last%2 == 0 {
		time.Sleep(1500 * time.Millisecond)
		svc, _ := change(last)
		call := time.Now()
		if _, err := b.c.DiscoveryV1().EndpointSlices(ns).Update(ctx, b.slice(svc, netip.Addr{}), metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("revert endpoint change %d: %w", last, err)
		}
		if _, err := p.waitSync(call, time.Minute); err != nil {
			return fmt.Errorf("revert endpoint change %d: %w", last, err)
		}
	}
	time.Sleep(1500 * time.Millisecond)
	call := time.Now()
	if err := b.createService(ctx, b.cfg.services); err != nil {
		return err
	}
	ev, err = p.waitSync(call, time.Minute)
	if err != nil {
		return fmt.Errorf("service added: %w", err)
	}
	r.addAPI = ev.at.Sub(call)
	time.Sleep(1500 * time.Millisecond)
	call = time.Now()
	if err := b.c.CoreV1().Services(ns).Delete(ctx, svcName(b.cfg.services), metav1.DeleteOptions{}); err != nil {
		return err
	}
	if err := b.c.DiscoveryV1().EndpointSlices(ns).Delete(ctx, svcName(b.cfg.services)+"-1", metav1.DeleteOptions{}); err != nil {
		return err
	}
	ev, err = p.waitSync(call, time.Minute)
	if err != nil {
		return fmt.Errorf("service deleted: %w", err)
	}
	r.delAPI = ev.at.Sub(call)
	r.rssKiB, r.hwmKiB = memory(p.cmd.Process.Pid)
	logf("%s %s: change %v, add %s, delete %s, first packet %s, RSS %d MiB (peak %d MiB)", r.proxier, r.variant,
		median(r.changeAPI), r.addAPI, r.delAPI, r.latBig, r.rssKiB/1024, r.hwmKiB/1024)
	return nil
}

// shims returns a directory for the PATH of a proxier with variant:
// iptables, ip6tables and their -save are the variant's binaries,
// *-restore (plain and named by variant) a script recording the size of
// its input and when it ran in $KPNG_SHIM_LOG before running the real
// one.
func (b *bench) shims(variant string, n *node) (string, error) {
	dir := filepath.Join(b.cfg.shimDir, n.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	for _, fam := range []string{"iptables", "ip6tables"} {
		links := map[string]string{
			fam:           "/usr/sbin/" + fam + "-" + variant,
			fam + "-save": "/usr/sbin/" + fam + "-" + variant + "-save",
		}
		for name, target := range links {
			if err := os.Symlink(target, filepath.Join(dir, name)); err != nil && !os.IsExist(err) {
				return "", err
			}
		}
		real := "/usr/sbin/" + fam + "-" + variant + "-restore"
		script := "#!/bin/sh\n" +
			"in=$(mktemp)\ncat > \"$in\"\n" +
			"start=$(date +%s%N)\n\"" + real + "\" \"$@\" < \"$in\"\nrc=$?\n" +
			"echo \"$start $(date +%s%N) $(wc -c < \"$in\") $0\" >> \"$KPNG_SHIM_LOG\"\nrm -f \"$in\"\nexit $rc\n"
		for _, name := range []string{fam + "-restore", fam + "-" + variant + "-restore"} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
				return "", err
			}
		}
	}
	return dir, nil
}

// restoreBytes returns the bytes handed to iptables-restore by restores
// that started between from and to.
func (n *node) restoreBytes(from, to time.Time) int64 {
	data, err := os.ReadFile(n.shimLog)
	if err != nil {
		return 0
	}
	var total int64
	for line := range strings.SplitSeq(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		start, _ := strconv.ParseInt(f[0], 10, 64)
		size, _ := strconv.ParseInt(f[2], 10, 64)
		at := time.Unix(0, start)
		if !at.Before(from) && !at.After(to) {
			total += size
		}
	}
	return total
}

// countRules returns the number of rules in the namespace's IPv4 nat
// table.
func (n *node) countRules(variant string) int {
	out, err := exec.Command("ip", "netns", "exec", n.Name, "iptables-"+variant+"-save", "-t", "nat").Output()
	if err != nil {
		return 0
	}
	return strings.Count(string(out), "\n-A ")
}

// printTable prints the results as a markdown table.
func printTable(cfg config, order []string, results map[string]*result) {
	fmt.Printf("\n%d services × %d endpoints (one TCP port each), %s mode; first packet at %d and %d services; medians of %d endpoint changes.\n\n",
		cfg.services, cfg.endpoints, cfg.mode, cfg.small, cfg.services, cfg.changes)
	fmt.Println("| proxier | variant | cold start | restore input (cold) | nat rules | one endpoint change: API → synced | its sync | its restore input | service added / deleted: API → synced | first packet (" + strconv.Itoa(cfg.small) + " / " + strconv.Itoa(cfg.services) + " services) | RSS (peak) |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|")
	for _, key := range order {
		r := results[key]
		cold := r.cold.Round(time.Millisecond).String()
		if !r.coldDone {
			fmt.Printf("| %s | %s | not finished after %s | | | | | | | %s / – | %d MiB (%d MiB) |\n", r.proxier, r.variant, cold, r.latSmall.Round(time.Microsecond), r.rssKiB/1024, r.hwmKiB/1024)
			continue
		}
		fmt.Printf("| %s | %s | %s | %.1f MB | %d | %s | %s | %s | %s / %s | %s / %s | %d MiB (%d MiB) |\n",
			r.proxier, r.variant, cold, float64(r.coldBytes)/1e6, r.rules,
			median(r.changeAPI).Round(time.Millisecond), median(r.changeSync).Round(time.Millisecond), bytesText(medianInt(r.changeBytes)),
			r.addAPI.Round(time.Millisecond), r.delAPI.Round(time.Millisecond),
			r.latSmall.Round(time.Microsecond), r.latBig.Round(time.Microsecond), r.rssKiB/1024, r.hwmKiB/1024)
	}
}

// medianInt returns the median of xs.
func medianInt(xs []int64) int64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// bytesText writes a byte count readably.
func bytesText(n int64) string {
	switch {
	case n >= 1e6:
		return fmt.Sprintf("%.1f MB", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1f kB", float64(n)/1e3)
	}
	return fmt.Sprintf("%d B", n)
}
