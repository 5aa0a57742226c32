//go:build linux

package main

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sigs.k8s.io/kpng/internal/netns"
)

// nftResult is what one proxier showed in nftables mode.
type nftResult struct {
	proxier     string
	cold        time.Duration
	coldDone    bool
	firstPacket time.Duration
	// firstPacketMixed is the first packet probed in turn with the other
	// proxiers' namespaces, once all stopped (interleavedFirstPacket; 0:
	// not measured), node the proxier's namespace, kept for it.
	firstPacketMixed time.Duration
	node             *node
	changes          []nftChange
	// lost counts the changes whose element was not seen in time.
	lost           int
	rssKiB, hwmKiB int64
}

// nftChange is the path of one endpoint change, as absolute times (zero:
// not known).
type nftChange struct {
	// call is when the EndpointSlice update started, returned when it
	// returned, watched when the benchmark's own watch received it, seen
	// when the monitor read the commit adding the new endpoint's element.
	call, returned, watched, seen time.Time
	// syncStart and syncEnd bound the proxier's sync that applied it,
	// from its log line (klog time of the line, minus the duration it
	// gives).
	syncStart, syncEnd time.Time
	// kpng only, from its round's log line: event is when the watcher
	// received the first change of the round (an informer event),
	// roundStart when the round began after the coalescing; dirty is the
	// round's number of changed services, messages the transaction's
	// netlink messages.
	event, roundStart time.Time
	dirty, messages   int
	// waitCPU is the time the proxier's threads spent runnable but
	// waiting for a CPU between call and seen, summed over its threads.
	waitCPU time.Duration
}

// The endpoint port of every slice (slice).
const endpointPort = 8080

// runNFTables is --mode=nftables: the full state loaded once, then each
// proxier in turn on it (cold start, a first-packet check, endpoint
// changes timed to the kernel), and the tables.
func runNFTables(b *bench) error {
	cfg := b.cfg
	start := time.Now()
	logf("loading %d services × %d endpoints", cfg.services, cfg.endpoints)
	if err := b.populate(0, cfg.services); err != nil {
		return err
	}
	logf("loaded in %s", time.Since(start).Round(time.Second))
	var results []*nftResult
	for _, proxier := range cfg.proxiers {
		r, err := b.nftPhase(proxier)
		if err != nil {
			return fmt.Errorf("%s, %d services: %w", proxier, cfg.services, err)
		}
		results = append(results, r)
	}
	if err := b.interleavedFirstPacket(results); err != nil {
		logf("interleaved first packet: %v (not measured)", err)
	}
	for _, r := range results {
		if r.node != nil {
			r.node.close()
		}
	}
	printNFTTables(cfg, results)
	return nil
}

// interleavedFirstPacket probes the proxiers' namespaces in turn (A B A B
// …, the order rotated each round), once every proxier stopped (their
// rules stay in their namespaces) and the machine is quiet: the first
// packet through each proxier's rules at the same moments. The
// first-packet column probes each proxier alone after its own sync, one
// after the other, and the machine's state from one moment to the next
// differed more than the rules (76–179 µs for kpng, 95–159 µs for
// kube-proxy over five sittings, docs/benchmarks.md).
//
// With --swap-rules and two proxiers, it then saves each namespace's
// ruleset (and, NAME.state, its sysctls, sockets and conntrack count) to
// the log directory, loads each into the other namespace and probes
// again: whether a difference follows the rules or the namespace.
func (b *bench) interleavedFirstPacket(results []*nftResult) error {
	var kept []*nftResult
	for _, r := range results {
		if r.node != nil {
			kept = append(kept, r)
		}
	}
	if len(kept) < 2 {
		return nil
	}
	waited, _ := waitIdle(0, time.Minute)
	logf("interleaved first packet: the machine quiet after %s; probing %d proxiers in turn", waited.Round(10*time.Millisecond), len(kept))
	meds, err := b.probeInTurn(kept)
	if err != nil {
		return err
	}
	for i, r := range kept {
		r.firstPacketMixed = meds[i]
	}
	if !b.cfg.swapRules || len(kept) != 2 {
		return nil
	}
	files := make([]string, len(kept))
	for i, r := range kept {
		files[i] = filepath.Join(b.cfg.logDir, r.node.Name+".nft")
		if err := dumpRules(r.node.Name, files[i]); err != nil {
			return err
		}
		dumpState(r.node.Name, filepath.Join(b.cfg.logDir, r.node.Name+".state"))
	}
	for i, r := range kept {
		if err := loadRules(r.node.Name, files[1-i]); err != nil {
			return err
		}
	}
	waited, _ = waitIdle(0, time.Minute)
	logf("interleaved first packet, rules swapped: the machine quiet after %s", waited.Round(10*time.Millisecond))
	swapped, err := b.probeInTurn(kept)
	if err != nil {
		return err
	}
	for i, r := range kept {
		logf("first packet, interleaved: %s's namespace with its own rules %s, with %s's rules %s",
			r.proxier, meds[i].Round(100*time.Nanosecond), kept[1-i].proxier, swapped[i].Round(100*time.Nanosecond))
	}
	return nil
}

// probeInTurn times cfg.probes connects from each namespace of kept in
// turn (the order rotated each round) and returns each one's median.
func (b *bench) probeInTurn(kept []*nftResult) ([]time.Duration, error) {
	probes := b.probeServices()
	times := make([][]time.Duration, len(kept))
	for k := range b.cfg.probes {
		b.mu.Lock()
		ip := b.clusterIPs[probes[k%len(probes)]]
		b.mu.Unlock()
		for j := range kept {
			i := (j + k) % len(kept)
			d, err := netns.RunIn(kept[i].node.Path, func() (time.Duration, error) { return connectTime(ip) })
			if err != nil {
				return nil, fmt.Errorf("%s: %w", kept[i].proxier, err)
			}
			times[i] = append(times[i], d)
		}
	}
	meds := make([]time.Duration, len(kept))
	for i := range kept {
		meds[i] = median(times[i])
	}
	return meds, nil
}

// dumpRules writes the ruleset of the network namespace ns to file.
func dumpRules(ns, file string) error {
	out, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "ruleset").Output()
	if err != nil {
		return fmt.Errorf("nft list ruleset in %s: %w", ns, err)
	}
	if err := os.WriteFile(file, out, 0o644); err != nil {
		return fmt.Errorf("ruleset of %s: %w", ns, err)
	}
	return nil
}

// dumpState writes what else than the rules may tell two namespaces
// apart to file: their sysctls, socket summary and conntrack count (each
// as far as it can be read; a failure is written in its place).
func dumpState(ns, file string) {
	var b strings.Builder
	for _, c := range [][]string{{"sysctl", "-a"}, {"ss", "-s"}, {"cat", "/proc/sys/net/netfilter/nf_conntrack_count"}} {
		out, err := exec.Command("ip", append([]string{"netns", "exec", ns}, c...)...).CombinedOutput()
		fmt.Fprintf(&b, "## %s (err %v)\n%s\n", strings.Join(c, " "), err, out)
	}
	if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
		logf("state of %s: %v", ns, err)
	}
}

// loadRules replaces the ruleset of the network namespace ns with the
// one in file, in one transaction.
func loadRules(ns, file string) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("ruleset for %s: %w", ns, err)
	}
	cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader("flush ruleset\n" + string(data))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft -f %s in %s: %w: %s", file, ns, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// nftPhase runs proxier on the full state in a fresh namespace.
func (b *bench) nftPhase(proxier string) (*nftResult, error) {
	cfg := b.cfg
	r := &nftResult{proxier: proxier}
	n, err := b.newNode(proxier + "-nft")
	if err != nil {
		return nil, err
	}
	kept := false
	defer func() {
		if !kept {
			n.close()
		}
	}()
	p, err := b.start(proxier, "", n)
	if err != nil {
		return nil, err
	}
	defer p.stop()
	ev, err := p.waitSync(p.started, cfg.coldTimeout)
	if err != nil {
		logf("%s: no complete sync after %s: %v", proxier, cfg.coldTimeout, err)
		r.rssKiB, r.hwmKiB = memory(p.cmd.Process.Pid)
		return r, nil
	}
	r.cold, r.coldDone = ev.at.Sub(p.started), true
	logf("%s: cold start %s", proxier, r.cold.Round(time.Millisecond))
	// The rules work: connections to cluster IPs reach the endpoints.
	if r.firstPacket, err = b.firstPacket(n, p); err != nil {
		return nil, err
	}
	mon, err := newElementMonitor(n.Path)
	if err != nil {
		return nil, err
	}
	defer func() { mon.close() }()
	sw, err := newSliceWatch(b.c)
	if err != nil {
		return nil, err
	}
	defer sw.close()
	ctx := context.Background()
	changes := cfg.changes
	if proxier == "kube-proxy" && cfg.kubeProxyChanges >= 0 {
		changes = cfg.kubeProxyChanges
	}
	// change returns the service and first endpoint of change i: each
	// service is changed twice, its first endpoint replaced by an address
	// never used before, then back.
	change := func(i int) (svc int, addr netip.Addr) {
		svc = (i / 2 * 7919) % cfg.services
		if i%2 == 1 {
			return svc, endpointIP(svc, 0)
		}
		return svc, netip.AddrFrom4([4]byte{10, 254, byte(i / 2 / 250), byte(1 + i/2%250)})
	}
	for i := range changes {
		time.Sleep(cfg.quiet)
		svc, addr := change(i)
		if err := b.checkChange(ctx, svc, addr); err != nil {
			return nil, fmt.Errorf("endpoint change %d: %w", i, err)
		}
		slice := b.slice(svc, addr)
		want := endpointValue(addr, endpointPort)
		mon.drain()
		waitBefore := runQueueWait(p.cmd.Process.Pid)
		c := nftChange{call: time.Now()}
		updated, err := b.c.DiscoveryV1().EndpointSlices(ns).Update(ctx, slice, metav1.UpdateOptions{})
		if err != nil {
			return nil, fmt.Errorf("endpoint change %d: %w", i, err)
		}
		c.returned = time.Now()
		if c.seen, err = mon.wait(want, c.call, cfg.changeTimeout); err != nil {
			logf("%s: endpoint change %d (%s/%s → %s) not seen: %v", proxier, i, ns, svcName(svc), addr, err)
			r.lost++
			mon.close()
			if mon, err = newElementMonitor(n.Path); err != nil {
				return nil, err
			}
			continue
		}
		c.waitCPU = runQueueWait(p.cmd.Process.Pid) - waitBefore
		if c.watched, err = sw.wait(updated.Name, updated.ResourceVersion, cfg.changeTimeout); err != nil {
			logf("%s: endpoint change %d: %v", proxier, i, err)
		}
		if err := c.fromLogs(p, cfg.changeTimeout); err != nil {
			logf("%s: endpoint change %d: %v", proxier, i, err)
		}
		r.changes = append(r.changes, c)
		if (i+1)%50 == 0 || i+1 == changes {
			logf("%s: %d changes, API call → element in the kernel: median %s, last %s", proxier, i+1,
				median(r.seenTimes()).Round(10*time.Microsecond), c.seen.Sub(c.call).Round(10*time.Microsecond))
		}
	}
	// After an odd number of changes the last one is not reverted yet:
	// revert it (unmeasured), so that the next proxier starts from the
	// same state and its last change is a change too.
	if last := changes - 1; last%2 == 0 {
		time.Sleep(cfg.quiet)
		svc, addr := change(last + 1)
		mon.drain()
		call := time.Now()
		if _, err := b.c.DiscoveryV1().EndpointSlices(ns).Update(ctx, b.slice(svc, addr), metav1.UpdateOptions{}); err != nil {
			return nil, fmt.Errorf("revert endpoint change %d: %w", last, err)
		}
		if _, err := mon.wait(endpointValue(addr, endpointPort), call, cfg.changeTimeout); err != nil {
			logf("%s: the revert of endpoint change %d not seen: %v", proxier, last, err)
		}
	}
	r.rssKiB, r.hwmKiB = memory(p.cmd.Process.Pid)
	if err := writeChanges(filepath.Join(cfg.logDir, n.Name+"-changes.csv"), r.changes); err != nil {
		logf("%s: %v", proxier, err)
	}
	logf("%s: cold start %s, change median %s p99 %s (%d lost), RSS %d MiB (peak %d MiB)", proxier,
		r.cold.Round(time.Millisecond), median(r.seenTimes()), percentile(r.seenTimes(), 99), r.lost, r.rssKiB/1024, r.hwmKiB/1024)
	// The namespace and its rules stay for interleavedFirstPacket.
	r.node, kept = n, true
	return r, nil
}

// fromLogs fills in the proxier's sync (and, for kpng, round) of the
// change from its log: the first of each that started after the API call
// (syncs are serialized, and the change's event comes after the call).
func (c *nftChange) fromLogs(p *proc, timeout time.Duration) error {
	sync, err := p.waitStarted(p.syncs, "complete sync", c.call, timeout)
	if err != nil {
		return err
	}
	c.syncEnd, c.syncStart = sync.logged, sync.logged.Add(-sync.took)
	c.messages, _ = strconv.Atoi(sync.fields["messages"])
	if p.rounds == nil {
		return nil
	}
	round, err := p.waitStarted(p.rounds, "round", c.call, timeout)
	if err != nil {
		return err
	}
	waited, _ := time.ParseDuration(round.fields["waited"])
	c.roundStart = round.logged.Add(-round.took)
	c.event = c.roundStart.Add(-waited)
	c.dirty, _ = strconv.Atoi(round.fields["dirty"])
	return nil
}

// waitStarted returns the first event of ch that began (its logged time
// minus its duration) after since.
func (p *proc) waitStarted(ch chan logEvent, what string, since time.Time, timeout time.Duration) (logEvent, error) {
	deadline := time.Now().Add(timeout)
	for {
		ev, err := p.wait(ch, what, since, time.Until(deadline))
		if err != nil {
			return ev, err
		}
		if !ev.logged.IsZero() && !ev.logged.Add(-ev.took).Before(since) {
			return ev, nil
		}
	}
}

// seenTimes returns, for each change, the API call → element seen time.
func (r *nftResult) seenTimes() []time.Duration {
	return r.segment(func(c nftChange) (time.Time, time.Time) { return c.call, c.seen })
}

// segment returns the durations between two points of each change where
// both are known.
func (r *nftResult) segment(points func(nftChange) (from, to time.Time)) []time.Duration {
	var out []time.Duration
	for _, c := range r.changes {
		if from, to := points(c); !from.IsZero() && !to.IsZero() {
			out = append(out, to.Sub(from))
		}
	}
	return out
}

// percentile returns the p-th percentile of ds (nearest rank; 0 for
// none).
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	k := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[min(max(k, 0), len(s)-1)]
}

// writeChanges writes each change's points as microseconds after its
// API call, in CSV (empty: not known).
func writeChanges(path string, changes []nftChange) error {
	var b strings.Builder
	b.WriteString("call_unix_us,returned_us,watched_us,event_us,round_start_us,sync_start_us,sync_end_us,seen_us,dirty,messages,wait_cpu_us\n")
	rel := func(c nftChange, t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return strconv.FormatInt(t.Sub(c.call).Microseconds(), 10)
	}
	for _, c := range changes {
		fmt.Fprintf(&b, "%d,%s,%s,%s,%s,%s,%s,%s,%d,%d,%d\n", c.call.UnixMicro(), rel(c, c.returned), rel(c, c.watched), rel(c, c.event),
			rel(c, c.roundStart), rel(c, c.syncStart), rel(c, c.syncEnd), rel(c, c.seen), c.dirty, c.messages, c.waitCPU.Microseconds())
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("write the changes: %w", err)
	}
	return nil
}

// ms writes d in milliseconds with two decimals.
func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/1e6) }

// printNFTTables prints the results as markdown tables: both proxiers,
// then kpng's breakdown and kube-proxy's.
func printNFTTables(cfg config, results []*nftResult) {
	fmt.Printf("\n%d services × %d endpoints (one TCP port each), nftables mode; endpoint changes each after %s without changes.\n\n",
		cfg.services, cfg.endpoints, cfg.quiet)
	fmt.Println("| proxier | cold start | changes in the kernel | API call → element in the kernel: median | p99 | API call returned (median) | API call → sync started (median) | the sync (median) | first packet | first packet, interleaved | RSS (peak) |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range results {
		if !r.coldDone {
			fmt.Printf("| %s | not finished after %s | | | | | | | | | %d MiB (%d MiB) |\n", r.proxier, cfg.coldTimeout, r.rssKiB/1024, r.hwmKiB/1024)
			continue
		}
		seen := r.seenTimes()
		returned := r.segment(func(c nftChange) (time.Time, time.Time) { return c.call, c.returned })
		toSync := r.segment(func(c nftChange) (time.Time, time.Time) { return c.call, c.syncStart })
		sync := r.segment(func(c nftChange) (time.Time, time.Time) { return c.syncStart, c.syncEnd })
		mixed := "–"
		if r.firstPacketMixed > 0 {
			mixed = r.firstPacketMixed.Round(time.Microsecond).String()
		}
		fmt.Printf("| %s | %s | %d of %d | %s | %s | %s | %s | %s | %s | %s | %d MiB (%d MiB) |\n", r.proxier,
			r.cold.Round(time.Millisecond), len(r.changes), len(r.changes)+r.lost, ms(median(seen)), ms(percentile(seen, 99)),
			ms(median(returned)), ms(median(toSync)), ms(median(sync)), r.firstPacket.Round(time.Microsecond), mixed, r.rssKiB/1024, r.hwmKiB/1024)
	}
	for _, r := range results {
		if !r.coldDone || len(r.changes) == 0 {
			continue
		}
		total := median(r.seenTimes())
		type row struct {
			name     string
			from, to func(nftChange) time.Time
		}
		var rows []row
		call := func(c nftChange) time.Time { return c.call }
		watched := func(c nftChange) time.Time { return c.watched }
		seen := func(c nftChange) time.Time { return c.seen }
		syncStart := func(c nftChange) time.Time { return c.syncStart }
		syncEnd := func(c nftChange) time.Time { return c.syncEnd }
		if r.proxier == "kpng" {
			event := func(c nftChange) time.Time { return c.event }
			round := func(c nftChange) time.Time { return c.roundStart }
			rows = []row{
				{"API call → watch event in kpng's watcher (API server, etcd, watch, informer)", call, event},
				{"watch event → round starts (coalescing: MinSyncInterval after a round, none after a quiet period)", event, round},
				{"round starts → sink's Sync (snapshot, Feeder, Update)", round, syncStart},
				{"sink's Sync: transaction built, sent, acknowledged", syncStart, syncEnd},
				{"Sync returned → element seen by the monitor (negative: seen first)", syncEnd, seen},
				{"API call → element seen", call, seen},
				{"(for comparison) API call → the same event at the benchmark's own watch: the API server alone", call, watched},
				{"(for comparison) the benchmark's watch → kpng's watcher (negative: kpng first)", watched, event},
			}
		} else {
			rows = []row{
				{"API call → sync starts (watch, minimum sync period)", call, syncStart},
				{"sync starts → element seen (rules computed, nft run, commit)", syncStart, seen},
				{"element seen → sync logged complete", seen, syncEnd},
				{"API call → element seen", call, seen},
				{"(for comparison) API call → the event at the benchmark's own watch: the API server alone", call, watched},
			}
		}
		fmt.Printf("\n%s, %d changes: breakdown (share: of the median API call → element seen, %s)\n\n", r.proxier, len(r.changes), ms(total))
		fmt.Println("| segment | median | p99 | share |")
		fmt.Println("|---|---|---|---|")
		for _, row := range rows {
			ds := r.segment(func(c nftChange) (time.Time, time.Time) { return row.from(c), row.to(c) })
			share := ""
			if total > 0 && len(ds) > 0 {
				share = fmt.Sprintf("%.0f%%", 100*float64(median(ds))/float64(total))
			}
			fmt.Printf("| %s | %s | %s | %s |\n", row.name, ms(median(ds)), ms(percentile(ds, 99)), share)
		}
		var waits []time.Duration
		for _, c := range r.changes {
			waits = append(waits, c.waitCPU)
		}
		fmt.Printf("| (for comparison) %s's threads runnable but waiting for a CPU, API call → element seen (summed over its threads) | %s | %s | |\n",
			r.proxier, ms(median(waits)), ms(percentile(waits, 99)))
		if r.proxier == "kpng" {
			var coalesced, single int
			for _, c := range r.changes {
				if !c.event.IsZero() && c.roundStart.Sub(c.event) > time.Millisecond {
					coalesced++
				}
				if c.dirty == 1 {
					single++
				}
			}
			fmt.Printf("\nRounds of exactly the changed service: %d of %d; rounds whose change waited over 1 ms for the round: %d.\n", single, len(r.changes), coalesced)
		}
	}
}

// runQueueWait returns the time the threads of process pid have spent
// waiting on a run queue (the second field of each thread's
// /proc/<pid>/task/<tid>/schedstat), summed; 0 when unknown.
func runQueueWait(pid int) time.Duration {
	files, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	var total time.Duration
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue // the thread ended
		}
		if fields := strings.Fields(string(data)); len(fields) >= 2 {
			ns, _ := strconv.ParseInt(fields[1], 10, 64)
			total += time.Duration(ns)
		}
	}
	return total
}
