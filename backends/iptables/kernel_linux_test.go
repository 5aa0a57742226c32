//go:build linux

package iptables

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/model"
)

// TestKernelGoldenAccepted restores the golden cases' input (the text
// the golden files show and the sink sends) into a fresh namespace with
// both variants, and checks that iptables-save lists every chain with
// the number of rules planned: every rule kind is accepted by the kernel
// and the binaries of both variants.
func TestKernelGoldenAccepted(t *testing.T) {
	netns.RequirePrivileged(t)
	netns.RequireCommands(t, "nsenter", "iptables-legacy-restore", "iptables-nft-restore")
	for _, variant := range []string{VariantLegacy, VariantNFT} {
		for name, tc := range goldenCases() {
			t.Run(variant+"/"+name, func(t *testing.T) {
				ns := netns.New(t, "ipt")
				r := ExecRunner{NetNS: ns.Path()}
				pl := planner{prefix: ChainPrefix("golden"), opts: tc.opts, randomFully: tc.randomFully}
				p, _ := pl.build(tc.services)
				for _, f := range families {
					for _, table := range tables {
						tp := p.Families[f].table(table)
						ctx := context.Background()
						if _, err := r.Run(ctx, binary(variant, f, "-restore"), []string{"--noflush", "--wait"}, restoreInput(table, tp, nil)); err != nil {
							t.Fatalf("%s %s: %v", f, table, err)
						}
						out, err := r.Run(ctx, binary(variant, f, "-save"), []string{"-t", table}, nil)
						if err != nil {
							t.Fatalf("%s %s: save: %v", f, table, err)
						}
						for _, c := range tp.Chains {
							if got := strings.Count(string(out), "\n-A "+c.Name+" "); got != len(c.Rules) {
								t.Errorf("%s %s: chain %s: %d rules listed, %d planned", f, table, c.Name, got, len(c.Rules))
							}
						}
						if got := chainsWithPrefix(out, pl.prefix); len(got) != len(tp.Chains) {
							t.Errorf("%s %s: %d chains listed, %d planned", f, table, len(got), len(tp.Chains))
						}
					}
				}
			})
		}
	}
}

// breakingRunner is an ExecRunner whose restores fail while broken is
// set: it appends a rule to a chain that does not exist, so that
// iptables-restore rejects the whole input.
type breakingRunner struct {
	ExecRunner
	broken bool
}

// Run implements Runner.
func (r *breakingRunner) Run(ctx context.Context, name string, args []string, stdin []byte) ([]byte, error) {
	if r.broken && strings.HasSuffix(name, "-restore") {
		stdin = []byte(strings.Replace(string(stdin), "COMMIT\n", "-A KPNG-NO-SUCH-CHAIN -j RETURN\nCOMMIT\n", 1))
	}
	return r.ExecRunner.Run(ctx, name, args, stdin)
}

// webService is a dual-stack ClusterIP service with one endpoint per
// family.
func webService(clusterV4 string) *model.ServiceEndpoints {
	return &model.ServiceEndpoints{
		Service:   svc("web", ipset(clusterV4, "fd00:10:96::10"), port(model.TCP, 80, 8080)),
		Endpoints: []*model.Endpoint{ep("10.1.0.2", false), ep("fd00:1::2", false)},
	}
}

// TestKernelFailedRestoreKeepsRules checks, with both variants, that a
// restore the kernel rejects leaves the table as it was, that Sync
// returns the error, and that the next Sync writes everything.
func TestKernelFailedRestoreKeepsRules(t *testing.T) {
	netns.RequirePrivileged(t)
	netns.RequireCommands(t, "nsenter", "iptables-legacy-restore", "iptables-nft-restore")
	for _, variant := range []string{VariantLegacy, VariantNFT} {
		t.Run(variant, func(t *testing.T) {
			ns := netns.New(t, "ipt")
			r := &breakingRunner{ExecRunner: ExecRunner{NetNS: ns.Path()}}
			s, err := New(context.Background(), Config{ServiceProxyName: "fail", NetNS: ns.Path(), Variant: variant, Runner: r})
			if err != nil {
				t.Fatal(err)
			}
			save := func() string { return ns.MustExec(binary(variant, ipv4, "-save"), "-t", "nat") }
			web := webService("10.96.0.10")
			s.Update(web.Service.Key(), nil, web)
			if err := s.Sync(); err != nil {
				t.Fatalf("Sync: %v", err)
			}
			before := save()
			if !strings.Contains(before, "10.96.0.10") {
				t.Fatalf("the service is not in the nat table:\n%s", before)
			}
			moved := webService("10.96.0.11")
			s.Update(web.Service.Key(), web, moved)
			r.broken = true
			err = s.Sync()
			if err == nil || !strings.Contains(err.Error(), "table nat") {
				t.Fatalf("Sync with a rejected restore: %v, want the nat table's error", err)
			}
			if after := save(); strings.Contains(after, "10.96.0.11") || !strings.Contains(after, "10.96.0.10") {
				t.Errorf("after a rejected restore, the nat table changed:\n%s", after)
			}
			r.broken = false
			if err := s.Sync(); err != nil {
				t.Fatalf("Sync after the failure: %v", err)
			}
			if after := save(); !strings.Contains(after, "10.96.0.11") || strings.Contains(after, "10.96.0.10") {
				t.Errorf("the Sync after a failure did not write the new state:\n%s", after)
			}
		})
	}
}

// TestKernelCleanupAndCoexistence checks that two proxiers and
// kube-proxy's chains coexist in both families and tables, and that
// Cleanup removes one proxier's chains and jumps only.
func TestKernelCleanupAndCoexistence(t *testing.T) {
	netns.RequirePrivileged(t)
	netns.RequireCommands(t, "nsenter", "iptables-legacy-restore", "iptables-nft-restore")
	for _, variant := range []string{VariantLegacy, VariantNFT} {
		t.Run(variant, func(t *testing.T) {
			ns := netns.New(t, "ipt")
			ns.MustExec(binary(variant, ipv4, ""), "-t", "nat", "-N", "KUBE-SERVICES")
			ns.MustExec(binary(variant, ipv4, ""), "-t", "nat", "-A", "PREROUTING", "-j", "KUBE-SERVICES")
			// Proxier one stops before its Cleanup (as --cleanup runs
			// after kpng stopped: its monitor would write the chains
			// again); two runs on.
			ctxs := map[string]context.CancelFunc{}
			for _, name := range []string{"one", "two"} {
				ctx, stop := context.WithCancel(context.Background())
				t.Cleanup(stop)
				ctxs[name] = stop
				s, err := New(ctx, Config{ServiceProxyName: name, NetNS: ns.Path(), Variant: variant})
				if err != nil {
					t.Fatal(err)
				}
				web := webService("10.96.0.10")
				s.Update(web.Service.Key(), nil, web)
				if err := s.Sync(); err != nil {
					t.Fatalf("%s: Sync: %v", name, err)
				}
			}
			ctxs["one"]()
			if err := Cleanup(context.Background(), Config{ServiceProxyName: "one", NetNS: ns.Path(), Variant: variant}); err != nil {
				t.Fatalf("Cleanup: %v", err)
			}
			for _, f := range families {
				out := ns.MustExec(binary(variant, f, "-save"))
				if strings.Contains(out, ChainPrefix("one")) || strings.Contains(out, "kpng one") {
					t.Errorf("%s: proxier one's chains or jumps left after Cleanup:\n%s", f, out)
				}
				for _, want := range []string{":" + ChainPrefix("two") + "SERVICES", "-A PREROUTING -m comment --comment \"kpng two\" -j " + ChainPrefix("two") + "SERVICES"} {
					if !strings.Contains(out, want) {
						t.Errorf("%s: %q gone after proxier one's Cleanup:\n%s", f, want, out)
					}
				}
				if f == ipv4 && (!strings.Contains(out, ":KUBE-SERVICES") || !strings.Contains(out, "-A PREROUTING -j KUBE-SERVICES")) {
					t.Errorf("kube-proxy's chain or jump gone:\n%s", out)
				}
			}
			// Cleaning twice is not an error (--cleanup after a restart).
			if err := Cleanup(context.Background(), Config{ServiceProxyName: "one", NetNS: ns.Path(), Variant: variant}); err != nil {
				t.Errorf("second Cleanup: %v", err)
			}
		})
	}
}

// TestKernelDetectVariant checks auto detection in fresh namespaces: nft
// when nothing uses iptables, legacy when its tables hold rules.
func TestKernelDetectVariant(t *testing.T) {
	netns.RequirePrivileged(t)
	netns.RequireCommands(t, "nsenter", "iptables-legacy-save", "iptables-nft-save")
	for _, tc := range []struct {
		setup string
		want  string
	}{
		{"", VariantNFT},
		{"iptables-legacy", VariantLegacy},
		{"iptables-nft", VariantNFT},
	} {
		t.Run("rules by "+tc.setup, func(t *testing.T) {
			ns := netns.New(t, "ipt")
			if tc.setup != "" {
				ns.MustExec(tc.setup, "-A", "INPUT", "-j", "ACCEPT")
				ns.MustExec(tc.setup, "-A", "OUTPUT", "-j", "ACCEPT")
			}
			got, err := DetectVariant(context.Background(), ExecRunner{NetNS: ns.Path()})
			if err != nil || got != tc.want {
				t.Errorf("DetectVariant = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestKernelCanary checks, with both variants, that the sink notices
// tables flushed behind its back (IPv4 nat: every rule and chain
// deleted; IPv6 filter: every rule deleted) through its canary chains,
// and rewrites everything, jumps included, without a round from kpng.
func TestKernelCanary(t *testing.T) {
	netns.RequirePrivileged(t)
	netns.RequireCommands(t, "nsenter", "iptables-legacy-restore", "iptables-nft-restore")
	for _, variant := range []string{VariantLegacy, VariantNFT} {
		t.Run(variant, func(t *testing.T) {
			ns := netns.New(t, "ipt")
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			s, err := New(ctx, Config{ServiceProxyName: "canary", NetNS: ns.Path(), Variant: variant, CheckPeriod: 100 * time.Millisecond, NoMonitor: true})
			if err != nil {
				t.Fatal(err)
			}
			web := webService("10.96.0.10")
			s.Update(web.Service.Key(), nil, web)
			if err := s.Sync(); err != nil {
				t.Fatalf("Sync: %v", err)
			}
			prefix := ChainPrefix("canary")
			for _, tc := range []struct {
				f     family
				table string
				flush [][]string
				want  []string
			}{
				// IPv4 nat: replaced by an empty table at once (every rule
				// and chain gone; two commands, -F then -X, would race
				// with the sink's repair).
				{ipv4, "nat", nil, []string{"-d 10.96.0.10/32", "-A PREROUTING -m comment --comment \"kpng canary\" -j " + prefix + "SERVICES"}},
				{ipv6, "filter", [][]string{{"-t", "filter", "-F"}}, []string{"-A INPUT -m comment --comment \"kpng canary\" -m conntrack --ctstate NEW -j " + prefix + "SERVICES", "\"kpng node ports\" -m addrtype --dst-type LOCAL -j " + prefix + "NODEPORTS"}},
			} {
				if tc.flush == nil {
					if _, stderr, err := ns.Exec([]byte("*"+tc.table+"\nCOMMIT\n"), binary(variant, tc.f, "-restore")); err != nil {
						t.Fatalf("empty the %s table: %v: %s", tc.table, err, stderr)
					}
				}
				for _, args := range tc.flush {
					ns.MustExec(binary(variant, tc.f, ""), args...)
				}
				var out string
				for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
					out = ns.MustExec(binary(variant, tc.f, "-save"), "-t", tc.table)
					if containsAll(out, tc.want) {
						break
					}
				}
				if !containsAll(out, tc.want) {
					t.Errorf("%s %s flushed: not rewritten within 10 s, want %q in:\n%s", tc.f, tc.table, tc.want, out)
				}
				// The repair rewrites both families: a Sync (it takes the
				// sink's lock) waits for its end, so that the next flush
				// does not fall in its middle, between its listing (jumps
				// there) and its restore (chains written, jumps not).
				if err := s.Sync(); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// TestKernelConntrackEndpointReplaced checks, with both variants, that a
// UDP flow (one source port, so one conntrack entry) to a cluster IP
// follows its service's endpoint when the endpoint is replaced: the sink
// deletes the stale entry. In the control run the conntrack handle
// fails: the flow stays on the old endpoint, so the test can fail.
func TestKernelConntrackEndpointReplaced(t *testing.T) {
	netns.RequirePrivileged(t)
	netns.RequireCommands(t, "nsenter", "iptables-legacy-restore", "iptables-nft-restore")
	for _, variant := range []string{VariantLegacy, VariantNFT} {
		for _, cleanup := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/cleanup=%v", variant, cleanup), func(t *testing.T) {
				b := netns.Blog(t)
				cfg := Config{ServiceProxyName: "ct", NetNS: b.Node.Path(), Variant: variant}
				if !cleanup {
					cfg.Conntrack = func() (*netlink.Handle, error) { return nil, errors.New("no conntrack in the control run") }
				}
				s, err := New(context.Background(), cfg)
				if err != nil {
					t.Fatal(err)
				}
				svc := svc("dns", ipset("10.96.0.10", "fd00:10:96::10"), port(model.UDP, 53, 6000))
				pod := func(v4, v6 netip.Addr) []*model.Endpoint {
					return []*model.Endpoint{ep(v4.String(), true), ep(v6.String(), true)}
				}
				first := &model.ServiceEndpoints{Service: svc, Endpoints: pod(netns.PodV4, netns.PodV6)}
				s.Update(svc.Key(), nil, first)
				if err := s.Sync(); err != nil {
					t.Fatal(err)
				}
				dsts := []netip.AddrPort{netip.MustParseAddrPort("10.96.0.10:53"), netip.MustParseAddrPort("[fd00:10:96::10]:53")}
				const srcPort = 40200
				for _, d := range dsts {
					if a, err := b.Client.Ask("udp", d, netns.AskOptions{LocalPort: srcPort}); err != nil || a.Server != netns.PodID {
						t.Fatalf("UDP flow to %s: %v, %v; want %s", d, a.Server, err, netns.PodID)
					}
				}
				second := &model.ServiceEndpoints{Service: svc, Endpoints: pod(netns.Pod2V4, netns.Pod2V6)}
				s.Update(svc.Key(), first, second)
				if err := s.Sync(); err != nil {
					t.Fatal(err)
				}
				want := netns.Pod2ID
				if !cleanup {
					want = netns.PodID // the stale entry keeps the flow
				}
				for _, d := range dsts {
					if a, err := b.Client.Ask("udp", d, netns.AskOptions{LocalPort: srcPort}); err != nil || a.Server != want {
						t.Errorf("the same UDP flow to %s after the change: %v, %v; want %s", d, a.Server, err, want)
					}
				}
			})
		}
	}
}

// TestKernelDispatchTree checks the dispatch trees with real traffic,
// both variants: 200 services (half without endpoints, a third with node
// ports) make trees of addresses and of node ports in the nat and filter
// tables of both families; sampled services answer (or refuse, without
// endpoints) from the client on their cluster IPs and on their node
// ports (reached after the packet fell through the address tree).
func TestKernelDispatchTree(t *testing.T) {
	netns.RequirePrivileged(t)
	netns.RequireCommands(t, "nsenter", "iptables-legacy-restore", "iptables-nft-restore")
	for _, variant := range []string{VariantLegacy, VariantNFT} {
		t.Run(variant, func(t *testing.T) {
			b := netns.Blog(t)
			s, err := New(context.Background(), Config{ServiceProxyName: "tree", NetNS: b.Node.Path(), Variant: variant})
			if err != nil {
				t.Fatal(err)
			}
			services := manyServices(200)
			for _, se := range services {
				np := se.Service.Ports[0].NodePort // 20000+i for a third of them
				se.Service.Ports = []*model.PortMapping{port(model.TCP, 80, 6000)}
				se.Service.Ports[0].NodePort = np
				if len(se.Endpoints) > 0 {
					se.Endpoints = []*model.Endpoint{ep(netns.PodV4.String(), true), ep(netns.PodV6.String(), true)}
				}
			}
			for _, se := range services {
				s.Update(se.Service.Key(), nil, se)
			}
			if err := s.Sync(); err != nil {
				t.Fatal(err)
			}
			for _, table := range tables {
				out := b.Node.MustExec(binary(variant, ipv6, "-save"), "-t", table)
				if !strings.Contains(out, "-j "+ChainPrefix("tree")+kindDispatch+"-") || !strings.Contains(out, "--dport 20") {
					t.Fatalf("no dispatch tree (or no node-port tree) in the IPv6 %s table:\n%s", table, out)
				}
			}
			ask := func(i int, dst netip.AddrPort) {
				t.Helper()
				a, err := b.Client.Ask("tcp", dst, netns.AskOptions{Timeout: 2 * time.Second})
				if len(services[i].Endpoints) > 0 && (err != nil || a.Server != netns.PodID) {
					t.Errorf("service %d at %s: %v, %v; want %s", i, dst, a.Server, err, netns.PodID)
				}
				if len(services[i].Endpoints) == 0 && !errors.Is(err, syscall.ECONNREFUSED) {
					t.Errorf("service %d at %s (no endpoints): %v, %v; want refused", i, dst, a.Server, err)
				}
			}
			for _, i := range []int{0, 1, 64, 131, 198, 199} {
				for _, f := range families {
					ask(i, netip.AddrPortFrom(netip.MustParseAddr(familyTexts(services[i].Service.IPs.ClusterIPs, f)[0]), 80))
				}
			}
			for _, i := range []int{0, 3, 66, 195, 198} {
				for _, node := range []netip.Addr{netns.NodeV4, netns.NodeV6} {
					ask(i, netip.AddrPortFrom(node, uint16(services[i].Service.Ports[0].NodePort)))
				}
			}
		})
	}
}
