//go:build linux

package nft

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"sigs.k8s.io/kpng/backends/nfmonitor"
	"sigs.k8s.io/kpng/internal/churn"
	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

// noMonitor runs the monitor's tests with the monitor off
// (Config.NoMonitor): they must then fail (`go test -run Monitor -args
// -nomonitor`), showing that the repairs they see are the monitor's.
var noMonitor = flag.Bool("nomonitor", false, "run the monitor's kernel tests with Config.NoMonitor (they must fail)")

// monitoredSink starts a sink programming a state of services with
// service and endpoint chains in ns, whose periodic check (an hour) cannot
// run during a test: a repair can only be the monitor's. Its results go
// to the channel returned, after its first sync's.
func monitoredSink(t *testing.T, ns *netns.NS, name string) (*Sink, chan SyncResult, []*model.ServiceEndpoints, Options) {
	t.Helper()
	return monitoredSinkWith(t, ns, name, func(*Config) {})
}

// monitoredSinkWith is monitoredSink with the sink's Config changed by
// configure before New.
func monitoredSinkWith(t *testing.T, ns *netns.NS, name string, configure func(*Config)) (*Sink, chan SyncResult, []*model.ServiceEndpoints, Options) {
	t.Helper()
	gen := churn.New(7, churnPools)
	for len(gen.State()) < 10 {
		gen.Round()
	}
	state := gen.State()
	opts := Options{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}}
	results := make(chan SyncResult, 1000)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	cfg := Config{ServiceProxyName: name, Options: opts, Conn: connIn(t, ns), Conntrack: conntrackIn(t, ns),
		CheckPeriod: time.Hour, NoMonitor: *noMonitor, AfterSync: func(r SyncResult) { results <- r }}
	configure(&cfg)
	s, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	f := localsink.NewFeeder(s, localsink.FeederOptions{NoRetry: true})
	t.Cleanup(f.Close)
	f.SetAll(state)
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if r := <-results; r.Err != nil {
		t.Fatal(r.Err)
	}
	return s, results, state, opts
}

// TestKernelMonitorRepairs changes, with nft, each kind of object of a
// running sink's table (the table deleted or flushed, the ruleset
// flushed, a base chain deleted, a fixed, service or endpoint chain
// flushed, a rule added, a map element deleted), one after the other.
// Each change must be repaired before the periodic check could have (it
// runs every hour): by the monitor, whose repair must come from that
// change (made by the nft process, not by the sink's own transactions),
// and leave the table as a fresh sink's. The time each took is logged
// (the bound is 200 ms; docs/reliability.md has the figures). It
// fails with the monitor off (-args -nomonitor).
func TestKernelMonitorRepairs(t *testing.T) {
	netns.RequirePrivileged(t)
	netns.RequireCommands(t, "nft")
	for _, tc := range []struct {
		what string
		// script is the change, given the sink's table and a service
		// chain and an endpoint chain of it; change is what the repair
		// must name.
		script, change func(table, svc, ep string) string
	}{
		{"delete the table",
			func(tb, _, _ string) string { return "delete table ip " + tb },
			func(tb, _, _ string) string { return "delete table ip " + tb }},
		{"flush the table",
			func(tb, _, _ string) string { return "flush table ip " + tb },
			func(tb, _, _ string) string { return "delete rule ip " + tb }},
		{"flush the ruleset",
			func(_, _, _ string) string { return "flush ruleset" },
			func(tb, _, _ string) string { return "delete rule ip " + tb }},
		{"delete a base chain",
			func(tb, _, _ string) string { return "delete chain ip " + tb + " " + chainNATOutput },
			func(tb, _, _ string) string { return "delete chain ip " + tb + " " + chainNATOutput }},
		{"flush a base chain",
			func(tb, _, _ string) string { return "flush chain ip " + tb + " " + chainNATPrerouting },
			func(tb, _, _ string) string { return "delete rule ip " + tb + " " + chainNATPrerouting }},
		{"flush the lookup chain",
			func(tb, _, _ string) string { return "flush chain ip " + tb + " " + chainServices },
			func(tb, _, _ string) string { return "delete rule ip " + tb + " " + chainServices }},
		{"flush a service chain",
			func(tb, svc, _ string) string { return "flush chain ip " + tb + " " + svc },
			func(tb, svc, _ string) string { return "delete rule ip " + tb + " " + svc }},
		{"flush an endpoint chain",
			func(tb, _, ep string) string { return "flush chain ip " + tb + " " + ep },
			func(tb, _, ep string) string { return "delete rule ip " + tb + " " + ep }},
		{"add a rule",
			func(tb, _, _ string) string { return "add rule ip " + tb + " " + chainNATPrerouting + " accept" },
			func(tb, _, _ string) string { return "add rule ip " + tb + " " + chainNATPrerouting }},
		{"flush a map",
			func(tb, _, _ string) string { return "flush map ip " + tb + " " + mapServices(ipv4) },
			func(tb, _, _ string) string { return "delete element ip " + tb }},
		{"delete the ip6 table",
			func(tb, _, _ string) string { return "delete table ip6 " + tb },
			func(tb, _, _ string) string { return "delete table ip6 " + tb }},
		{"flush the ip6 lookup chain",
			func(tb, _, _ string) string { return "flush chain ip6 " + tb + " " + chainServices },
			func(tb, _, _ string) string { return "delete rule ip6 " + tb + " " + chainServices }},
	} {
		t.Run(tc.what, func(t *testing.T) {
			// A sink of its own: a repair of the previous change does
			// not space this one out (the backoff of a burst).
			ns := netns.New(t, "monitor")
			const name = "monitor"
			table := TableName(name)
			s, results, state, opts := monitoredSink(t, ns, name)
			newConn := connIn(t, ns)
			want := freshKernelTable(t, name, opts, state)
			var svcChain, epChain string
			for _, c := range s.tracker.ChainNames() {
				switch {
				case svcChain == "" && strings.HasPrefix(c, "svc4-"):
					svcChain = c
				case epChain == "" && strings.HasPrefix(c, "ep4-"):
					epChain = c
				}
			}
			if svcChain == "" || epChain == "" {
				t.Fatalf("the state has no service chain (%q) or endpoint chain (%q) to change", svcChain, epChain)
			}
			script, change := tc.script(table, svcChain, epChain), tc.change(table, svcChain, epChain)
			if _, stderr, err := ns.Exec([]byte(script+"\n"), "nft", "-f", "-"); err != nil {
				t.Fatalf("nft -f: %v: %s", err, stderr)
			}
			start := time.Now()
			select {
			case r := <-results:
				if r.Err != nil || r.Repair == "" || !r.Full {
					t.Fatalf("after %s: %+v, want a successful full repair", tc.what, r)
				}
				// A repair of the sink's own transactions would name its
				// process (nft.test), not nft.
				if !strings.Contains(r.Repair, change) || !strings.Contains(r.Repair, "(by nft, pid") {
					t.Fatalf("after %s: repaired because %q, want a change %q by nft", tc.what, r.Repair, change)
				}
				t.Logf("%s: repaired in %v (%s)", tc.what, time.Since(start).Round(time.Millisecond), r.Repair)
			case <-time.After(10 * time.Second):
				t.Fatalf("after %s: no repair before the periodic check (every hour) could have made one (waited 10 s)", tc.what)
			}
			if diff := diffKernelTables(want, mustReadKernelTable(t, newConn, table)); diff != "" {
				t.Fatalf("after %s and the repair (-fresh +sink):\n%s", tc.what, diff)
			}
		})
	}
}

// TestKernelMonitorFlushLoop flushes the ruleset in a loop, as a
// misbehaving firewall would, for three seconds: the sink must not spin,
// rewriting its table after each flush, but space its repairs out
// (nfmonitor's backoff), and have its table back once the loop stops.
// The bound on the repairs is the number that fit in the loop with gaps
// doubling from nfmonitor.DefaultMinGap, the one after it, and 3 more
// (about 10; at a fixed gap of DefaultMinGap there would be 30, without
// a gap one per flush).
func TestKernelMonitorFlushLoop(t *testing.T) {
	netns.RequirePrivileged(t)
	netns.RequireCommands(t, "nft", "ip", "sh")
	ns := netns.New(t, "flushloop")
	const name = "flushloop"
	table := TableName(name)
	_, results, state, opts := monitoredSink(t, ns, name)
	newConn := connIn(t, ns)
	want := freshKernelTable(t, name, opts, state)

	const loop = 3 * time.Second
	cmd := exec.Command("ip", "netns", "exec", ns.Name, "sh", "-c",
		fmt.Sprintf("end=$(($(date +%%s%%N) + %d)); n=0; while [ $(date +%%s%%N) -lt $end ]; do nft flush ruleset; n=$((n+1)); done; echo $n", loop.Nanoseconds()))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the flush loop: %v", err)
	}
	var flushes int
	fmt.Sscan(strings.TrimSpace(string(out)), &flushes)
	// Repairs during the loop, then the one after it.
	repairs := 0
	for done := false; !done; {
		select {
		case r := <-results:
			if r.Repair == "" {
				t.Fatalf("a sync that is not a repair: %+v", r)
			}
			repairs++
		default:
			done = true
		}
	}
	// The last flush is repaired once the gap ran out.
	deadline := time.After(2 * nfmonitor.DefaultMaxGap)
	for diffKernelTables(want, mustReadKernelTable(t, newConn, table)) != "" {
		select {
		case <-results:
			repairs++
		case <-deadline:
			t.Fatalf("the table is not repaired %v after the loop", 2*nfmonitor.DefaultMaxGap)
		}
	}
	bound := backoffRepairs(loop) + 3
	t.Logf("%d flushes in %v: %d repairs (bound %d)", flushes, loop, repairs, bound)
	if flushes < 2*bound {
		t.Skipf("only %d flushes in %v: too few to tell backoff from none", flushes, loop)
	}
	if repairs > bound {
		t.Errorf("%d repairs for %d flushes in %v: more than %d, the repairs are not spaced out", repairs, flushes, loop, bound)
	}
	if repairs == 0 {
		t.Errorf("no repair for %d flushes", flushes)
	}
}

// backoffRepairs returns how many repairs fit in d with gaps doubling
// from nfmonitor.DefaultMinGap up to nfmonitor.DefaultMaxGap, plus the
// one after d.
func backoffRepairs(d time.Duration) int {
	n, gap := 1, time.Duration(0)
	for at := time.Duration(0); at <= d; at += gap {
		n++
		gap = min(max(2*gap, nfmonitor.DefaultMinGap), nfmonitor.DefaultMaxGap)
	}
	return n
}

// bulkRules is the number of rules the transaction of
// TestKernelMonitorLostNotifications adds to a table of its own: a
// notification each, some 400 KiB of them, for a receive buffer of some
// 4 KiB.
const bulkRules = 3000

// bulkScript returns nft commands adding table inet name with a chain of
// rules rules.
func bulkScript(name string, rules int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "add table inet %s\nadd chain inet %s c\n", name, name)
	for i := range rules {
		fmt.Fprintf(&b, "add rule inet %s c ip daddr 10.%d.%d.%d counter accept\n", name, i>>16&0xff, i>>8&0xff, i&0xff)
	}
	return b.String()
}

// TestKernelMonitorLostNotifications gives a monitored sink's monitor a
// tiny receive buffer (the kernel's minimum, some 4 KiB), then commits
// with nft one transaction that flushes a service chain of the sink's
// table and adds bulkRules rules to a table of its own: their
// notifications overflow the buffer (ENOBUFS). The periodic check runs
// every hour: the repair that must follow within 10 s is the monitor's,
// and it must say that notifications were lost: either the check of every
// chain they call for found the flushed chain (the flush's notifications
// or the transaction's end were among those lost), or the flush was read
// and repaired with the loss. The table must then be a fresh sink's. It
// fails when the monitor stops at ENOBUFS (no repair) or ignores it (a
// repair that does not say so, or none when the transaction's end was
// lost).
func TestKernelMonitorLostNotifications(t *testing.T) {
	netns.RequirePrivileged(t)
	netns.RequireCommands(t, "nft")
	ns := netns.New(t, "monlost")
	const name = "monlost"
	table := TableName(name)
	_, results, _, want, svcChain := lossySink(t, ns, name)
	newConn := connIn(t, ns)
	script := "flush chain ip " + table + " " + svcChain + "\n" + bulkScript("bulk", bulkRules)
	if _, stderr, err := ns.Exec([]byte(script), "nft", "-f", "-"); err != nil {
		t.Fatalf("nft -f: %v: %s", err, stderr)
	}
	deadline := time.After(10 * time.Second)
	for {
		select {
		case r := <-results:
			if r.Err != nil || r.Repair == "" || !r.Full {
				t.Fatalf("after the flush with %d rules: %+v, want a successful full repair", bulkRules, r)
			}
			if !strings.Contains(r.Repair, "nftables notifications were lost") {
				t.Fatalf("repaired because %q: want the loss of notifications said", r.Repair)
			}
			t.Logf("repaired: %s", r.Repair)
		case <-deadline:
			t.Fatalf("the flush of %s with %d rules elsewhere: no repair before the periodic check (every hour) could have made one (waited 10 s)", svcChain, bulkRules)
		}
		// A first repair may be of the loss in the sink's own first
		// transaction (its chain checked before the flush): the flush's
		// comes next.
		if diffKernelTables(want, mustReadKernelTable(t, newConn, table)) == "" {
			break
		}
	}
}

// lossySink is monitoredSink with a monitor socket of the smallest
// receive buffer (any burst of notifications overruns it): it returns the
// sink, its results, its state, the table a fresh sink writes for it, and
// a service chain of it to flush.
func lossySink(t *testing.T, ns *netns.NS, name string) (*Sink, chan SyncResult, []*model.ServiceEndpoints, *kernelTable, string) {
	t.Helper()
	s, results, state, opts := monitoredSinkWith(t, ns, name, func(c *Config) { c.monitorReceiveBuffer = 1 })
	want := freshKernelTable(t, name, opts, state)
	for _, c := range s.tracker.ChainNames() {
		if strings.HasPrefix(c, "svc4-") {
			return s, results, state, want, c
		}
	}
	t.Fatal("the state has no service chain to flush")
	return nil, nil, nil, nil, ""
}

// TestKernelMonitorLostInRound is TestKernelMonitorLostNotifications
// with the loss taken in while a round of kpng's is open (an Update
// made, its Sync not yet): the check of every chain that the loss calls
// for cannot run then (the tracker holds the round's state, not the
// table's) and must run after the round's Sync, which repairs the
// flushed chain. It fails when the check is dropped in a round (no
// repair in 10 s after the Sync).
func TestKernelMonitorLostInRound(t *testing.T) {
	netns.RequirePrivileged(t)
	netns.RequireCommands(t, "nft")
	ns := netns.New(t, "monround")
	const name = "monround"
	table := TableName(name)
	s, results, state, want, svcChain := lossySink(t, ns, name)
	newConn := connIn(t, ns)
	// What the monitor takes in, and whether a round was open and the
	// flush started then.
	type seen struct{ inRound, flushed bool }
	var flushing atomic.Bool
	monitored := make(chan seen, 100)
	s.mu.Lock()
	s.monitored = func() { monitored <- seen{s.inRound, flushing.Load()} }
	s.mu.Unlock()

	// The round: a service updated to what it is (the round's Sync has
	// nothing to send).
	s.Update(state[0].Service.Key(), state[0], state[0])
	// The monitor may take the loss in before nft has returned.
	flushing.Store(true)
	script := "flush chain ip " + table + " " + svcChain + "\n" + bulkScript("bulk", bulkRules)
	if _, stderr, err := ns.Exec([]byte(script), "nft", "-f", "-"); err != nil {
		t.Fatalf("nft -f: %v: %s", err, stderr)
	}
	for deadline := time.After(10 * time.Second); ; {
		select {
		case m := <-monitored:
			if !m.flushed {
				continue // a loss in the sink's first transaction
			}
			if !m.inRound {
				t.Fatalf("the monitor took the flush in outside the round: %+v", m)
			}
		case <-deadline:
			t.Fatalf("the flush of %s with %d rules elsewhere: the monitor took nothing in during the round (waited 10 s)", svcChain, bulkRules)
		}
		break
	}
	if err := s.Sync(); err != nil {
		t.Fatalf("the round's Sync: %v", err)
	}
	// The check after the round's Sync rewrites the table before Sync
	// returns; the loop below waits for a repair made otherwise.
	for drained := false; !drained; {
		select {
		case r := <-results:
			t.Logf("after the round's Sync: full %v, repair %q", r.Full, r.Repair)
		default:
			drained = true
		}
	}
	for deadline := time.After(10 * time.Second); diffKernelTables(want, mustReadKernelTable(t, newConn, table)) != ""; {
		select {
		case r := <-results:
			if r.Err != nil || !r.Full {
				t.Fatalf("after the round's Sync: %+v, want a successful full sync", r)
			}
			t.Logf("repaired: %q", r.Repair)
		case <-deadline:
			t.Fatalf("the flush of %s, its notifications lost during a round: not repaired 10 s after the round's Sync", svcChain)
		}
	}
}

// TestKernelMonitorMuted runs a monitored sink whose every transaction
// is sent with the monitor muted (Config.muteObjects 1; by default only
// the large ones are, applier.mute):
//   - after its muted first sync, a chain flushed with nft is repaired as
//     that change, by nft, and not as a loss (listening again, the
//     monitor does not take the muted transaction for one);
//   - a chain flushed with nft while the monitor is muted (after the
//     round's transaction was applied, before the sink reads its answer)
//     is not notified: it must be repaired all the same, by the check of
//     every chain that a generation moved by more than the sink's commit
//     calls for (the repair says notifications were lost), and the table
//     must be a fresh sink's of the round's state.
//
// It fails when unmuting does not compare the generations (the second
// flush stays until the periodic check, an hour), or does not resync
// (the first repair is Cut, saying notifications were lost).
func TestKernelMonitorMuted(t *testing.T) {
	netns.RequirePrivileged(t)
	netns.RequireCommands(t, "nft")
	ns := netns.New(t, "monmute")
	const name = "monmute"
	table := TableName(name)
	s, results, state, opts := monitoredSinkWith(t, ns, name, func(c *Config) { c.muteObjects = 1 })
	newConn := connIn(t, ns)
	var svcChain string
	for _, c := range s.tracker.ChainNames() {
		if strings.HasPrefix(c, "svc4-") {
			svcChain = c
			break
		}
	}
	if svcChain == "" {
		t.Fatal("the state has no service chain to flush")
	}
	flush := []byte("flush chain ip " + table + " " + svcChain + "\n")
	// awaitRepair waits for a successful full repair saying want, and
	// then for the table to be want's.
	awaitRepair := func(what, say string, want *kernelTable) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			select {
			case r := <-results:
				if r.Err != nil {
					t.Fatalf("%s: %+v", what, r)
				}
				if r.Repair == "" {
					continue // the round's own
				}
				if !r.Full || !strings.Contains(r.Repair, say) || strings.Contains(r.Repair, "lost") != strings.Contains(say, "lost") {
					t.Fatalf("%s: repaired because %q (full %v), want a full repair saying %q", what, r.Repair, r.Full, say)
				}
				t.Logf("%s: repaired: %s", what, r.Repair)
			case <-deadline:
				t.Fatalf("%s: no repair before the periodic check (every hour) could have made one (waited 10 s)", what)
			}
			if diffKernelTables(want, mustReadKernelTable(t, newConn, table)) == "" {
				return
			}
		}
	}

	// The round below: a service deleted (not the flushed chain's). The
	// tables a fresh sink writes are built while the sink is idle (its
	// transactions and theirs must not be built at once: buildMu).
	i := slices.IndexFunc(state, func(se *model.ServiceEndpoints) bool {
		return !strings.Contains(svcChain, "/"+se.Service.Name+"/")
	})
	if i < 0 {
		t.Fatal("the state has no service but the flushed chain's")
	}
	next := slices.Delete(slices.Clone(state), i, i+1)
	want, wantNext := freshKernelTable(t, name, opts, state), freshKernelTable(t, name, opts, next)

	if _, stderr, err := ns.Exec(flush, "nft", "-f", "-"); err != nil {
		t.Fatalf("nft -f: %v: %s", err, stderr)
	}
	awaitRepair("a chain flushed after the muted first sync", "delete rule ip "+table+" "+svcChain, want)

	// The round; the flush comes before the sink reads the kernel's
	// answer to it.
	var flushed atomic.Int32
	s.mu.Lock()
	s.applier.fault = func(op relayOp) error {
		if op == relayReceive && flushed.Add(1) == 1 {
			if _, stderr, err := ns.Exec(flush, "nft", "-f", "-"); err != nil {
				t.Errorf("nft -f: %v: %s", err, stderr)
			}
		}
		return nil
	}
	s.mu.Unlock()
	s.Update(state[i].Service.Key(), state[i], nil)
	if err := s.Sync(); err != nil {
		t.Fatalf("the round's Sync: %v", err)
	}
	if flushed.Load() == 0 {
		t.Fatal("the round's transaction read no answer: the chain was not flushed")
	}
	awaitRepair("a chain flushed while the monitor was muted", "nftables notifications were lost", wantNext)
}
