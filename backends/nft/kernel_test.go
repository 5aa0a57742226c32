//go:build linux

package nft

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"

	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/localsink/sinktest"
	"sigs.k8s.io/kpng/model"
)

// A third pod, added to the Blog topology by kernelTopology.
var (
	pod3V4 = netip.MustParseAddr("11.0.2.4")
	pod3V6 = netip.MustParseAddr("1100::204")
)

const pod3ID = "pod3"

// Cluster IPs of the test services: the client routes them to the node by
// default (netns.Blog), no namespace holds them.
var (
	webV4 = netip.MustParseAddr("10.96.0.10")
	webV6 = netip.MustParseAddr("fd00:10:96::10")
)

// kernelTopology is netns.Blog plus a third pod (pod3) on the node.
func kernelTopology(t *testing.T) *netns.BlogTopology {
	t.Helper()
	netns.RequirePrivileged(t)
	netns.RequireCommands(t, "nft")
	b := netns.Blog(t)
	p := netns.New(t, "pod3")
	netns.Veth(t, b.Node, "vpod3", p, "eth0")
	b.Node.AddAddr("vpod3", netns.GatewayV4.String()+"/32")
	b.Node.AddAddr("vpod3", netns.GatewayV6.String()+"/128")
	b.Node.AddRoute(pod3V4.String()+"/32", "dev", "vpod3")
	b.Node.AddRoute(pod3V6.String()+"/128", "dev", "vpod3")
	p.AddAddr("eth0", pod3V4.String()+"/32")
	p.AddAddr("eth0", pod3V6.String()+"/128")
	p.AddRoute("default", "via", netns.GatewayV4.String(), "dev", "eth0", "onlink")
	p.AddRoute("default", "via", netns.GatewayV6.String(), "dev", "eth0", "onlink")
	p.Serve(pod3ID, []netip.Addr{pod3V4, pod3V6}, netns.BlogPorts)
	return b
}

// nsFD opens the namespace ns and returns its file descriptor, which
// stays open until tb ends.
func nsFD(tb testing.TB, ns *netns.NS) int {
	tb.Helper()
	f, err := os.Open(ns.Path())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { f.Close() })
	return int(f.Fd())
}

// connIn returns a connection factory for the namespace ns.
func connIn(tb testing.TB, ns *netns.NS) func(...nftables.ConnOption) (*nftables.Conn, error) {
	tb.Helper()
	return ConnInNetNS(nsFD(tb, ns))
}

// edits holds the services a test has given a sink and builds their new
// values for each edit (a delivered value is never modified): apply
// delivers each one.
type edits struct {
	state map[model.ServiceKey]*model.ServiceEndpoints
	apply func(key model.ServiceKey, prev, cur *model.ServiceEndpoints)
}

// set gives service key its new state (nil: deleted).
func (e *edits) set(key model.ServiceKey, se *model.ServiceEndpoints) {
	prev := e.state[key]
	if se == nil {
		delete(e.state, key)
	} else {
		e.state[key] = se
	}
	e.apply(key, prev, se)
}

// setService replaces a service's Service, keeping its endpoints.
func (e *edits) setService(svc *model.Service) {
	var eps []*model.Endpoint
	if old := e.state[svc.Key()]; old != nil {
		eps = old.Endpoints
	}
	e.set(svc.Key(), &model.ServiceEndpoints{Service: svc, Endpoints: eps})
}

// setEndpoint adds or replaces an endpoint of service key.
func (e *edits) setEndpoint(key model.ServiceKey, ep *model.Endpoint) {
	old := e.state[key]
	eps := slices.DeleteFunc(slices.Clone(old.Endpoints), func(x *model.Endpoint) bool { return x.Key() == ep.Key() })
	eps = append(eps, ep)
	slices.SortFunc(eps, model.CompareEndpoints)
	e.set(key, &model.ServiceEndpoints{Service: old.Service, Endpoints: eps})
}

// deleteEndpoint removes the endpoint epKey of service key.
func (e *edits) deleteEndpoint(key model.ServiceKey, epKey string) {
	old := e.state[key]
	eps := slices.DeleteFunc(slices.Clone(old.Endpoints), func(x *model.Endpoint) bool { return x.Key() == epKey })
	e.set(key, &model.ServiceEndpoints{Service: old.Service, Endpoints: eps})
}

// deleteService removes a service.
func (e *edits) deleteService(key model.ServiceKey) { e.set(key, nil) }

// testSink is the nft sink in the node, fed as kpng feeds it (a
// localsink.Feeder) through a contract checker, with the results of its
// transactions.
type testSink struct {
	edits
	nft     *Sink // the sink under test, for its configuration
	t       *testing.T
	feeder  *localsink.Feeder
	checker *sinktest.Checker
	mu      sync.Mutex // guards results: retries report from a timer
	results []SyncResult
	// stop ends the sink's context (its monitor and check stop: a
	// Cleanup of its table then stays).
	stop context.CancelFunc
}

// newTestSink returns a sink programming table kpng-<name> in the node;
// the table is removed when the test ends.
func newTestSink(t *testing.T, b *netns.BlogTopology, name string) *testSink {
	t.Helper()
	return newConfigSink(t, b, Config{ServiceProxyName: name}, localsink.FeederOptions{NoRetry: true})
}

// newConfigSink is newTestSink with more configuration (cfg's Conn and
// AfterSync are set here) and the Feeder's options.
func newConfigSink(t *testing.T, b *netns.BlogTopology, cfg Config, fopts localsink.FeederOptions) *testSink {
	t.Helper()
	ts := &testSink{t: t}
	conn := connIn(t, b.Node)
	cfg.Conn = conn
	cfg.Conntrack = conntrackIn(t, b.Node)
	cfg.AfterSync = func(r SyncResult) {
		ts.mu.Lock()
		defer ts.mu.Unlock()
		ts.results = append(ts.results, r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts.nft, ts.stop = s, cancel
	ts.checker = sinktest.NewChecker(s)
	ts.feeder = localsink.NewFeeder(ts.checker, fopts)
	ts.edits = edits{state: map[model.ServiceKey]*model.ServiceEndpoints{},
		apply: func(key model.ServiceKey, _, cur *model.ServiceEndpoints) { ts.feeder.Update(key, cur) }}
	t.Cleanup(func() {
		// The sink stops first: its monitor would repair what Cleanup
		// removes.
		cancel()
		ts.feeder.Close()
		if err := ts.checker.Err(); err != nil {
			t.Errorf("Sink contract broken:\n%v", err)
		}
		if err := Cleanup(context.Background(), Config{ServiceProxyName: cfg.ServiceProxyName, Conn: conn}); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return ts
}

// trySync ends the round and returns the Sync error (nil also when
// nothing changed, so nothing was sent).
func (ts *testSink) trySync() error { return ts.feeder.Sync() }

// allResults returns a copy of the results so far.
func (ts *testSink) allResults() []SyncResult {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return slices.Clone(ts.results)
}

// sync calls Sync and returns its result, failing the test if the
// transaction failed or none was sent.
func (ts *testSink) sync() SyncResult {
	ts.t.Helper()
	n := len(ts.allResults())
	_ = ts.feeder.Sync()
	results := ts.allResults()
	if len(results) != n+1 {
		ts.t.Fatalf("Sync sent no transaction")
	}
	r := results[n]
	if r.Err != nil {
		ts.t.Fatalf("Sync: %v", r.Err)
	}
	return r
}

// restartSink stops old (its context ends, as the process of a
// restarted proxier is gone: its monitor would otherwise repair the new
// sink's first transaction as another program's), then starts a new sink
// on table kpng-<name>, gives it state and checks that its first sync is
// full.
func restartSink(t *testing.T, b *netns.BlogTopology, old *testSink, name string, state ...*model.ServiceEndpoints) *testSink {
	t.Helper()
	old.stop()
	s := newTestSink(t, b, name)
	s.setAll(state...)
	if r := s.sync(); !r.Full {
		t.Errorf("restart: first sync not full")
	}
	return s
}

// setAll sends a whole state after a Reset.
func (ts *testSink) setAll(items ...*model.ServiceEndpoints) {
	clear(ts.state)
	for _, se := range items {
		ts.state[se.Service.Key()] = se
	}
	ts.feeder.Reset()
	ts.feeder.SetAll(items)
}

// podEndpoints returns the endpoints (one per address) of the given pods
// ("pod", "pod2", "pod3").
func podEndpoints(ids ...string) []*model.Endpoint {
	addrs := map[string][2]netip.Addr{
		netns.PodID:  {netns.PodV4, netns.PodV6},
		netns.Pod2ID: {netns.Pod2V4, netns.Pod2V6},
		pod3ID:       {pod3V4, pod3V6},
	}
	var eps []*model.Endpoint
	for _, id := range ids {
		for _, a := range addrs[id] {
			e := ep(a.String(), true)
			e.NodeName = "node"
			// The named port "alt": pod serves it on 7000, pod2 on 8080,
			// pod3 not at all.
			switch id {
			case netns.PodID:
				e.PortOverrides = map[string]int32{"alt": 7000}
			case netns.Pod2ID:
				e.PortOverrides = map[string]int32{"alt": 8080}
			}
			eps = append(eps, e)
		}
	}
	return eps
}

// webService is a dual-stack ClusterIP service: TCP and UDP 80 to 6000,
// and the named TCP port "alt" (81).
func webService() *model.Service {
	return svc("default", "web", ipset(webV4.String(), webV6.String()),
		tcp(80, 6000), udp(80, 6000),
		&model.PortMapping{Name: "alt", Protocol: model.TCP, Port: 81, TargetPortName: "alt"})
}

// podAddr returns the address of pod id in the family of like.
func podAddr(id string, like netip.Addr) netip.Addr {
	m := map[string][2]netip.Addr{
		netns.PodID:  {netns.PodV4, netns.PodV6},
		netns.Pod2ID: {netns.Pod2V4, netns.Pod2V6},
		pod3ID:       {pod3V4, pod3V6},
	}
	if like.Is4() {
		return m[id][0]
	}
	return m[id][1]
}

// spread sends n requests to dst from ns and counts the answering
// servers, checking that each answer came from the server's own address on
// wantPort[server].
func spread(t *testing.T, from *netns.NS, network string, dst netip.AddrPort, n int, wantPort map[string]uint16) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for range n {
		a, err := from.Ask(network, dst, netns.AskOptions{})
		if err != nil {
			t.Errorf("%v", err)
			continue
		}
		counts[a.Server]++
		want := netip.AddrPortFrom(podAddr(a.Server, dst.Addr()), wantPort[a.Server])
		if a.Local != want {
			t.Errorf("%s %s: %s answered on %s, want %s", network, dst, a.Server, a.Local, want)
		}
	}
	return counts
}

// nftList returns the listing of the tables named table in ns: its ip
// table, then its ip6 table.
func nftList(t *testing.T, ns *netns.NS, table string) string {
	t.Helper()
	var b strings.Builder
	for _, family := range []string{"ip", "ip6"} {
		out, _, err := ns.Exec(nil, "nft", "list", "table", family, table)
		if err != nil {
			t.Fatalf("nft list table %s %s: %v", family, table, err)
		}
		b.WriteString(out)
	}
	return b.String()
}

func isRefused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

// TestKernelClusterIP programs a dual-stack ClusterIP service in the node
// and sends real TCP and UDP traffic from the client (and the node): it is
// spread over the three pods, a named target port reaches each pod on its
// own port, an endpoint change takes effect, no endpoints means refused
// (TCP reset, ICMP port unreachable), and deleting the service removes its
// rules and its traffic.
func TestKernelClusterIP(t *testing.T) {
	b := kernelTopology(t)
	s := newTestSink(t, b, "cip")
	web := webService()
	s.setAll(&model.ServiceEndpoints{Service: web, Endpoints: podEndpoints(netns.PodID, netns.Pod2ID, pod3ID)})
	if r := s.sync(); !r.Full {
		t.Errorf("first sync not full: %+v", r)
	}
	listing := nftList(t, b.Node, "kpng-cip")
	for _, want := range []string{
		"type nat hook prerouting priority dstnat", "type filter hook forward priority filter - 10",
		// A plain service of 3 endpoints: its key is in shard 3's set,
		// whose rule goes to the shard's chain, and whose map holds its
		// endpoints, one draw each.
		"set shard-ips-v4-3 {", `10.96.0.10 . tcp . 80 comment "default/web"`, `fd00:10:96::10 . udp . 80 comment "default/web"`,
		"ip daddr . meta l4proto . th dport @shard-ips-v4-3 goto shard4-3", "ip6 daddr . meta l4proto . th dport @shard-ips-v6-3 goto shard6-3",
		"numgen random mod 3 map @shard-endpoints-v4-3", "numgen random mod 3 map @shard-endpoints-v6-3",
		"10.96.0.10 . tcp . 80 . 0 ", "fd00:10:96::10 . udp . 80 . 2 ",
		": 11.0.2.4 . 6000", ": 1100::203 . 6000", ": 11.0.2.2 . 7000", ": 11.0.2.3 . 8080",
		`comment "svc4 default/web/tcp/80" : `, `comment "svc6 default/web/udp/80" : `,
	} {
		if !strings.Contains(listing, want) {
			t.Errorf("nft list table lacks %q:\n%s", want, listing)
		}
	}

	all := map[string]uint16{netns.PodID: 6000, netns.Pod2ID: 6000, pod3ID: 6000}
	for _, addr := range []netip.Addr{webV4, webV6} {
		for _, network := range []string{"tcp", "udp"} {
			counts := spread(t, b.Client, network, netip.AddrPortFrom(addr, 80), 60, all)
			t.Logf("%s %s: %v", network, addr, counts)
			for _, id := range []string{netns.PodID, netns.Pod2ID, pod3ID} {
				if counts[id] == 0 {
					t.Errorf("%s %s: %s never answered in 60 requests: %v", network, addr, id, counts)
				}
			}
		}
		// The named port: each pod on its own port, pod3 never.
		counts := spread(t, b.Client, "tcp", netip.AddrPortFrom(addr, 81), 30, map[string]uint16{netns.PodID: 7000, netns.Pod2ID: 8080})
		if counts[pod3ID] != 0 || counts[netns.PodID] == 0 || counts[netns.Pod2ID] == 0 {
			t.Errorf("named port on %s: %v, want pod and pod2 only", addr, counts)
		}
	}
	// From the node itself (nat output).
	if a, err := b.Node.Ask("tcp", netip.AddrPortFrom(webV4, 80), netns.AskOptions{}); err != nil || a.Local.Port() != 6000 {
		t.Errorf("from the node: %v, %v", a, err)
	}

	// Endpoint change: only pod remains.
	for _, e := range podEndpoints(netns.Pod2ID, pod3ID) {
		s.deleteEndpoint(web.Key(), e.Key())
	}
	if r := s.sync(); r.Full {
		t.Errorf("endpoint change made a full sync: %+v", r)
	}
	for _, addr := range []netip.Addr{webV4, webV6} {
		for _, network := range []string{"tcp", "udp"} {
			if counts := spread(t, b.Client, network, netip.AddrPortFrom(addr, 80), 10, all); counts[netns.PodID] != 10 {
				t.Errorf("after the change, %s %s: %v, want pod only", network, addr, counts)
			}
		}
	}

	// No endpoints: refused at once.
	for _, e := range podEndpoints(netns.PodID) {
		s.deleteEndpoint(web.Key(), e.Key())
	}
	s.sync()
	for _, addr := range []netip.Addr{webV4, webV6} {
		for _, network := range []string{"tcp", "udp"} {
			start := time.Now()
			a, err := b.Client.Ask(network, netip.AddrPortFrom(addr, 80), netns.AskOptions{Timeout: 2 * time.Second})
			if took := time.Since(start); err == nil || !isRefused(err) || took > time.Second {
				t.Errorf("no endpoints, %s %s: answer %v, error %v after %v; want refused at once", network, addr, a, err, took)
			}
		}
	}
	if listing := nftList(t, b.Node, "kpng-cip"); !strings.Contains(listing, `10.96.0.10 . tcp . 80 comment "default/web" : goto reject-chain`) || strings.Contains(listing, "dnat ip to") || strings.Contains(listing, "dnat ip6 to") {
		t.Errorf("no endpoints: want a reject element and no dnat:\n%s", listing)
	}

	// Back to one endpoint, then delete the service.
	for _, e := range podEndpoints(netns.PodID) {
		s.setEndpoint(web.Key(), e)
	}
	s.sync()
	if a, err := b.Client.Ask("tcp", netip.AddrPortFrom(webV4, 80), netns.AskOptions{}); err != nil || a.Server != netns.PodID {
		t.Fatalf("endpoint back: %v, %v", a, err)
	}
	for _, e := range podEndpoints(netns.PodID) {
		s.deleteEndpoint(web.Key(), e.Key())
	}
	s.deleteService(web.Key())
	s.sync()
	listing = nftList(t, b.Node, "kpng-cip")
	for _, gone := range []string{"default/web", "10.96.0.10", "fd00:10:96::10", "dnat ip to", "dnat ip6 to", "endpoints-v4", "endpoints-v6", "11.0.2.2"} {
		if strings.Contains(listing, gone) {
			t.Errorf("after deletion, the table still holds %q:\n%s", gone, listing)
		}
	}
	for _, addr := range []netip.Addr{webV4, webV6} {
		if a, err := b.Client.Ask("tcp", netip.AddrPortFrom(addr, 80), netns.AskOptions{Timeout: 300 * time.Millisecond}); err == nil || isRefused(err) {
			t.Errorf("after deletion, %s: answer %v, error %v; want no answer (no rule left)", addr, a, err)
		}
	}
}

// TestKernelExternalIPsAndRestart programs the blog's headless service
// (reached on its external IPs only), checks traffic from the client, then
// starts a second sink (a restarted proxier) on the same table with the
// same state: its first sync replaces the table in one transaction and the
// service keeps working.
func TestKernelExternalIPsAndRestart(t *testing.T) {
	b := kernelTopology(t)
	blog := svc("default", "kpng-example", model.IPSet{}, tcp(6000, 6000), udp(6000, 6000))
	blog.IPs.Headless = true
	blog.IPs.ExternalIPs = ipset(netns.ServiceV4.String(), netns.ServiceV6.String())
	state := &model.ServiceEndpoints{Service: blog, Endpoints: podEndpoints(netns.PodID)}
	check := func(when string) {
		t.Helper()
		for _, addr := range []netip.Addr{netns.ServiceV4, netns.ServiceV6} {
			for _, network := range []string{"tcp", "udp"} {
				a, err := b.Client.Ask(network, netip.AddrPortFrom(addr, 6000), netns.AskOptions{})
				if err != nil || a.Server != netns.PodID || a.Local != netip.AddrPortFrom(podAddr(netns.PodID, addr), 6000) {
					t.Errorf("%s: %s %s: %v, %v; want pod", when, network, addr, a, err)
				}
			}
			// Another port of the same address is not the service.
			if a, err := b.Client.Ask("tcp", netip.AddrPortFrom(addr, 7000), netns.AskOptions{Timeout: 300 * time.Millisecond}); err == nil {
				t.Errorf("%s: port 7000 of %s answered %v", when, addr, a)
			}
		}
	}

	first := newTestSink(t, b, "ext")
	first.setAll(state)
	first.sync()
	check("first proxier")

	restartSink(t, b, first, "ext", state)
	check("restarted proxier")
	out := b.Node.MustExec("nft", "list", "tables")
	if n := strings.Count(out, "kpng-ext\n"); n != 2 || !strings.Contains(out, "table ip kpng-ext\n") || !strings.Contains(out, "table ip6 kpng-ext\n") {
		t.Errorf("%d tables kpng-ext after the restart, want 2 (ip and ip6):\n%s", n, out)
	}
}

// TestKernelIgnoreHeadless: with Options.IgnoreHeadless (to-nft
// --ignore-headless), the blog's headless service is not served, as
// kube-proxy ignores headless services; without, it is (the default).
func TestKernelIgnoreHeadless(t *testing.T) {
	b := kernelTopology(t)
	blog := svc("default", "kpng-example", model.IPSet{}, tcp(6000, 6000))
	blog.IPs.Headless = true
	blog.IPs.ExternalIPs = ipset(netns.ServiceV4.String(), netns.ServiceV6.String())
	state := &model.ServiceEndpoints{Service: blog, Endpoints: podEndpoints(netns.PodID)}
	s := newConfigSink(t, b, Config{ServiceProxyName: "headless", Options: Options{IgnoreHeadless: true}}, localsink.FeederOptions{NoRetry: true})
	s.setAll(state)
	s.sync()
	for _, addr := range []netip.Addr{netns.ServiceV4, netns.ServiceV6} {
		if a, err := b.Client.Ask("tcp", netip.AddrPortFrom(addr, 6000), netns.AskOptions{Timeout: 300 * time.Millisecond}); err == nil {
			t.Errorf("%s answered %v with IgnoreHeadless, want no answer", addr, a)
		}
	}
	restartSink(t, b, s, "headless", state)
	for _, addr := range []netip.Addr{netns.ServiceV4, netns.ServiceV6} {
		if a, err := b.Client.Ask("tcp", netip.AddrPortFrom(addr, 6000), netns.AskOptions{}); err != nil || a.Server != netns.PodID {
			t.Errorf("%s without IgnoreHeadless: %v, %v; want the pod", addr, a, err)
		}
	}
}

// manyServices returns n single-port services with cluster IPs
// 10.96.1.0+i, each with pod as its endpoint: plain services, in the
// shard maps.
func manyServices(n int) []*model.ServiceEndpoints {
	var items []*model.ServiceEndpoints
	for i := range n {
		ip := netip.AddrFrom4([4]byte{10, 96, byte(1 + i/250), byte(1 + i%250)})
		items = append(items, &model.ServiceEndpoints{
			Service:   svc("default", fmt.Sprintf("svc-%03d", i), ipset(ip.String()), tcp(80, 6000)),
			Endpoints: podEndpoints(netns.PodID)[:1],
		})
	}
	return items
}

// manyChainServices is manyServices with node ports (30000+i): services
// with chains, their blocks in the endpoint maps.
func manyChainServices(n int) []*model.ServiceEndpoints {
	items := manyServices(n)
	for i, se := range items {
		se.Service.Type = "NodePort"
		se.Service.Ports[0].NodePort = int32(30000 + i)
	}
	return items
}

// TestKernelPartialSyncSize checks that one endpoint change sends the same
// handful of objects whether the table holds 10 or 100 services, and that
// it takes effect.
func TestKernelPartialSyncSize(t *testing.T) {
	b := kernelTopology(t)
	var sizes []Stats
	for _, n := range []int{10, 100} {
		s := newTestSink(t, b, fmt.Sprintf("size%d", n))
		items := manyServices(n)
		s.setAll(items...)
		full := s.sync()
		target := items[n/2]
		replaced := *target
		replaced.Endpoints = podEndpoints(netns.Pod2ID)[:1]
		s.set(target.Service.Key(), &replaced)
		r := s.sync()
		t.Logf("%d services: full sync %+v in %v; one endpoint replaced: %+v in %v", n, full.Stats, full.Duration, r.Stats, r.Duration)
		if r.Full || len(r.Services) != 1 || r.Services[0] != target.Service.Key() {
			t.Errorf("%d services: partial sync %+v, want one service", n, r)
		}
		// Only elements: the service's one endpoint deleted from its
		// shard's map and pod2 added in its place, pod2 added to the
		// hairpin set; no chain, rule or set.
		want := Stats{Messages: 3, ElementsAdded: 2, ElementsDeleted: 1}
		if r.Stats != want {
			t.Errorf("%d services: transaction %+v, want %+v", n, r.Stats, want)
		}
		sizes = append(sizes, r.Stats)
		ip := netip.MustParseAddr(target.Service.IPs.ClusterIPs.V4[0])
		counts := spread(t, b.Client, "tcp", netip.AddrPortFrom(ip, 80), 30, map[string]uint16{netns.PodID: 6000, netns.Pod2ID: 6000})
		if counts[netns.Pod2ID] == 0 || counts[netns.PodID] != 0 {
			t.Errorf("%d services: after replacing pod with pod2: %v", n, counts)
		}
	}
	if sizes[0] != sizes[1] {
		t.Errorf("transaction size depends on the number of services: %+v vs %+v", sizes[0], sizes[1])
	}
}

// TestKernelRecoversFromRejectedTransaction removes the table behind the
// sink's back: the next partial transaction is rejected by the kernel
// (nothing applied), and Sync returns its error, naming the table. The
// Feeder's retry then calls Sync alone (no Reset, no Update: the sink
// kept the failed round), which writes the whole table, and traffic
// reaches the endpoint of the failed round; when the source's next round
// comes before the retry, that round's Sync is the full one.
func TestKernelRecoversFromRejectedTransaction(t *testing.T) {
	b := kernelTopology(t)
	// The monitor is off: it would repair the table deleted by hand
	// before the partial transaction fails on it.
	s := newConfigSink(t, b, Config{ServiceProxyName: "recover", NoMonitor: true}, localsink.FeederOptions{MinRetry: 200 * time.Millisecond, MaxRetry: 400 * time.Millisecond})
	web := webService()
	s.setAll(&model.ServiceEndpoints{Service: web, Endpoints: podEndpoints(netns.PodID)})
	s.sync()
	deleteTables(b.Node, "kpng-recover")
	s.checker.TakeCalls()

	e := podEndpoints(netns.Pod2ID)[0]
	s.setEndpoint(web.Key(), e)
	if err := s.trySync(); err == nil || !strings.Contains(err.Error(), "kpng-recover") {
		t.Fatalf("Sync of a partial transaction on a missing table: %v, want an error naming the table", err)
	}
	if !s.feeder.Failed() {
		t.Errorf("the Feeder does not know the round failed: no retry is due")
	}
	if calls, want := s.checker.TakeCalls(), []string{"Update default/web +" + e.Key(), "Sync failed"}; !slices.Equal(calls, want) {
		t.Errorf("the failed round: calls %q, want %q", calls, want)
	}
	results := s.allResults()
	last := results[len(results)-1]
	if last.Err == nil || last.Full {
		t.Fatalf("partial sync on a missing table: %+v, want an error", last)
	}
	if len(last.Services) != 1 || last.Services[0] != web.Key() {
		t.Errorf("failed sync concerns %v, want %v", last.Services, web.Key())
	}
	if out := b.Node.MustExec("nft", "list", "tables"); strings.Contains(out, "kpng-recover") {
		t.Errorf("the rejected transaction left something:\n%s", out)
	}

	// No new round: the Feeder's retry calls Sync again, alone, and the
	// sink rewrites the whole table with the state it was given.
	failed := len(results)
	deadline := time.Now().Add(10 * time.Second)
	for {
		results = s.allResults()
		if r := results[len(results)-1]; r.Err == nil {
			if !r.Full || len(r.Services) != 1 || r.Services[0] != web.Key() {
				t.Errorf("retry: %+v, want a full sync of %v", r, web.Key())
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no successful retry within 10s: %+v", results)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := len(results) - failed; n != 1 {
		t.Errorf("%d transactions before the table was back, want 1 (the retry's)", n)
	}
	calls := s.checker.TakeCalls()
	if len(calls) == 0 || calls[len(calls)-1] != "Sync" || slices.ContainsFunc(calls, func(c string) bool { return !strings.HasPrefix(c, "Sync") }) {
		t.Errorf("the retry: calls %q, want Syncs alone, the last one successful", calls)
	}
	if s.feeder.Failed() {
		t.Errorf("the Feeder still reports a failure after the successful retry")
	}
	counts := spread(t, b.Client, "tcp", netip.AddrPortFrom(webV4, 80), 30, map[string]uint16{netns.PodID: 6000, netns.Pod2ID: 6000})
	if counts[netns.PodID] == 0 || counts[netns.Pod2ID] == 0 {
		t.Errorf("after the retry: %v, want pod and pod2", counts)
	}

	// A failure again, repaired by the next round before the retry: that
	// round's Sync is full, with both rounds' changes.
	deleteTables(b.Node, "kpng-recover")
	s.deleteEndpoint(web.Key(), e.Key())
	if err := s.trySync(); err == nil {
		t.Fatalf("Sync on a missing table succeeded")
	}
	s.setEndpoint(web.Key(), e)
	if r := s.sync(); !r.Full {
		t.Errorf("sync after a failure not full: %+v", r)
	}
	counts = spread(t, b.Client, "tcp", netip.AddrPortFrom(webV4, 80), 30, map[string]uint16{netns.PodID: 6000, netns.Pod2ID: 6000})
	if counts[netns.PodID] == 0 || counts[netns.Pod2ID] == 0 {
		t.Errorf("after the full resync: %v, want pod and pod2", counts)
	}
}

// objectFamily returns the family of the table holding the set, map or
// chain name, as nft names it: "ip6" for an IPv6 object (its name has "v6"
// or a kind ending in 6: "bal6-…", "svc6-…"), else "ip".
func objectFamily(name string) string {
	kind, _, _ := strings.Cut(name, "-")
	if strings.Contains(name, "-v6") || strings.HasSuffix(kind, "6") {
		return "ip6"
	}
	return "ip"
}

// deleteTables deletes the ip and ip6 tables named table in ns.
func deleteTables(ns *netns.NS, table string) {
	ns.MustExec("nft", "delete", "table", "ip", table)
	ns.MustExec("nft", "delete", "table", "ip6", table)
}

// TestKernelCleanup checks that the first sync removes the inet table an
// earlier version of kpng left (its base chain hooked), that Cleanup
// removes the ip and ip6 tables and a left inet one, and that it is
// harmless when there are none.
func TestKernelCleanup(t *testing.T) {
	netns.RequirePrivileged(t)
	netns.RequireCommands(t, "nft")
	n := netns.New(t, "node")
	conn := connIn(t, n)
	addLegacy := func() {
		t.Helper()
		legacy := "add table inet kpng-clean\nadd chain inet kpng-clean filter-output { type filter hook output priority -10; }\n"
		if _, stderr, err := n.Exec([]byte(legacy), "nft", "-f", "-"); err != nil {
			t.Fatalf("the inet table of an earlier version: %v: %s", err, stderr)
		}
	}
	addLegacy()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := New(ctx, Config{ServiceProxyName: "clean", Conn: conn, Conntrack: conntrackIn(t, n)})
	if err != nil {
		t.Fatal(err)
	}
	s.Reset()
	web := webService()
	s.Update(web.Key(), nil, &model.ServiceEndpoints{Service: web})
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	if out := n.MustExec("nft", "list", "tables"); !strings.Contains(out, "table ip kpng-clean\n") || !strings.Contains(out, "table ip6 kpng-clean\n") || strings.Contains(out, "inet") {
		t.Fatalf("after a sync, want the ip and ip6 tables and the inet one gone:\n%s", out)
	}
	// The earlier version's table, added again: Cleanup removes it too.
	addLegacy()
	// As --cleanup, after kpng stopped (a running sink's monitor would
	// write the table again).
	cancel()
	for range 2 {
		if err := Cleanup(context.Background(), Config{ServiceProxyName: "clean", Conn: conn}); err != nil {
			t.Fatalf("Cleanup: %v", err)
		}
	}
	if out := n.MustExec("nft", "list", "tables"); strings.Contains(out, "kpng-clean") {
		t.Errorf("table left after Cleanup:\n%s", out)
	}
}

// TestKernelEndpointBlocksReused checks the endpoint maps through slot
// reuse: in one partial sync, a service is deleted and a new one takes its
// slot (the old intervals deleted and the new ones added under the same
// keys), and the only service of the second endpoint map is deleted (the
// map with it); traffic follows, and the other services are untouched.
func TestKernelEndpointBlocksReused(t *testing.T) {
	b := kernelTopology(t)
	s := newTestSink(t, b, "blocks")
	items := manyChainServices(blocksPerMap + 1)
	s.setAll(items...)
	if r := s.sync(); !r.Full || r.Err != nil {
		t.Fatalf("first sync: %+v", r)
	}
	if listing := nftList(t, b.Node, "kpng-blocks"); !containsAll(listing, "map "+endpointMapName(ipv4, 0)+" ", "map "+endpointMapName(ipv4, 1)+" ") {
		t.Fatalf("want two endpoint maps:\n%s", listing)
	}

	movedIP := netip.MustParseAddr("10.96.9.9")
	moved := &model.ServiceEndpoints{
		// Named after the deleted ones: services are updated in key
		// order, so their slots are free when it gets one.
		Service:   svc("default", "zmoved", ipset(movedIP.String()), &model.PortMapping{Protocol: model.TCP, Port: 80, TargetPort: 6000, NodePort: 31000}),
		Endpoints: podEndpoints(netns.Pod2ID)[:1],
	}
	moved.Service.Type = "NodePort"
	s.deleteService(items[0].Service.Key())
	s.deleteService(items[blocksPerMap].Service.Key())
	s.setService(moved.Service)
	for _, e := range moved.Endpoints {
		s.setEndpoint(moved.Service.Key(), e)
	}
	r := s.sync()
	if r.Full || r.Err != nil || r.Stats.SetsDeleted != 1 {
		t.Fatalf("delete two, add one: %+v, want a partial sync deleting the second endpoint map", r)
	}
	listing := nftList(t, b.Node, "kpng-blocks")
	// Slot 0's one interval, the whole of block 0 of map 0, with the
	// comment of its new block.
	if strings.Contains(listing, endpointMapName(ipv4, 1)) || !strings.Contains(listing, fmt.Sprintf(`0-%d comment "svc4 default/zmoved/tcp/80" : `, blockRange-1)+netns.Pod2V4.String()+" . 6000") {
		t.Errorf("want the second endpoint map gone and slot 0 reused by pod2:\n%s", listing)
	}
	pod2Only := map[string]uint16{netns.Pod2ID: 6000}
	if counts := spread(t, b.Client, "tcp", netip.AddrPortFrom(movedIP, 80), 10, pod2Only); counts[netns.Pod2ID] != 10 {
		t.Errorf("the service on the reused slot: %v, want pod2 only", counts)
	}
	podOnly := map[string]uint16{netns.PodID: 6000}
	for _, i := range []int{1, blocksPerMap - 1} {
		ip := netip.MustParseAddr(items[i].Service.IPs.ClusterIPs.V4[0])
		if counts := spread(t, b.Client, "tcp", netip.AddrPortFrom(ip, 80), 5, podOnly); counts[netns.PodID] != 5 {
			t.Errorf("%s: %v, want the pod only", items[i].Service.Key(), counts)
		}
	}
	for _, i := range []int{0, blocksPerMap} {
		ip := netip.MustParseAddr(items[i].Service.IPs.ClusterIPs.V4[0])
		if a, err := b.Client.Ask("tcp", netip.AddrPortFrom(ip, 80), netns.AskOptions{Timeout: 300 * time.Millisecond}); err == nil || isRefused(err) {
			t.Errorf("deleted %s: answer %v, error %v; want no answer", items[i].Service.Key(), a, err)
		}
	}

	// Both pods on the reused slot, then the pod alone: elements only.
	both := podEndpoints(netns.PodID)[:1]
	s.setEndpoint(moved.Service.Key(), both[0])
	if r := s.sync(); r.Full || r.Err != nil || r.Stats.Rules != 0 || r.Stats.ChainsAdded+r.Stats.ChainsFlushed+r.Stats.ChainsDeleted != 0 {
		t.Errorf("endpoint added: %+v, want elements only", r)
	}
	counts := spread(t, b.Client, "tcp", netip.AddrPortFrom(movedIP, 80), 30, map[string]uint16{netns.PodID: 6000, netns.Pod2ID: 6000})
	if counts[netns.PodID] == 0 || counts[netns.Pod2ID] == 0 {
		t.Errorf("two endpoints on the reused slot: %v", counts)
	}
	s.deleteEndpoint(moved.Service.Key(), moved.Endpoints[0].Key())
	s.sync()
	if counts := spread(t, b.Client, "tcp", netip.AddrPortFrom(movedIP, 80), 10, podOnly); counts[netns.PodID] != 10 {
		t.Errorf("pod2 removed: %v, want the pod only", counts)
	}
}
