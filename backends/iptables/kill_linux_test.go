//go:build linux

package iptables

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/internal/racebuild"
	"sigs.k8s.io/kpng/internal/selfexec"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

// killHelperEnv makes the test binary run killHelper instead of the tests:
// its value is the path of the network namespace to program.
const killHelperEnv = "KPNG_IPT_KILL_HELPER"

// TestMain runs the tests, or killHelper in a process of its own.
func TestMain(m *testing.M) {
	if path := os.Getenv(killHelperEnv); path != "" {
		pause, _ := strconv.Atoi(os.Getenv("KPNG_IPT_KILL_PAUSE"))
		os.Exit(killHelper(path, os.Getenv("KPNG_IPT_KILL_VARIANT"), os.Getenv("KPNG_IPT_KILL_FIRST"), os.Getenv("KPNG_IPT_KILL_ONCE") != "", pause))
	}
	os.Exit(m.Run())
}

// killStates are the two states the killed proxier alternates between:
// 600 dual-stack services of 4 endpoints; from A to B, every service's
// endpoints change, 150 services go and 150 others come, so that each sync
// restores every table of both families.
func killStates() (a, b []*model.ServiceEndpoints) {
	service := func(i, shift int) *model.ServiceEndpoints {
		v4 := netip.AddrFrom4([4]byte{10, 96, byte(i / 250), byte(1 + i%250)})
		var eps []*model.Endpoint
		for j := range 4 {
			n := i*4 + j + shift
			ep4 := netip.AddrFrom4([4]byte{10, 1, byte(n / 250), byte(1 + n%250)})
			ep6 := netip.AddrFrom16([16]byte{0xfd, 0, 0, 1, 14: byte(n >> 8), 15: byte(n)})
			eps = append(eps, &model.Endpoint{IPs: ipset(ep4.String(), ep6.String()), Ready: true, Serving: true, Local: j == 0})
		}
		v6 := netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x96, 14: byte(i >> 8), 15: byte(i)})
		s := svc(fmt.Sprintf("svc-%04d", i), ipset(v4.String(), v6.String()), port(model.TCP, 80, 8080))
		return &model.ServiceEndpoints{Service: s, Endpoints: eps}
	}
	for i := range 600 {
		a = append(a, service(i, 0))
		b = append(b, service(i+150, 1))
	}
	return a, b
}

// killHelper is the proxier the test kills: in the network namespace at
// path, with the iptables variant given, it syncs the state first ("a" or
// "b") then the other, alternately, forever (or once with once), printing
// "begin <state>" before each Sync and "end <state>" after it. With pause
// > 0, its sync number pause (from 1) stops once its first
// iptables-restore has returned (one table written, the others not yet),
// prints "paused <family> <table>" and waits to be killed.
func killHelper(path, variant, first string, once bool, pause int) int {
	cfg := Config{ServiceProxyName: "kill", NetNS: path, Variant: variant}
	sync := 0
	if pause > 0 {
		cfg.Runner = pauseRunner{ExecRunner{NetNS: path}, func(name string, stdin []byte) {
			if sync == pause && strings.HasSuffix(name, "-restore") {
				table, _, _ := strings.Cut(string(stdin), "\n")
				fmt.Printf("paused %s %s\n", name, strings.TrimPrefix(table, "*"))
				select {} // until killed
			}
		}}
	}
	s, err := New(context.Background(), cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	feeder := localsink.NewFeeder(s, localsink.FeederOptions{NoRetry: true})
	a, b := killStates()
	states := map[string][]*model.ServiceEndpoints{"a": a, "b": b}
	name := first
	for {
		sync++
		fmt.Printf("begin %s\n", name)
		feeder.SetAll(states[name])
		if err := feeder.Sync(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Printf("end %s\n", name)
		if once {
			return 0
		}
		name = map[string]string{"a": "b", "b": "a"}[name]
	}
}

// pauseRunner runs the binaries with Runner, calling after with each one's
// name and input once it has run successfully.
type pauseRunner struct {
	Runner
	after func(name string, stdin []byte)
}

// Run implements Runner.
func (r pauseRunner) Run(ctx context.Context, name string, args []string, stdin []byte) ([]byte, error) {
	out, err := r.Runner.Run(ctx, name, args, stdin)
	if err == nil {
		r.after(name, stdin)
	}
	return out, err
}

// startKillHelper starts killHelper in ns, in a process group of its own
// (the iptables-restore it runs dies with it, as in a container that is
// killed), and returns its process and the lines it prints; pause > 0
// stops it in that sync (killHelper).
func startKillHelper(t *testing.T, ns *netns.NS, variant, first string, once bool, pause int) (*exec.Cmd, <-chan string) {
	t.Helper()
	env := []string{killHelperEnv + "=" + ns.Path(), "KPNG_IPT_KILL_VARIANT=" + variant, "KPNG_IPT_KILL_FIRST=" + first, "KPNG_IPT_KILL_PAUSE=" + strconv.Itoa(pause)}
	if once {
		env = append(env, "KPNG_IPT_KILL_ONCE=1")
	}
	return selfexec.Start(t, env, true)
}

// byTable splits the chains kernelChains lists by family and table ("IPv4
// nat", ...).
func byTable(chains map[string][]string) map[string]map[string][]string {
	out := map[string]map[string][]string{}
	for key, rules := range chains {
		f := strings.Fields(key)
		table := f[0] + " " + f[1]
		if out[table] == nil {
			out[table] = map[string][]string{}
		}
		out[table][f[2]] = rules
	}
	return out
}

// TestKernelKilledWhileProgramming starts, with each variant, a proxier
// process that alternates between two states (killHelper) and kills it
// and the iptables-restore it runs with SIGKILL at a random moment, 8
// times in a row (KPNG_KILLS; 3 under the race detector), each new process
// starting from the tables the previous one left; every fourth kill, the
// first included, certainly in the middle of a sync: the process stops
// once its second sync's first restore returned, and the table restored
// must then hold the new state, the others the one before. After each kill, each
// table (IPv4 and IPv6, nat and filter) read back from the kernel must
// hold the proxier's chains of the first state or of the second, as a
// fresh sink programs them (or none, before the first restore), never a
// mix of the two: iptables-restore replaces a table in one commit. The
// tables of one sync may differ (the nat table new, the filter table
// old), as with kube-proxy; a process started after the last kill
// converges to the state it is given.
func TestKernelKilledWhileProgramming(t *testing.T) {
	netns.RequirePrivileged(t)
	netns.RequireCommands(t, "nsenter", "iptables-legacy-restore", "iptables-nft-restore")
	kills := 8
	if racebuild.Enabled {
		kills = 3
	}
	if n := os.Getenv("KPNG_KILLS"); n != "" {
		fmt.Sscan(n, &kills)
	}
	a, b := killStates()
	for _, variant := range []string{VariantLegacy, VariantNFT} {
		t.Run(variant, func(t *testing.T) {
			prefix := ChainPrefix("kill")
			fresh := func(state []*model.ServiceEndpoints) map[string]map[string][]string {
				ns := netns.New(t, "ipt-fresh")
				s, err := New(context.Background(), Config{ServiceProxyName: "kill", NetNS: ns.Path(), Variant: variant})
				if err != nil {
					t.Fatal(err)
				}
				for _, se := range state {
					s.Update(se.Service.Key(), nil, se)
				}
				if err := s.Sync(); err != nil {
					t.Fatal(err)
				}
				return byTable(kernelChains(t, ExecRunner{NetNS: ns.Path()}, variant, prefix))
			}
			want := map[string]map[string]map[string][]string{"a": fresh(a), "b": fresh(b)}
			ns := netns.New(t, "ipt-kill")
			r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 2))
			start := time.Now()
			midway, mixedSyncs, ended, paused := 0, 0, false, 0
			other := map[string]string{"a": "b", "b": "a"}
			for i := range kills {
				first := []string{"a", "b"}[i%2]
				if i%4 == 0 {
					// Certain to land in the middle of a sync: stopped
					// once the second sync's first restore returned.
					paused++
					cmd, lines := startKillHelper(t, ns, variant, first, false, 2)
					var ends []string
					pausedAt := ""
					for line := range lines {
						f := strings.Fields(line)
						if f[0] == "paused" {
							family := "IPv4"
							if strings.HasPrefix(f[1], "ip6tables") {
								family = "IPv6"
							}
							pausedAt = family + " " + f[2]
							break
						}
						if f[0] == "end" {
							ends = append(ends, f[1])
						}
					}
					if err := selfexec.KillGroup(cmd); err != nil {
						t.Fatal(err)
					}
					_ = cmd.Wait()
					for line := range lines {
						if f := strings.Fields(line); f[0] == "end" {
							ends = append(ends, f[1])
						}
					}
					if !slices.Equal(ends, []string{first}) || pausedAt == "" {
						t.Fatalf("kill %d, paused in the second sync: the syncs that ended are %q (want only the first, %s), paused at %q: the kill was not in the middle of the second", i, ends, first, pausedAt)
					}
					midway++
					ended = true
					// The table restored holds the second sync's state,
					// every other one that differs between the states
					// the first's.
					got := byTable(kernelChains(t, ExecRunner{NetNS: ns.Path()}, variant, prefix))
					mixed := false
					for _, table := range []string{"IPv4 nat", "IPv4 filter", "IPv6 nat", "IPv6 filter"} {
						wantState := first
						if table == pausedAt {
							wantState = other[first]
						} else if !equalChains(want["a"][table], want["b"][table]) {
							mixed = true
						}
						if !equalChains(got[table], want[wantState][table]) {
							t.Fatalf("kill %d, paused after the %s table's restore in the second sync: the %s table does not hold the state %s", i, pausedAt, table, wantState)
						}
					}
					if mixed {
						mixedSyncs++
					}
					continue
				}
				cmd, lines := startKillHelper(t, ns, variant, first, false, 0)
				// Kill it during its 1st or 2nd sync, at a random
				// moment after it began.
				target, begun, inSync := 1+r.IntN(2), 0, false
				for begun < target {
					line, ok := <-lines
					if !ok {
						t.Fatalf("kill %d: the proxier exited before its sync %d", i, target)
					}
					switch strings.Fields(line)[0] {
					case "begin":
						begun, inSync = begun+1, true
					case "end":
						inSync, ended = false, true
					}
				}
				time.Sleep(time.Duration(r.IntN(600)) * time.Millisecond)
				if err := selfexec.KillGroup(cmd); err != nil {
					t.Fatal(err)
				}
				_ = cmd.Wait()
				for line := range lines {
					switch strings.Fields(line)[0] {
					case "begin":
						inSync = true
					case "end":
						inSync, ended = false, true
					}
				}
				if inSync {
					midway++
				}
				got := byTable(kernelChains(t, ExecRunner{NetNS: ns.Path()}, variant, prefix))
				states := map[string]bool{}
				for _, table := range []string{"IPv4 nat", "IPv4 filter", "IPv6 nat", "IPv6 filter"} {
					switch {
					case len(got[table]) == 0 && !ended:
						states["none"] = true
					case equalChains(got[table], want["a"][table]):
						states["a"] = true
					case equalChains(got[table], want["b"][table]):
						states["b"] = true
					default:
						t.Fatalf("kill %d: the %s table holds neither the first state's chains nor the second's (%d chains; %d and %d)",
							i, table, len(got[table]), len(want["a"][table]), len(want["b"][table]))
					}
				}
				if len(states) > 1 {
					mixedSyncs++
				}
			}
			t.Logf("%s: %d kills in %v, %d in the middle of a sync (%d of them paused there); after %d of them the tables held different states (each table whole)",
				variant, kills, time.Since(start).Round(time.Millisecond), midway, paused, mixedSyncs)
			if midway < paused {
				t.Errorf("%d kills in the middle of a sync, want at least the %d paused there", midway, paused)
			}

			// A proxier started after the kills converges.
			cmd, lines := startKillHelper(t, ns, variant, "b", true, 0)
			for range lines {
			}
			if err := cmd.Wait(); err != nil {
				t.Fatalf("the last proxier: %v", err)
			}
			got := byTable(kernelChains(t, ExecRunner{NetNS: ns.Path()}, variant, prefix))
			for table, chains := range want["b"] {
				if !equalChains(got[table], chains) {
					t.Errorf("after a clean run, the %s table differs from a fresh sync's", table)
				}
			}
		})
	}
}

// equalChains reports whether two tables' chains hold the same rules.
func equalChains(a, b map[string][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for name, rules := range a {
		other, ok := b[name]
		if !ok || strings.Join(rules, "\n") != strings.Join(other, "\n") {
			return false
		}
	}
	return true
}
