//go:build linux

package nft

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/kpng/internal/churn"
	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/localsink"
)

// TestKernelTableRepaired deletes or flushes, by hand with nft, the table,
// the ruleset, each kind of fixed chain, a service chain and an endpoint
// chain of a running sink, and deletes a base chain (the others cannot be
// deleted while a rule or map element refers to them), one after the
// other: each time the periodic check
// (Config.CheckPeriod) must find it within a few periods and rewrite the
// table, which must then read back as a fresh sink's; between the
// tampering, the check must change nothing. The monitor is off: it would
// repair first (TestKernelMonitorRepairs).
func TestKernelTableRepaired(t *testing.T) {
	netns.RequirePrivileged(t)
	netns.RequireCommands(t, "nft")
	ns := netns.New(t, "drift")
	const name = "drift"
	table := TableName(name)

	// A state with service chains, endpoint chains (affinity) and
	// endpoint maps.
	gen := churn.New(7, churnPools)
	for len(gen.State()) < 10 {
		gen.Round()
	}
	state := gen.State()
	opts := Options{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}}

	results := make(chan SyncResult, 100)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	newConn := connIn(t, ns)
	s, err := New(ctx, Config{ServiceProxyName: name, Options: opts, Conn: newConn, Conntrack: conntrackIn(t, ns),
		CheckPeriod: 100 * time.Millisecond, NoMonitor: true, AfterSync: func(r SyncResult) { results <- r }})
	if err != nil {
		t.Fatal(err)
	}
	f := localsink.NewFeeder(s, localsink.FeederOptions{NoRetry: true})
	t.Cleanup(f.Close)
	f.SetAll(state)
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	<-results
	want := freshKernelTable(t, name, opts, state)
	if diff := diffKernelTables(want, mustReadKernelTable(t, newConn, table)); diff != "" {
		t.Fatalf("first sync (-fresh +sink):\n%s", diff)
	}

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
		t.Fatalf("the state has no service chain (%q) or endpoint chain (%q) to tamper with", svcChain, epChain)
	}
	for _, tc := range []struct{ what, script string }{
		{"delete the table", "delete table ip " + table},
		{"flush the table", "flush table ip " + table},
		{"flush the ruleset", "flush ruleset"},
		{"flush a base chain", "flush chain ip " + table + " " + chainNATPrerouting},
		{"flush the lookup chain", "flush chain ip " + table + " " + chainServices},
		{"flush the masquerading chain", "flush chain ip " + table + " " + chainMasquerading},
		{"flush a service chain", "flush chain ip " + table + " " + svcChain},
		{"flush an endpoint chain", "flush chain ip " + table + " " + epChain},
		{"delete a base chain", "delete chain ip " + table + " " + chainNATOutput},
		{"delete the ip6 table", "delete table ip6 " + table},
		{"flush the ip6 lookup chain", "flush chain ip6 " + table + " " + chainServices},
	} {
		t.Run(tc.what, func(t *testing.T) {
			// Between the tampering, the check changes nothing.
			select {
			case r := <-results:
				t.Fatalf("a transaction without a change: %+v", r)
			case <-time.After(300 * time.Millisecond):
			}
			if _, stderr, err := ns.Exec([]byte(tc.script+"\n"), "nft", "-f", "-"); err != nil {
				t.Fatalf("nft -f: %v: %s", err, stderr)
			}
			start := time.Now()
			select {
			case r := <-results:
				if r.Err != nil || r.Repair == "" || !r.Full {
					t.Fatalf("after %s: %+v, want a successful full repair", tc.what, r)
				}
				t.Logf("%s: found (%s) and repaired in %v", tc.what, r.Repair, time.Since(start).Round(time.Millisecond))
			case <-time.After(5 * time.Second):
				t.Fatalf("after %s: no repair within 5 s", tc.what)
			}
			if diff := diffKernelTables(want, mustReadKernelTable(t, newConn, table)); diff != "" {
				t.Fatalf("after %s and the repair (-fresh +sink):\n%s", tc.what, diff)
			}
		})
	}
}
