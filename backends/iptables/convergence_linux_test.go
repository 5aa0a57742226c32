//go:build linux

package iptables

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"sigs.k8s.io/kpng/internal/churn"
	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

// churnPools draw few addresses and ports, so that services contend for
// them, and endpoint addresses that are also sources of hairpin traffic.
var churnPools = churn.Pools{
	ClusterV4:   []netip.Addr{netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("10.96.0.2"), netip.MustParseAddr("10.96.0.3")},
	ClusterV6:   []netip.Addr{netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")},
	External:    []netip.Addr{netip.MustParseAddr("10.0.0.55"), netip.MustParseAddr("1000::55")},
	EndpointsV4: []netip.Addr{netip.MustParseAddr("10.1.0.1"), netip.MustParseAddr("10.1.0.2"), netip.MustParseAddr("10.1.0.3")},
	EndpointsV6: []netip.Addr{netip.MustParseAddr("1100::1"), netip.MustParseAddr("1100::2")},
	Ports:       []int32{80, 81, 53},
	NodePorts:   []int32{30080, 30081},
}

// churnOptions are the options of the convergence tests: with cluster
// CIDRs, so that the masquerading rules are planned too.
var churnOptions = Options{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("1100::/64")}}

// TestStateConvergence applies seeded random churn round by round to the
// incremental state (each round re-plans only the services changed and
// those contending with them) and checks after every round that its
// plan and problems are those of a fresh build of the whole state.
// KPNG_CHURN_ROUNDS and KPNG_CHURN_SEED change the length and the seed.
func TestStateConvergence(t *testing.T) {
	rounds, seeds := churn.FromEnv(300, 1, 2, 3)
	pl := planner{prefix: ChainPrefix("churn"), opts: churnOptions}
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			gen := churn.New(seed, churnPools)
			st := newState(pl)
			for round := range rounds {
				changed := map[model.ServiceKey]bool{}
				for _, c := range gen.Round() {
					changed[c.Key] = true
					if c.Value == nil {
						delete(st.services, c.Key)
					} else {
						st.services[c.Key] = c.Value
					}
				}
				st.update(changed)
				fresh, freshProblems := pl.build(gen.State())
				if diff := cmp.Diff(render(fresh, freshProblems), render(st.plan(), st.problems())); diff != "" {
					t.Fatalf("seed %d round %d: the incremental plan differs from a fresh build (-fresh +incremental):\n%s", seed, round, diff)
				}
			}
		})
	}
}

// kernelChains returns the proxier's chains (prefix) in both tables of
// both families of the namespace, as iptables-save lists them: each
// chain's rules, in order, by family, table and name.
func kernelChains(t *testing.T, r Runner, variant, prefix string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, f := range families {
		for _, table := range tables {
			save, err := r.Run(context.Background(), binary(variant, f, "-save"), []string{"-t", table}, nil)
			if err != nil {
				t.Fatalf("%s %s: %v", f, table, err)
			}
			sc := bufio.NewScanner(strings.NewReader(string(save)))
			sc.Buffer(nil, 1<<20)
			for sc.Scan() {
				line := sc.Text()
				if name, ok := strings.CutPrefix(line, ":"+prefix); ok {
					key := fmt.Sprintf("%s %s %s%s", f, table, prefix, strings.Fields(name)[0])
					out[key] = []string{}
				}
				if rest, ok := strings.CutPrefix(line, "-A "+prefix); ok {
					name, rule, _ := strings.Cut(rest, " ")
					key := fmt.Sprintf("%s %s %s%s", f, table, prefix, name)
					out[key] = append(out[key], rule)
				}
			}
		}
	}
	return out
}

// TestKernelConvergence applies seeded random churn round by round to a
// sink in a network namespace, with both variants: full syncs only at
// the start, partial ones after. After every round the proxier's chains
// listed from the kernel must be those a new sink programs from the
// whole state in a clean namespace.
func TestKernelConvergence(t *testing.T) {
	netns.RequirePrivileged(t)
	netns.RequireCommands(t, "nsenter", "iptables-legacy-restore", "iptables-nft-restore")
	rounds, seeds := churn.FromEnv(30, 4)
	for _, variant := range []string{VariantLegacy, VariantNFT} {
		for _, seed := range seeds {
			t.Run(fmt.Sprintf("%s/seed=%d", variant, seed), func(t *testing.T) {
				incNS, freshNS := netns.New(t, "ipt-inc"), netns.New(t, "ipt-fresh")
				cfg := Config{ServiceProxyName: "churn", Options: churnOptions, Variant: variant}
				// Each sink stops (its context, hence its monitor) when
				// stop is called: a fresh sink's before its chains are
				// cleaned up (its monitor would write them again).
				newSinkIn := func(ns *netns.NS) (localsink.Sink, context.CancelFunc) {
					c := cfg
					c.NetNS = ns.Path()
					ctx, stop := context.WithCancel(context.Background())
					t.Cleanup(stop)
					s, err := New(ctx, c)
					if err != nil {
						t.Fatal(err)
					}
					return s, stop
				}
				inc, _ := newSinkIn(incNS)
				prefix := ChainPrefix(cfg.ServiceProxyName)
				gen := churn.New(seed, churnPools)
				for round := range rounds {
					changes := gen.Round()
					slices.SortFunc(changes, func(a, b churn.Change) int { return a.Key.Compare(b.Key) })
					for _, c := range changes {
						inc.Update(c.Key, nil, c.Value)
					}
					if err := inc.Sync(); err != nil {
						t.Fatalf("seed %d round %d: incremental Sync: %v", seed, round, err)
					}
					fresh, stopFresh := newSinkIn(freshNS)
					for _, se := range gen.State() {
						fresh.Update(se.Service.Key(), nil, se)
					}
					if err := fresh.Sync(); err != nil {
						t.Fatalf("seed %d round %d: fresh Sync: %v", seed, round, err)
					}
					want := kernelChains(t, ExecRunner{NetNS: freshNS.Path()}, variant, prefix)
					got := kernelChains(t, ExecRunner{NetNS: incNS.Path()}, variant, prefix)
					if diff := cmp.Diff(want, got); diff != "" {
						t.Fatalf("seed %d round %d: the kernel's chains after partial syncs differ from a fresh sync (-fresh +incremental):\n%s", seed, round, diff)
					}
					stopFresh()
					if err := Cleanup(context.Background(), Config{ServiceProxyName: cfg.ServiceProxyName, NetNS: freshNS.Path(), Variant: variant}); err != nil {
						t.Fatal(err)
					}
				}
			})
		}
	}
}
