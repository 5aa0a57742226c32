//go:build linux

package allip

import (
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/model"
)

// TestNFTExprsRoundTrip checks that Current can read what Apply writes,
// without the kernel.
func TestNFTExprsRoundTrip(t *testing.T) {
	for _, r := range []Rule{
		{ip("10.0.0.55"), ip("11.0.2.2"), key("default", "kpng-example")},
		{ip("1000::55"), ip("1100::202"), key("default", "kpng-example")},
	} {
		f := nftFamilies[0]
		if r.External.Is6() {
			f = nftFamilies[1]
		}
		nr := &nftables.Rule{Exprs: f.exprs(r), UserData: userdataComment(r)}
		got, err := decodeRule(f, nr)
		if err != nil || got != r {
			t.Errorf("decode(encode(%v)) = %v, %v", r, got, err)
		}
		other := nftFamilies[0]
		if f == other {
			other = nftFamilies[1]
		}
		if _, err := decodeRule(other, nr); err == nil {
			t.Errorf("rule %v decoded in the other family", r)
		}
	}
}

// blogState reads the golden state of examples/json, with the local
// endpoints moved to the addresses to (v4 then v6) if any.
func blogState(t *testing.T, to ...netip.Addr) []*model.ServiceEndpoints {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "json", "testdata", "kpng-example.golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	items, err := ReadState(strings.NewReader(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range to {
		for _, ep := range items[0].Endpoints {
			if !ep.Local {
				continue
			}
			if a.Is4() && len(ep.IPs.V4) > 0 {
				ep.IPs.V4 = []string{a.String()}
			}
			if a.Is6() && len(ep.IPs.V6) > 0 {
				ep.IPs.V6 = []string{a.String()}
			}
		}
	}
	return items
}

// nodeProxier returns a Proxier working in the Blog node's namespace.
func nodeProxier(t *testing.T, b *netns.BlogTopology) *Proxier {
	t.Helper()
	f, err := os.Open(b.Node.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	conn, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		t.Fatalf("nftables in %s: %v", b.Node, err)
	}
	h, err := netlink.NewHandleAt(vnetns.NsHandle(int(f.Fd())))
	if err != nil {
		t.Fatalf("netlink in %s: %v", b.Node, err)
	}
	t.Cleanup(h.Close)
	return &Proxier{NFT: conn, Conntrack: h}
}

func mustSync(t *testing.T, p *Proxier, items []*model.ServiceEndpoints) Result {
	t.Helper()
	res, err := p.Sync(items)
	if err != nil {
		t.Fatalf("Sync: %v", err)
	}
	if res.Problems != nil {
		t.Fatalf("Sync: problems in the state: %v", res.Problems)
	}
	return res
}

func hasTable(t *testing.T, conn *nftables.Conn, fam nftables.TableFamily) bool {
	t.Helper()
	tables, err := conn.ListTablesOfFamily(fam)
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		if tb.Name == TableName {
			return true
		}
	}
	return false
}

// TestProxierTraffic drives a Proxier in the node of the blog's topology
// and checks real traffic: the blog's state sends TCP and UDP on any port
// of both external IPs to the local pod, from outside and from the node; a
// new local endpoint takes the traffic over, including a UDP flow that keeps
// its source port (conntrack cleared); an empty state removes the tables
// and the service stops answering.
func TestProxierTraffic(t *testing.T) {
	netns.RequirePrivileged(t)
	b := netns.Blog(t)
	p := nodeProxier(t, b)
	const udpPort = 40000
	sticky := netip.AddrPortFrom(netns.ServiceV4, 7000)

	res := mustSync(t, p, blogState(t))
	blog := key("default", "kpng-example")
	want := []Rule{{netns.ServiceV4, netns.PodV4, blog}, {netns.ServiceV6, netns.PodV6, blog}}
	if diff := cmp.Diff(want, res.Rules, addrCmp); diff != "" {
		t.Fatalf("rules (-want +got):\n%s", diff)
	}
	cur, err := Current(p.NFT)
	if err != nil || !cmp.Equal(want, cur, addrCmp) {
		t.Fatalf("Current = %v, %v; want %v", cur, err, want)
	}
	if _, err := exec.LookPath("nft"); err == nil {
		out := b.Node.MustExec("nft", "list", "ruleset")
		for _, s := range []string{
			"table ip kpng-allip", "table ip6 kpng-allip",
			"type nat hook prerouting priority dstnat", "type nat hook output priority -100",
			`ip daddr 10.0.0.55 dnat to 11.0.2.2 comment "default/kpng-example"`,
			`ip6 daddr 1000::55 dnat to 1100::202 comment "default/kpng-example"`,
		} {
			if !strings.Contains(out, s) {
				t.Errorf("nft list ruleset lacks %q:\n%s", s, out)
			}
		}
	}
	b.ExpectService(t, b.Client, netns.PodID)
	b.ExpectService(t, b.Node, netns.PodID)
	if a, err := b.Client.Ask("udp", sticky, netns.AskOptions{LocalPort: udpPort}); err != nil || a.Server != netns.PodID {
		t.Fatalf("sticky UDP flow: %v, %v; want %s", a, err, netns.PodID)
	}

	// The same state again changes nothing.
	if res := mustSync(t, p, blogState(t)); len(res.Changed) != 0 || res.ConntrackDeleted != 0 {
		t.Errorf("same state: changed %v, %d conntrack entries deleted; want nothing", res.Changed, res.ConntrackDeleted)
	}

	res = mustSync(t, p, blogState(t, netns.Pod2V4, netns.Pod2V6))
	if diff := cmp.Diff([]netip.Addr{netns.ServiceV4, netns.ServiceV6}, res.Changed, addrCmp); diff != "" {
		t.Errorf("changed (-want +got):\n%s", diff)
	}
	if res.ConntrackDeleted == 0 {
		t.Errorf("no conntrack entry deleted, want at least the sticky UDP flow's")
	}
	b.ExpectService(t, b.Client, netns.Pod2ID)
	b.ExpectService(t, b.Node, netns.Pod2ID)
	if a, err := b.Client.Ask("udp", sticky, netns.AskOptions{LocalPort: udpPort}); err != nil || a.Server != netns.Pod2ID {
		t.Errorf("sticky UDP flow after the change: %v, %v; want %s (stale conntrack entry?)", a, err, netns.Pod2ID)
	}

	res = mustSync(t, p, nil)
	if res.Rules != nil {
		t.Errorf("empty state: rules %v", res.Rules)
	}
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyIPv6} {
		if hasTable(t, p.NFT, fam) {
			t.Errorf("empty state: table %s (family %d) still there", TableName, fam)
		}
	}
	if out, _, err := b.Node.Exec(nil, "nft", "list", "ruleset"); err == nil && strings.Contains(out, TableName) {
		t.Errorf("empty state: nft list ruleset still shows %s:\n%s", TableName, out)
	}
	b.ExpectNoService(t, b.Client, 500*time.Millisecond)
	// The pods themselves are still there: it is the rules that are gone.
	if a, err := b.Client.Ask("tcp", netip.AddrPortFrom(netns.Pod2V4, 6000), netns.AskOptions{}); err != nil || a.Server != netns.Pod2ID {
		t.Errorf("pod2 directly: %v, %v", a, err)
	}
}

// TestApplyIsOneTransaction makes the kernel reject the last message of an
// Apply batch and checks that the table deletion earlier in the same batch
// did not happen: the previous rules are intact and still serve.
func TestApplyIsOneTransaction(t *testing.T) {
	netns.RequirePrivileged(t)
	b := netns.Blog(t)
	p := nodeProxier(t, b)
	before := mustSync(t, p, blogState(t)).Rules

	next, _ := Rules(blogState(t, netns.Pod2V4, netns.Pod2V6))
	err := apply(p.NFT, next, func(c *nftables.Conn) {
		t := &nftables.Table{Name: TableName, Family: nftables.TableFamilyIPv4}
		c.AddRule(&nftables.Rule{Table: t, Chain: &nftables.Chain{Name: "no-such-chain", Table: t}})
	})
	if err == nil {
		t.Fatal("the poisoned batch was accepted")
	}
	cur, err := Current(p.NFT)
	if err != nil || !cmp.Equal(before, cur, addrCmp) {
		t.Fatalf("after a failed batch: %v, %v; want the previous rules %v", cur, err, before)
	}
	b.ExpectService(t, b.Client, netns.PodID)

	// Invalid rules are refused before anything is sent.
	if err := Apply(p.NFT, []Rule{{External: netns.ServiceV4, Target: netns.PodV6}}); err == nil {
		t.Error("Apply accepted a rule mixing families")
	}
	if cur, _ := Current(p.NFT); !cmp.Equal(before, cur, addrCmp) {
		t.Errorf("an invalid Apply changed the rules to %v", cur)
	}

	if err := Cleanup(p.NFT); err != nil {
		t.Fatal(err)
	}
	if cur, err := Current(p.NFT); err != nil || cur != nil {
		t.Errorf("after Cleanup: %v, %v", cur, err)
	}
	if err := Cleanup(p.NFT); err != nil {
		t.Errorf("Cleanup without tables: %v", err)
	}
}

// udpFlows returns, for each UDP conntrack entry of h's namespace whose
// original destination is ext, the client's source port and the reply's
// source: the DNAT target, or ext itself if the flow was not DNATed.
func udpFlows(t *testing.T, h *netlink.Handle, ext netip.Addr) map[uint16]netip.Addr {
	t.Helper()
	fam := netlink.InetFamily(unix.AF_INET)
	if ext.Is6() {
		fam = unix.AF_INET6
	}
	list, err := h.ConntrackTableList(netlink.ConntrackTable, fam)
	if err != nil {
		t.Fatalf("conntrack entries: %v", err)
	}
	flows := map[uint16]netip.Addr{}
	for _, f := range list {
		dst, _ := netip.AddrFromSlice(f.Forward.DstIP)
		reply, _ := netip.AddrFromSlice(f.Reverse.SrcIP)
		if f.Forward.Protocol == unix.IPPROTO_UDP && dst.Unmap() == ext {
			flows[f.Forward.SrcPort] = reply.Unmap()
		}
	}
	return flows
}

// TestProxierKeepsFlowsToNewTarget checks which UDP conntrack entries Sync
// deletes when an external IP gets a target: a flow that was not DNATed
// (sent before any rule) is deleted, so that it reaches the pod now; a flow
// already DNATed to the new target is kept. The second is what a client
// sees when its flow starts between the rules' transaction and the
// conntrack clearing; deleting its entry lost the reply in flight (not
// un-DNATed without its entry, it was dropped by the client). The test makes
// that flow with an iptables DNAT rule of its own, for its source port only,
// removed before Sync.
func TestProxierKeepsFlowsToNewTarget(t *testing.T) {
	netns.RequirePrivileged(t)
	netns.RequireCommands(t, "iptables", "ip6tables")
	b := netns.Blog(t)
	p := nodeProxier(t, b)
	const early, racing = 40031, 40032
	cases := []struct {
		ipt      string
		ext, pod netip.Addr
	}{
		{"iptables", netns.ServiceV4, netns.PodV4},
		{"ip6tables", netns.ServiceV6, netns.PodV6},
	}
	for _, c := range cases {
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
		if got := udpFlows(t, p.Conntrack, c.ext); !cmp.Equal(want, got, addrCmp) {
			t.Fatalf("UDP flows to %s before Sync: %v, want %v", c.ext, got, want)
		}
	}

	res := mustSync(t, p, blogState(t))
	if res.ConntrackDeleted != 2 {
		t.Errorf("%d conntrack entries deleted, want 2 (the flows not DNATed)", res.ConntrackDeleted)
	}
	for _, c := range cases {
		want := map[uint16]netip.Addr{racing: c.pod}
		if got := udpFlows(t, p.Conntrack, c.ext); !cmp.Equal(want, got, addrCmp) {
			t.Errorf("UDP flows to %s after Sync: %v, want %v (the flow not DNATed deleted, the one DNATed to %s kept)", c.ext, got, want, c.pod)
		}
		if a, err := b.Client.Ask("udp", netip.AddrPortFrom(c.ext, 7000), netns.AskOptions{LocalPort: early}); err != nil || a.Server != netns.PodID {
			t.Errorf("%s from port %d, not DNATed before Sync: %v, %v; want %s", c.ext, early, a, err, netns.PodID)
		}
	}
}
