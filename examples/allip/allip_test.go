//go:build linux

package main

import (
	"bytes"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables"

	"sigs.k8s.io/kpng/examples/allip/allip"
	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/model"
)

const goldenPath = "../json/testdata/kpng-example.golden.json"

// golden returns the blog's state, with the local endpoints' addresses
// replaced by to (v4 and/or v6) if given.
func golden(t *testing.T, to ...netip.Addr) []byte {
	t.Helper()
	data, err := os.ReadFile(goldenPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range to {
		old := netns.PodV4
		if a.Is6() {
			old = netns.PodV6
		}
		data = bytes.ReplaceAll(data, []byte(`"`+old.String()+`"`), []byte(`"`+a.String()+`"`))
	}
	return data
}

// scriptRunner runs kpng-example-allip in the node's namespace.
type scriptRunner struct {
	t      *testing.T
	node   *netns.NS
	script string
	lock   string
}

func newScriptRunner(t *testing.T, node *netns.NS) *scriptRunner {
	t.Helper()
	netns.RequireCommands(t, "jq", "iptables", "ip6tables", "iptables-restore", "ip6tables-restore", "iptables-save", "ip6tables-save", "conntrack")
	script, err := filepath.Abs("kpng-example-allip")
	if err != nil {
		t.Fatal(err)
	}
	return &scriptRunner{t: t, node: node, script: script, lock: filepath.Join(t.TempDir(), "lock")}
}

// run runs the script with state on stdin, as
// `ip netns exec NODE bash kpng-example-allip < state`.
func (s *scriptRunner) run(state []byte) (stderr string, err error) {
	_, stderr, err = s.node.Exec(state, "env", "KPNG_ALLIP_LOCK="+s.lock, "bash", s.script)
	return stderr, err
}

func (s *scriptRunner) mustRun(state []byte) string {
	s.t.Helper()
	stderr, err := s.run(state)
	if err != nil {
		s.t.Fatalf("kpng-example-allip: %v", err)
	}
	return stderr
}

var counters = regexp.MustCompile(`\[\d+:\d+\]`)

// natSave returns `iptables-save -t nat` and `ip6tables-save -t nat` of ns,
// without comments and counters.
func natSave(t *testing.T, ns *netns.NS) string {
	t.Helper()
	var b strings.Builder
	for _, cmd := range []string{"iptables-save", "ip6tables-save"} {
		for _, line := range strings.Split(ns.MustExec(cmd, "-t", "nat"), "\n") {
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			b.WriteString(counters.ReplaceAllString(line, "[0:0]") + "\n")
		}
	}
	return b.String()
}

// scriptRules reads the script's rules back from iptables -S, as allip
// rules.
func scriptRules(t *testing.T, ns *netns.NS) []allip.Rule {
	t.Helper()
	var rules []allip.Rule
	for _, cmd := range []string{"iptables", "ip6tables"} {
		out, _, err := ns.Exec(nil, cmd, "-w", "-t", "nat", "-S", "KPNG-ALLIP")
		if err != nil {
			continue // no chain: no rules
		}
		for _, line := range strings.Split(out, "\n") {
			w := strings.Fields(line)
			if len(w) == 0 || w[0] != "-A" {
				continue
			}
			var r allip.Rule
			for i := 0; i+1 < len(w); i++ {
				switch w[i] {
				case "-d":
					p, err := netip.ParsePrefix(w[i+1])
					if err != nil {
						t.Fatalf("rule %q: %v", line, err)
					}
					r.External = p.Addr()
				case "--to-destination":
					r.Target = netip.MustParseAddr(w[i+1])
				case "--comment":
					ns, name, _ := strings.Cut(strings.Trim(w[i+1], `"`), "/")
					r.Service = model.ServiceKey{Namespace: ns, Name: name}
				}
			}
			rules = append(rules, r)
		}
	}
	slices.SortFunc(rules, func(a, b allip.Rule) int { return a.External.Compare(b.External) })
	return rules
}

var addrCmp = cmp.Comparer(func(a, b netip.Addr) bool { return a == b })

// TestScriptTraffic runs the script in the node of the blog's topology:
// the blog's state sends TCP and UDP on any port of both external IPs to the
// local pod, from the client and from the node; moving the local endpoint to
// pod2 moves the traffic, a UDP flow that keeps its source port included
// (conntrack cleared); an empty state leaves no rule and no answer.
func TestScriptTraffic(t *testing.T) {
	netns.RequirePrivileged(t)
	b := netns.Blog(t)
	s := newScriptRunner(t, b.Node)
	sticky := netip.AddrPortFrom(netns.ServiceV4, 7000)
	const udpPort = 40001

	if stderr := s.mustRun(golden(t)); stderr != "" {
		t.Errorf("unexpected stderr: %s", stderr)
	}
	save := natSave(t, b.Node)
	for _, want := range []string{
		"-A PREROUTING -m comment --comment kpng-example-allip -j KPNG-ALLIP",
		"-A OUTPUT -m comment --comment kpng-example-allip -j KPNG-ALLIP",
		`-A KPNG-ALLIP -d 10.0.0.55/32 -m comment --comment "default/kpng-example" -j DNAT --to-destination 11.0.2.2`,
		`-A KPNG-ALLIP -d 1000::55/128 -m comment --comment "default/kpng-example" -j DNAT --to-destination 1100::202`,
	} {
		if !strings.Contains(save, want) {
			t.Errorf("nat tables lack %q:\n%s", want, save)
		}
	}
	b.ExpectService(t, b.Client, netns.PodID)
	b.ExpectService(t, b.Node, netns.PodID)
	if a, err := b.Client.Ask("udp", sticky, netns.AskOptions{LocalPort: udpPort}); err != nil || a.Server != netns.PodID {
		t.Fatalf("sticky UDP flow: %v, %v; want %s", a, err, netns.PodID)
	}

	s.mustRun(golden(t, netns.Pod2V4, netns.Pod2V6))
	b.ExpectService(t, b.Client, netns.Pod2ID)
	b.ExpectService(t, b.Node, netns.Pod2ID)
	if a, err := b.Client.Ask("udp", sticky, netns.AskOptions{LocalPort: udpPort}); err != nil || a.Server != netns.Pod2ID {
		t.Errorf("sticky UDP flow after the change: %v, %v; want %s (stale conntrack entry?)", a, err, netns.Pod2ID)
	}

	s.mustRun(nil)
	if save := natSave(t, b.Node); strings.Contains(strings.ToLower(save), "kpng") {
		t.Errorf("empty state: rules left:\n%s", save)
	}
	b.ExpectNoService(t, b.Client, 500*time.Millisecond)
	b.ExpectNoService(t, b.Node, 500*time.Millisecond)
	if a, err := b.Client.Ask("tcp", netip.AddrPortFrom(netns.Pod2V6, 8080), netns.AskOptions{}); err != nil || a.Server != netns.Pod2ID {
		t.Errorf("pod2 directly: %v, %v", a, err)
	}
}

// TestScriptIdempotent checks that the same state gives the same tables,
// whatever ran before, with one jump per hook.
func TestScriptIdempotent(t *testing.T) {
	netns.RequirePrivileged(t)
	node := netns.New(t, "node")
	s := newScriptRunner(t, node)
	pristine := natSave(t, node)

	s.mustRun(golden(t))
	first := natSave(t, node)
	s.mustRun(golden(t))
	if second := natSave(t, node); second != first {
		t.Errorf("second run changed the tables:\n%s", cmp.Diff(first, second))
	}
	for _, hook := range []string{"PREROUTING", "OUTPUT"} {
		if n := strings.Count(first, "-A "+hook+" -m comment --comment kpng-example-allip -j KPNG-ALLIP"); n != 2 { // iptables + ip6tables
			t.Errorf("%d jumps from %s, want one per family:\n%s", n, hook, first)
		}
	}
	s.mustRun(golden(t, netns.Pod2V4))
	s.mustRun(golden(t))
	if again := natSave(t, node); again != first {
		t.Errorf("back to the first state, tables differ:\n%s", cmp.Diff(first, again))
	}
	s.mustRun([]byte("\n"))
	s.mustRun(nil)
	if empty := natSave(t, node); empty != pristine {
		t.Errorf("empty state twice: tables differ from before the first run:\n%s", cmp.Diff(pristine, empty))
	}
}

// TestScriptBadInput checks that input that is not a state fails with a
// message and leaves the rules alone, and that bad entries are skipped with
// a warning while the rest applies.
func TestScriptBadInput(t *testing.T) {
	netns.RequirePrivileged(t)
	node := netns.New(t, "node")
	s := newScriptRunner(t, node)
	s.mustRun(golden(t))
	before := natSave(t, node)
	for _, bad := range []string{
		"not json",
		`{"Service":`,
		"42",
		`[1]`,
		`{"Service":{"IPs":{"ExternalIPs":{"V4":"10.0.0.55"}}}}`,
		`{"Service":{"Name":"x"},"Endpoints":{"a":1}}`,
	} {
		stderr, err := s.run([]byte(bad))
		if err == nil {
			t.Errorf("input %q accepted", bad)
		}
		if !strings.Contains(stderr, "kpng-example-allip: invalid state on stdin") {
			t.Errorf("input %q: stderr %q lacks the reason", bad, stderr)
		}
		if after := natSave(t, node); after != before {
			t.Errorf("input %q changed the rules:\n%s", bad, cmp.Diff(before, after))
		}
	}
}

// TestScriptMatchesGo feeds the same states to the script and to
// allip.Rules and compares the rules; the problems reported by Rules must
// be warned about by the script.
func TestScriptMatchesGo(t *testing.T) {
	netns.RequirePrivileged(t)
	node := netns.New(t, "node")
	s := newScriptRunner(t, node)
	states := map[string]string{
		"golden": string(golden(t)),
		"moved":  string(golden(t, netns.Pod2V4, netns.Pod2V6)),
		"blog post, no Ready": `{"Service":{"Namespace":"default","Name":"kpng-example","Type":"ClusterIP","IPs":{"ClusterIPs":{},"ExternalIPs":{"V4":["10.0.0.55"],"V6":["1000::55"]},"Headless":true},"Ports":[{"Protocol":1,"Port":6000,"TargetPort":6000}]},` +
			`"Endpoints":[{"IPs":{"V6":["1100::202"]},"Local":true},{"IPs":{"V4":["11.0.2.2"]},"Local":true},{"IPs":{"V4":["11.0.1.2"]}},{"IPs":{"V6":["1100::102"]}}]}`,
		"ranks and several services": `
{"Service":{"Namespace":"b","Name":"two","IPs":{"ExternalIPs":{"V4":["10.0.0.9","10.0.0.7"]}}},"Endpoints":[{"IPs":{"V4":["11.0.2.8"]},"Local":true},{"IPs":{"V4":["11.0.2.9"]},"Local":true,"Serving":true}]}
{"Service":{"Namespace":"a","Name":"one","IPs":{"ExternalIPs":{"V4":["10.0.0.8"],"V6":["1000::1","1000::2"]}}},"Endpoints":[{"IPs":{"V6":["1100::7"]},"Local":true},{"IPs":{"V6":["1100::8"]},"Local":true,"Ready":true},{"IPs":{"V4":["11.0.9.9"]},"Ready":true}]}`,
		"conflict and bad addresses": `[
{"Service":{"Namespace":"ns","Name":"zz","IPs":{"ExternalIPs":{"V4":["10.0.0.55","10.0.0.300"],"V6":["fe80::1%eth0","1::2::3","1000::55"]}}},"Endpoints":[{"IPs":{"V4":["11.0.2.3"],"V6":["1100::203"]},"Local":true,"Ready":true}]},
{"Service":{"Namespace":"ns","Name":"aa","IPs":{"ExternalIPs":{"V4":["10.0.0.55","1000::56"]}}},"Endpoints":[{"IPs":{"V4":["bogus"]},"Local":true,"Ready":true},{"IPs":{"V4":["11.0.2.2"]},"Local":true}]},
{"Endpoints":[]}]`,
		"empty": "",
	}
	for name, state := range states {
		t.Run(name, func(t *testing.T) {
			items, err := allip.ReadState(strings.NewReader(state))
			if err != nil {
				t.Fatal(err)
			}
			want, problems := allip.Rules(items)
			stderr := s.mustRun([]byte(state))
			got := scriptRules(t, node)
			if diff := cmp.Diff(want, got, addrCmp); diff != "" {
				t.Errorf("script rules differ from allip.Rules (-go +script):\n%s", diff)
			}
			if warnings := strings.Count(stderr, "warning:"); warnings != len(problems) {
				t.Errorf("script printed %d warnings, allip.Rules reported %d problems:\n%s\n%v", warnings, len(problems), stderr, problems)
			}
		})
	}
}

// buildProgram builds kpng-allip into a temporary directory.
func buildProgram(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "kpng-allip")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestProgramTraffic runs the kpng-allip binary in the node of the blog's
// topology with --state (from a file, then from stdin), then --cleanup.
func TestProgramTraffic(t *testing.T) {
	netns.RequirePrivileged(t)
	bin := buildProgram(t)
	b := netns.Blog(t)
	state := filepath.Join(t.TempDir(), "state.json")
	if err := os.WriteFile(state, golden(t), 0o644); err != nil {
		t.Fatal(err)
	}
	b.Node.MustExec(bin, "--state="+state)
	b.ExpectService(t, b.Client, netns.PodID)
	b.ExpectService(t, b.Node, netns.PodID)
	blog := model.ServiceKey{Namespace: "default", Name: "kpng-example"}
	want := []allip.Rule{{External: netns.ServiceV4, Target: netns.PodV4, Service: blog}, {External: netns.ServiceV6, Target: netns.PodV6, Service: blog}}
	if got := nftRules(t, b.Node); !cmp.Equal(want, got, addrCmp) {
		t.Errorf("nftables rules %v, want %v", got, want)
	}
	if _, err := exec.LookPath("nft"); err == nil {
		ruleset := b.Node.MustExec("nft", "list", "ruleset")
		for _, want := range []string{"table ip kpng-allip", "table ip6 kpng-allip", "ip daddr 10.0.0.55 dnat to 11.0.2.2", "ip6 daddr 1000::55 dnat to 1100::202"} {
			if !strings.Contains(ruleset, want) {
				t.Errorf("nft list ruleset lacks %q:\n%s", want, ruleset)
			}
		}
	}

	if _, _, err := b.Node.Exec(golden(t, netns.Pod2V4, netns.Pod2V6), bin, "--state=-"); err != nil {
		t.Fatal(err)
	}
	b.ExpectService(t, b.Client, netns.Pod2ID)

	// Bad input: an error, and the rules stay.
	_, stderr, err := b.Node.Exec([]byte(`{"Service": 12}`), bin, "--state=-")
	if err == nil || !strings.Contains(stderr, "JSON value 1") {
		t.Errorf("bad JSON: err %v, stderr %q; want a failure locating the bad value", err, stderr)
	}
	b.ExpectService(t, b.Client, netns.Pod2ID)

	for _, args := range [][]string{{"--cleanup", "--state=-"}, {"extra"}, {"--no-such-flag"}} {
		cmd := exec.Command("ip", append([]string{"netns", "exec", b.Node.Name, bin}, args...)...)
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
			t.Errorf("kpng-allip %v: %v (%s), want exit status 2", args, err, out)
		}
	}

	b.Node.MustExec(bin, "--cleanup")
	if got := nftRules(t, b.Node); got != nil {
		t.Errorf("after --cleanup: rules %v", got)
	}
	if out, _, err := b.Node.Exec(nil, "nft", "list", "ruleset"); err == nil && strings.Contains(out, allip.TableName) {
		t.Errorf("after --cleanup, nft list ruleset shows:\n%s", out)
	}
	b.ExpectNoService(t, b.Client, 500*time.Millisecond)
	b.Node.MustExec(bin, "--cleanup") // nothing to clean: still fine
}

// nftRules reads kpng-allip's nftables rules in ns (nil when its tables are
// absent).
func nftRules(t *testing.T, ns *netns.NS) []allip.Rule {
	t.Helper()
	f, err := os.Open(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	conn, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	rules, err := allip.Current(conn)
	if err != nil {
		t.Fatal(err)
	}
	return rules
}

// TestScriptFamilyInOneTransaction checks, with the kernel's nftables
// notifications (iptables-nft), that the script programs each family of a
// new service in one transaction: the chain's DNAT rule and the jumps from
// PREROUTING and OUTPUT appear in the same ruleset generation. Added one
// after the other, the jumps left a moment where traffic entering the node
// was DNATed and the node's own was not (TestScriptWithCallout failed so:
// the client was served, the node's next request was not).
func TestScriptFamilyInOneTransaction(t *testing.T) {
	netns.RequirePrivileged(t)
	node := netns.New(t, "node")
	s := newScriptRunner(t, node)
	f, err := os.Open(node.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	conn, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseLasting()
	mon := nftables.NewMonitor(nftables.WithMonitorEventBuffer(64))
	gens, err := conn.AddGenerationalMonitor(mon)
	if err != nil {
		t.Fatalf("nftables monitor in %s: %v", node, err)
	}
	defer mon.Close()

	s.mustRun(golden(t))

	// The notifications of a transaction are sent when it commits, before
	// the script's iptables-restore returns: they are all queued now.
	// Each generation is listed as the family and chain of each new rule
	// ("ip6 OUTPUT"); the script's chain is KPNG-ALLIP.
	want := map[string]bool{}
	var got [][]string
	for len(want) < 6 {
		var g *nftables.MonitorEvents
		select {
		case g = <-gens:
		case <-time.After(10 * time.Second):
			t.Fatalf("nftables notifications: got %v, want the rules of both families", got)
		}
		var rules []string
		for _, ev := range g.Changes {
			r, ok := ev.Data.(*nftables.Rule)
			if ev.Type != nftables.MonitorEventTypeNewRule || !ok || r == nil || r.Table == nil || r.Chain == nil {
				continue
			}
			fam := map[nftables.TableFamily]string{nftables.TableFamilyIPv4: "ip", nftables.TableFamilyIPv6: "ip6"}[r.Table.Family]
			rules = append(rules, fam+" "+r.Chain.Name)
			want[fam+" "+r.Chain.Name] = true
		}
		if rules != nil {
			got = append(got, rules)
		}
	}
	for _, fam := range []string{"ip", "ip6"} {
		hooks := []string{fam + " KPNG-ALLIP", fam + " OUTPUT", fam + " PREROUTING"}
		found := false
		for _, g := range got {
			if slices.Contains(g, hooks[0]) {
				g = slices.Sorted(slices.Values(g))
				found = true
				if !slices.Equal(slices.Compact(g), hooks) {
					t.Errorf("%s: the generation adding the DNAT rule added rules in %v, want %v (the rule and both jumps together); all generations: %v", fam, slices.Compact(g), hooks, got)
				}
			}
		}
		if !found {
			t.Errorf("%s: no generation added the DNAT rule; generations: %v", fam, got)
		}
	}
}

// udpFlows returns, for each UDP conntrack entry of ns whose original
// destination is ext, the client's source port and the reply's source: the
// DNAT target, or ext itself if the flow was not DNATed.
func udpFlows(t *testing.T, ns *netns.NS, ext netip.Addr) map[uint16]netip.Addr {
	t.Helper()
	fam := "ipv4"
	if ext.Is6() {
		fam = "ipv6"
	}
	out := ns.MustExec("conntrack", "-L", "-f", fam, "-p", "udp", "--orig-dst", ext.String())
	flows := map[uint16]netip.Addr{}
	for _, line := range strings.Split(out, "\n") {
		var sport uint16
		var reply netip.Addr
		srcs := 0
		for _, w := range strings.Fields(line) {
			k, v, _ := strings.Cut(w, "=")
			switch {
			case k == "src":
				srcs++
				if srcs == 2 {
					reply, _ = netip.ParseAddr(v)
				}
			case k == "sport" && sport == 0:
				p, _ := strconv.ParseUint(v, 10, 16)
				sport = uint16(p)
			}
		}
		if sport != 0 && reply.IsValid() {
			flows[sport] = reply
		}
	}
	return flows
}

// TestScriptKeepsFlowsToNewTarget checks which UDP conntrack entries the
// script deletes when an external IP gets a target: a flow that was not
// DNATed (sent before any rule) is deleted, so that it reaches the pod now;
// a flow already DNATed to the new target is kept. The second is what a
// client sees when its flow starts between the script's iptables-restore
// and its conntrack clearing; deleting its entry lost the reply in flight
// (not un-DNATed without its entry, it was dropped by the client). The test
// makes that flow with a DNAT rule of its own in PREROUTING, for its source
// port only, removed before the script runs.
func TestScriptKeepsFlowsToNewTarget(t *testing.T) {
	netns.RequirePrivileged(t)
	b := netns.Blog(t)
	s := newScriptRunner(t, b.Node)
	const early, racing = 40021, 40022
	for _, c := range []struct {
		ipt      string
		ext, pod netip.Addr
	}{
		{"iptables", netns.ServiceV4, netns.PodV4},
		{"ip6tables", netns.ServiceV6, netns.PodV6},
	} {
		dst := netip.AddrPortFrom(c.ext, 7000)
		// The rule also makes the kernel track connections in the
		// namespace, which it does only once a table uses conntrack.
		rule := []string{"-w", "-t", "nat", "PREROUTING", "-p", "udp", "--sport", strconv.Itoa(racing), "-d", c.ext.String(), "-j", "DNAT", "--to-destination", c.pod.String()}
		b.Node.MustExec(c.ipt, slices.Insert(slices.Clone(rule), 3, "-I")...)
		if a, err := b.Client.Ask("udp", dst, netns.AskOptions{LocalPort: early, Timeout: 300 * time.Millisecond}); err == nil {
			t.Fatalf("%s from port %d answered without a rule for it: %v", dst, early, a)
		}
		if a, err := b.Client.Ask("udp", dst, netns.AskOptions{LocalPort: racing}); err != nil || a.Server != netns.PodID {
			t.Fatalf("%s from port %d through the test's own rule: %v, %v; want %s", dst, racing, a, err, netns.PodID)
		}
		b.Node.MustExec(c.ipt, slices.Insert(slices.Clone(rule), 3, "-D")...)
		want := map[uint16]netip.Addr{early: c.ext, racing: c.pod}
		if got := udpFlows(t, b.Node, c.ext); !cmp.Equal(want, got, addrCmp) {
			t.Fatalf("UDP flows to %s before the script: %v, want %v", c.ext, got, want)
		}
	}

	s.mustRun(golden(t))
	for _, c := range []struct{ ext, pod netip.Addr }{{netns.ServiceV4, netns.PodV4}, {netns.ServiceV6, netns.PodV6}} {
		want := map[uint16]netip.Addr{racing: c.pod}
		if got := udpFlows(t, b.Node, c.ext); !cmp.Equal(want, got, addrCmp) {
			t.Errorf("UDP flows to %s after the script: %v, want %v (the flow not DNATed deleted, the one DNATed to %s kept)", c.ext, got, want, c.pod)
		}
		if a, err := b.Client.Ask("udp", netip.AddrPortFrom(c.ext, 7000), netns.AskOptions{LocalPort: early}); err != nil || a.Server != netns.PodID {
			t.Errorf("%s from port %d, not DNATed before the script: %v, %v; want %s", c.ext, early, a, err, netns.PodID)
		}
	}
}
