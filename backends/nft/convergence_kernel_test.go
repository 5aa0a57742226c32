//go:build linux

package nft

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"sigs.k8s.io/kpng/internal/churn"
	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/localsink/sinktest"
)

// TestKernelConvergence applies seeded random churn (internal/churn) round
// by round to the sink, fed through a Feeder as kpng feeds it, in a network
// namespace; after every round, the table read back from the kernel over
// netlink (readKernelTable: slots replaced by the intervals they hold) must
// equal what a fresh sink programs from the same whole state in a fresh
// namespace. TestTrackerConvergence checks the tracker's deltas; this one
// checks what the kernel holds after the applier sent them: a delta the
// applier drops, misorders or the kernel reads otherwise shows here.
// KPNG_CHURN_ROUNDS (default 250) and KPNG_CHURN_SEED change the length
// and the seed; the seed and round are printed on failure.
func TestKernelConvergence(t *testing.T) {
	netns.RequirePrivileged(t)
	rounds, seeds := churn.FromEnv(250, 11)
	opts := Options{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}}
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			start := time.Now()
			fd := freshNetNS(t)
			t.Cleanup(func() { unix.Close(fd) })
			newConn := ConnInNetNS(fd)
			s, err := New(context.Background(), Config{ServiceProxyName: "churn", Options: opts, Conn: newConn, Conntrack: conntrackAt(fd)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(s.applier.Close)
			checker := sinktest.NewChecker(s)
			feeder := localsink.NewFeeder(checker, localsink.FeederOptions{NoRetry: true})
			t.Cleanup(feeder.Close)
			gen := churn.New(seed, churnPools)
			var changes int
			for round := range rounds {
				for _, c := range gen.Round() {
					feeder.Update(c.Key, c.Value)
					changes++
				}
				if err := feeder.Sync(); err != nil {
					t.Fatalf("seed %d round %d: Sync: %v (rerun with KPNG_CHURN_SEED=%d KPNG_CHURN_ROUNDS=%d)", seed, round, err, seed, round+1)
				}
				got := mustReadKernelTable(t, newConn, TableName("churn"))
				want := freshKernelTable(t, "churn", opts, gen.State())
				if diff := diffKernelTables(want, got); diff != "" {
					t.Fatalf("seed %d round %d: the kernel's table differs from a fresh sink's (-fresh +incremental):\n%s\nrerun with KPNG_CHURN_SEED=%d KPNG_CHURN_ROUNDS=%d",
						seed, round, diff, seed, round+1)
				}
				if len(got.Unused) > 0 {
					t.Fatalf("seed %d round %d: endpoint intervals no rule uses: %v", seed, round, got.Unused)
				}
			}
			if err := checker.Err(); err != nil {
				t.Errorf("Sink contract broken:\n%v", err)
			}
			t.Logf("seed %d: %d rounds (%d service changes) converged, checked against a fresh namespace after each, in %v",
				seed, rounds, changes, time.Since(start).Round(time.Millisecond))
		})
	}
}

// TestKernelTableReadBack checks the reader of the convergence tests on a
// table it must tell apart: the same state read twice is equal, and a
// change of one endpoint, one rule or one element shows.
func TestKernelTableReadBack(t *testing.T) {
	netns.RequirePrivileged(t)
	gen := churn.New(5, churnPools)
	for len(gen.State()) < 8 {
		gen.Round()
	}
	state := gen.State()
	a := freshKernelTable(t, "rb", Options{}, state)
	b := freshKernelTable(t, "rb", Options{}, state)
	if diff := diffKernelTables(a, b); diff != "" {
		t.Fatalf("the same state read back twice differs:\n%s", diff)
	}
	if len(a.Chains) < 10 || len(a.Sets) < 10 || len(a.EndpointMaps) == 0 {
		t.Fatalf("the table read back is too small to be the state's: %d chains, %d sets, %d endpoint maps", len(a.Chains), len(a.Sets), len(a.EndpointMaps))
	}
	// One endpoint moved: the rules drawing from its block show it.
	changed := slices.Clone(state)
	for i, se := range changed {
		if len(se.Endpoints) > 0 && len(se.Service.Ports) > 0 {
			c := *se
			c.Endpoints = c.Endpoints[1:]
			changed[i] = &c
			break
		}
	}
	if diff := diffKernelTables(a, freshKernelTable(t, "rb", Options{}, changed)); diff == "" {
		t.Errorf("one endpoint fewer reads back the same")
	}
	// Other options: other rules.
	if diff := diffKernelTables(a, freshKernelTable(t, "rb", Options{MasqueradeAll: true}, state)); diff == "" {
		t.Errorf("masquerade-all reads back the same")
	}
}
