package remote_test

import (
	"context"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"sigs.k8s.io/kpng/api/server"
	"sigs.k8s.io/kpng/client/remote"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/localsink/sinktest"
	"sigs.k8s.io/kpng/model"
)

// controller is an in-process controller (a hub behind api/server) on a
// listener, stopped when the test ends.
type controller struct {
	addr string
	hub  *server.Hub
	srv  *server.Server
	// peers are the replicas' addresses its Peers call tells: none
	// until the test sets them.
	peers *server.Peers
	g     *grpc.Server
	done  chan struct{}
}

// startController serves state on addr (a unix socket, or a TCP listener
// given as lis) until the test ends.
func startController(t *testing.T, addr string, lis net.Listener, state []*model.ServiceEndpoints) *controller {
	t.Helper()
	cfg := server.ListenConfig{Address: addr}
	var opts []grpc.ServerOption
	if lis == nil {
		var err error
		if lis, opts, err = cfg.Listen(); err != nil {
			t.Fatal(err)
		}
	} else {
		opts = server.ServerOptions()
	}
	hub := server.NewHub(true)
	localsink.FromFullState(hub)(state)
	g := grpc.NewServer(opts...)
	peers := server.NewPeers()
	srv := server.New(hub, server.Options{SendTimeout: 10 * time.Second, Peers: peers})
	srv.Register(g)
	c := &controller{addr: addr, hub: hub, srv: srv, peers: peers, g: g, done: make(chan struct{})}
	go func() { defer close(c.done); _ = g.Serve(lis) }()
	t.Cleanup(c.stop)
	return c
}

func (c *controller) stop() {
	c.g.Stop()
	<-c.done
}

func state(names ...string) []*model.ServiceEndpoints {
	var out []*model.ServiceEndpoints
	for i, n := range names {
		out = append(out, &model.ServiceEndpoints{
			Service:   &model.Service{Namespace: "ns", Name: n, Type: "ClusterIP", IPs: model.ServiceIPs{ClusterIPs: model.IPSet{V4: []string{"10.96.0.1"}}}, Ports: []*model.PortMapping{{Protocol: model.TCP, Port: 80, TargetPort: 8080}}},
			Endpoints: []*model.Endpoint{{IPs: model.IPSet{V4: []string{"10.1.0." + string(rune('1'+i))}}, Ready: true, Serving: true}},
		})
	}
	return out
}

// watched records the addresses a client reported watching.
type watched struct {
	mu   sync.Mutex
	seen []string
	ch   chan string
}

func newWatched() *watched { return &watched{ch: make(chan string, 16)} }

func (w *watched) report(addr string) {
	w.mu.Lock()
	w.seen = append(w.seen, addr)
	w.mu.Unlock()
	w.ch <- addr
}

// next waits for the next address reported.
func (w *watched) next(t *testing.T) string {
	t.Helper()
	select {
	case a := <-w.ch:
		return a
	case <-time.After(30 * time.Second):
		t.Fatal("the client watched no controller within 30 s")
		return ""
	}
}

func run(t *testing.T, cfg remote.Config) *sinktest.Checker {
	t.Helper()
	c := sinktest.NewChecker(nil)
	sinktest.RunSource(t, "remote.Run", c, func(ctx context.Context, sink localsink.Sink) error {
		return remote.Run(ctx, cfg, sink)
	})
	return c
}

func sock(t *testing.T, name string) string {
	return "unix://" + filepath.Join(t.TempDir(), name)
}

// TestNextAddressAtOnce gives a client three controller addresses of which
// only the last answers, and a backoff of an hour: it must reach the
// third without waiting, since the backoff applies only once every address
// has failed in a row (with a backoff between addresses, or retrying the
// first, the test fails after 30 s).
func TestNextAddressAtOnce(t *testing.T) {
	live := startController(t, sock(t, "c.sock"), nil, state("a", "b"))
	addrs := []string{sock(t, "dead-1.sock"), sock(t, "dead-2.sock"), live.addr}
	w := newWatched()
	// The node names start on each of the addresses in turn.
	for _, node := range []string{"node-a", "node-b", "node-c", "node-d", "node-e", "node-f"} {
		c := run(t, remote.Config{Address: strings.Join(addrs, ","), NodeName: node, MinBackoff: time.Hour, MaxBackoff: time.Hour, Watching: w.report})
		if got := w.next(t); got != live.addr {
			t.Fatalf("%s watched %s, want %s", node, got, live.addr)
		}
		c.WaitSyncs(t, 1, 30*time.Second)
	}
}

// TestFailoverWithoutChange connects a client to the first of two
// controllers holding the same state and stops that one: the client must
// watch the second at once (the backoff is an hour), and its sink see
// nothing of it: no Reset, no Update, no Sync, until a later change (a
// fence) shows the round that followed. With the mirror's difference
// bypassed (a Reset or the whole state again), the calls differ.
func TestFailoverWithoutChange(t *testing.T) {
	a := startController(t, sock(t, "a.sock"), nil, state("a", "b", "c"))
	b := startController(t, sock(t, "b.sock"), nil, state("a", "b", "c"))
	w := newWatched()
	// node-a hashes to the first address of the two (checked below).
	c := run(t, remote.Config{Address: a.addr + "," + b.addr, NodeName: "node-a", MinBackoff: time.Hour, MaxBackoff: time.Hour, Watching: w.report})
	first := w.next(t)
	c.WaitSyncs(t, 1, 30*time.Second)
	c.TakeCalls()
	lost, other := a, b
	if first == b.addr {
		lost, other = b, a
	}
	lost.stop()
	if got := w.next(t); got != other.addr {
		t.Fatalf("after %s stopped, the client watched %s, want %s", lost.addr, got, other.addr)
	}
	localsink.FromFullState(other.hub)(state("a", "b"))
	c.WaitSyncs(t, 2, 30*time.Second)
	if diff := cmp.Diff([]string{"Update ns/c deleted", "Sync"}, c.TakeCalls()); diff != "" {
		t.Errorf("calls after the failover (-want +got):\n%s", diff)
	}
}

// blackhole forwards TCP connections to a backend address until frozen:
// then it stops forwarding without closing anything, as a peer gone
// without a reset (a node powered off).
type blackhole struct {
	lis    net.Listener
	to     string
	mu     sync.Mutex
	frozen bool
	conns  []net.Conn
}

func newBlackhole(t *testing.T, to string) *blackhole {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{lis: lis, to: to}
	go b.serve()
	t.Cleanup(func() {
		lis.Close()
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, c := range b.conns {
			c.Close()
		}
	})
	return b
}

func (b *blackhole) serve() {
	for {
		in, err := b.lis.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", b.to)
		if err != nil {
			in.Close()
			continue
		}
		b.mu.Lock()
		b.conns = append(b.conns, in, out)
		b.mu.Unlock()
		go b.copy(out, in)
		go b.copy(in, out)
	}
}

// copy forwards until frozen, then holds the data.
func (b *blackhole) copy(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		b.mu.Lock()
		frozen := b.frozen
		b.mu.Unlock()
		if frozen {
			_, _ = io.Copy(io.Discard, src)
			return
		}
		if n > 0 {
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (b *blackhole) freeze() {
	b.mu.Lock()
	b.frozen = true
	b.mu.Unlock()
}

// TestKeepaliveDetectsSilentController puts the first controller behind a
// forwarder that stops forwarding without closing (no reset, no FIN): the
// client's keepalive (a ping after remote.KeepaliveTime without a
// message, KeepaliveTimeout to answer) must detect it and move to the
// second controller. Without keepalive the stream would wait forever and
// the test fail after a minute; with a controller refusing the pings
// (gRPC's default enforcement), the connection would be closed as
// abusive instead. It takes about 15 s: skipped with -short.
func TestKeepaliveDetectsSilentController(t *testing.T) {
	if testing.Short() {
		t.Skip("takes KeepaliveTime + KeepaliveTimeout (30 s)")
	}
	var holes []*blackhole
	var addrs []string
	for range 2 {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		c := startController(t, lis.Addr().String(), lis, state("a", "b"))
		h := newBlackhole(t, c.addr)
		holes = append(holes, h)
		addrs = append(addrs, h.lis.Addr().String())
	}
	w := newWatched()
	c := run(t, remote.Config{Address: strings.Join(addrs, ","), NodeName: "node-a", Insecure: true, MinBackoff: time.Hour, MaxBackoff: time.Hour, Watching: w.report})
	first := w.next(t)
	c.WaitSyncs(t, 1, 30*time.Second)
	c.TakeCalls()
	lost, want := 0, addrs[1]
	if first == addrs[1] {
		lost, want = 1, addrs[0]
	}
	holes[lost].freeze()
	select {
	case got := <-w.ch:
		if got != want {
			t.Fatalf("after %s went silent, the client watched %s, want %s", first, got, want)
		}
	case <-time.After(time.Minute):
		t.Fatalf("the client still watches %s, silent for a minute", first)
	}
	if calls := c.TakeCalls(); len(calls) != 0 {
		t.Errorf("calls after the failover: %q, want none", calls)
	}
}

// TestTargets checks the address list: each address its own target (a
// name through the client's own resolver, so that every address it
// resolves to is used), an empty element refused, DialOptions refusing several.
func TestTargets(t *testing.T) {
	cfg := remote.Config{Address: "unix:///run/a.sock, unix:///run/b.sock"}
	targets, err := cfg.Targets()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, tg := range targets {
		got = append(got, tg.Address+" "+tg.Target)
	}
	if diff := cmp.Diff([]string{"unix:///run/a.sock passthrough:///unix", "unix:///run/b.sock passthrough:///unix"}, got); diff != "" {
		t.Errorf("targets (-want +got):\n%s", diff)
	}
	if _, _, err := cfg.DialOptions(); err == nil || !strings.Contains(err.Error(), "2 addresses") {
		t.Errorf("DialOptions of two addresses: %v, want an error saying so", err)
	}
	cfg = remote.Config{Address: "kpng-controller.kube-system.svc:7443,10.0.0.1:7443,[fd00::1]:7443"}
	targets, err = cfg.Targets()
	if err != nil {
		t.Fatal(err)
	}
	got = nil
	for _, tg := range targets {
		got = append(got, tg.Target)
	}
	if diff := cmp.Diff([]string{"kpng-dns:///kpng-controller.kube-system.svc:7443", "passthrough:///10.0.0.1:7443", "passthrough:///[fd00::1]:7443"}, got); diff != "" {
		t.Errorf("targets (-want +got):\n%s", diff)
	}
	for _, bad := range []string{"unix:///a.sock,", ",unix:///a.sock", "unix:///a.sock,,unix:///b.sock", "host"} {
		if _, err := (remote.Config{Address: bad}).Targets(); err == nil {
			t.Errorf("Targets(%q): no error", bad)
		}
	}
}

// hostsEnv, set in the helper process TestNameResolvingToSeveral starts,
// says that /etc/hosts is the test's (a mount namespace of its own).
const hostsEnv = "KPNG_TEST_OWN_ETC_HOSTS"

// TestNameResolvingToSeveral gives a client one name, "localhost",
// resolving to 127.0.0.1 and 127.0.0.2 (an /etc/hosts of the test's,
// bind-mounted in a mount namespace of a helper process: the test runs
// again there), with a controller on each address and the same port, and
// a backoff of an hour; it stops the controller the client watches: the
// client must watch the other at once (the client's resolver and
// round_robin), its sink seeing nothing. With the backoff after every
// stream that ends (the loop before several addresses), the client waits
// its hour and the test fails after 30 s. On loopback, a refused address
// costs nothing, so pick_first or Go's dialer (a passthrough target) would
// pass too: round_robin's gain, a stream at once when the lost address
// does not answer at all, is not shown here. Needs root (unshare, mount):
// skipped otherwise, failed with KPNG_REQUIRE_PRIVILEGED=1.
func TestNameResolvingToSeveral(t *testing.T) {
	if os.Getenv(hostsEnv) == "" {
		if testing.Short() {
			t.Skip("runs itself again in a mount namespace of its own")
		}
		if os.Geteuid() != 0 {
			if os.Getenv("KPNG_REQUIRE_PRIVILEGED") == "1" {
				t.Fatal("needs root (unshare, mount), and KPNG_REQUIRE_PRIVILEGED=1")
			}
			t.Skip("needs root (unshare, mount)")
		}
		hosts := filepath.Join(t.TempDir(), "hosts")
		if err := os.WriteFile(hosts, []byte("127.0.0.1 localhost\n127.0.0.2 localhost\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
			`mount --bind "$1" /etc/hosts && exec "$2" -test.run='^TestNameResolvingToSeveral$' -test.v -test.count=1`, "sh", hosts, os.Args[0])
		cmd.Env = append(os.Environ(), hostsEnv+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestNameResolvingToSeveral") {
			t.Fatalf("the test in its own mount namespace: %v\n%s", err, out)
		}
		t.Logf("in its own mount namespace:\n%s", out)
		return
	}
	addrs, err := net.LookupHost("localhost")
	if err != nil || !slices.Contains(addrs, "127.0.0.2") {
		t.Fatalf("localhost resolves to %v (%v), want 127.0.0.1 and 127.0.0.2", addrs, err)
	}
	lis1, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(lis1.Addr().String())
	lis2, err := net.Listen("tcp", "127.0.0.2:"+port)
	if err != nil {
		t.Fatal(err)
	}
	ctls := []*controller{startController(t, lis1.Addr().String(), lis1, state("a", "b")), startController(t, lis2.Addr().String(), lis2, state("a", "b"))}
	w := newWatched()
	c := run(t, remote.Config{Address: "localhost:" + port, NodeName: "node-a", Insecure: true, MinBackoff: time.Hour, MaxBackoff: time.Hour, Watching: w.report})
	w.next(t)
	c.WaitSyncs(t, 1, 30*time.Second)
	c.TakeCalls()
	on := -1
	for i, ctl := range ctls {
		if ctl.srv.Stats().Connected == 1 {
			on = i
		}
	}
	if on < 0 {
		t.Fatal("no controller has the client")
	}
	ctls[on].stop()
	w.next(t)
	if got := ctls[1-on].srv.Stats().Connected; got != 1 {
		t.Errorf("the other controller has %d backends, want 1", got)
	}
	if calls := c.TakeCalls(); len(calls) != 0 {
		t.Errorf("calls after the failover: %q, want none", calls)
	}
	t.Logf("moved from %s to %s", ctls[on].addr, ctls[1-on].addr)
}

// countingListener reports each connection it accepts.
type countingListener struct {
	net.Listener
	accepted chan struct{}
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		select {
		case l.accepted <- struct{}{}:
		default:
		}
	}
	return c, err
}

// lookupAnswer is a host name lookup whose answer the test changes.
type lookupAnswer struct {
	mu  sync.Mutex
	ips []string
}

func (l *lookupAnswer) set(ips ...string) {
	l.mu.Lock()
	l.ips = ips
	l.mu.Unlock()
}

func (l *lookupAnswer) lookup(_ context.Context, host string) ([]string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if host != "localhost" {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return slices.Clone(l.ips), nil
}

// twoLoopbackControllers starts controllers holding the same state on
// 127.0.0.1 and 127.0.0.2, the same port (a name's addresses), the second
// reporting the connections it accepts.
func twoLoopbackControllers(t *testing.T) (a, b *controller, port string, bAccepted chan struct{}) {
	t.Helper()
	lisA, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ = net.SplitHostPort(lisA.Addr().String())
	lisB, err := net.Listen("tcp", "127.0.0.2:"+port)
	if err != nil {
		t.Fatal(err)
	}
	bAccepted = make(chan struct{}, 1)
	a = startController(t, lisA.Addr().String(), lisA, state("a", "b"))
	b = startController(t, lisB.Addr().String(), &countingListener{Listener: lisB, accepted: bAccepted}, state("a", "b"))
	return a, b, port, bAccepted
}

// TestNameNewAddressConnectedBeforeFailover gives a client the name
// localhost (a loopback name: --api-insecure allows it), resolved by a lookup of the test's (the client's seam:
// no real DNS): first to A alone; once the client watches A, to A and B
// (a new replica ready). Without any connection failing, the client must
// connect to B (the periodic resolution), and when A stops, watch B at
// once (a backoff of an hour), its sink seeing nothing. With gRPC's DNS
// resolver, or without the period, B is not known until a connection
// fails: B never gets a connection and the test fails after 30 s.
func TestNameNewAddressConnectedBeforeFailover(t *testing.T) {
	n := onName(t, time.Hour, 20*time.Millisecond)
	a, b, bAccepted, ans, w, c := n.a, n.b, n.bAccepted, n.ans, n.w, n.c
	if got := a.srv.Stats().Connected; got != 1 {
		t.Fatalf("A has %d backends, want 1", got)
	}
	ans.set("127.0.0.2", "127.0.0.1")
	select {
	case <-bAccepted:
	case <-time.After(30 * time.Second):
		t.Fatal("the client made no connection to B, the name's new address, within 30 s")
	}
	expectMovedToB(t, a, b, w, c)
}

// TestNamePeersToldBeforeFailover: the name resolves to A alone for good
// (a DNS cache that has not seen B yet: the period is an hour, and a
// resolution after a failure answers A again); A's controller tells its
// replicas, A and B (its Peers call: B became ready in its Service). The
// client must connect to B without any connection failing, keep B when A
// stops (and its Peers stream with it), and watch B at once (a backoff of
// an hour), its sink seeing nothing. Without the replicas told, B is never
// known and the test fails after 30 s.
func TestNamePeersToldBeforeFailover(t *testing.T) {
	n := onName(t, time.Hour, time.Hour)
	a, b, bAccepted, w, c := n.a, n.b, n.bAccepted, n.w, n.c
	if err := a.peers.Set([]string{"127.0.0.2", "127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-bAccepted:
	case <-time.After(30 * time.Second):
		t.Fatal("the client made no connection to B, the replica A's controller told, within 30 s")
	}
	expectMovedToB(t, a, b, w, c)
}

// TestNameResolvedAgainWhenConnectionFails: the name resolves to A alone,
// and the period is an hour; then A is replaced by B (the lookup answers
// B) and stops: the lost connection must make the client resolve the name
// at once (ResolveNow) and watch B, its sink seeing nothing. gRPC's DNS
// resolver would wait 30 s since its last resolution; without ResolveNow,
// B is never known and the test fails after 30 s.
func TestNameResolvedAgainWhenConnectionFails(t *testing.T) {
	n := onName(t, 50*time.Millisecond, time.Hour)
	a, b, _, ans, w, c := n.a, n.b, n.bAccepted, n.ans, n.w, n.c
	ans.set("127.0.0.2")
	expectMovedToB(t, a, b, w, c)
}

// TestNameAddressGoneKeepsStream: the name resolves to A, then to B alone
// (A's address gone from the answer, as a replica that stopped being
// ready; A still serves). The client connects to B (the periodic
// resolution) but keeps its stream on A: a change on A reaches the sink,
// and it never watches B: no flap. With gRPC's DNS resolver, B never gets
// a connection and the test fails after 30 s.
func TestNameAddressGoneKeepsStream(t *testing.T) {
	n := onName(t, time.Hour, 20*time.Millisecond)
	a, _, bAccepted, ans, w, c := n.a, n.b, n.bAccepted, n.ans, n.w, n.c
	ans.set("127.0.0.2")
	select {
	case <-bAccepted:
	case <-time.After(30 * time.Second):
		t.Fatal("the client made no connection to B, the name's new address, within 30 s")
	}
	localsink.FromFullState(a.hub)(state("a"))
	c.WaitSyncs(t, 2, 30*time.Second)
	if diff := cmp.Diff([]string{"Update ns/b deleted", "Sync"}, c.TakeCalls()); diff != "" {
		t.Errorf("calls after A's change (-want +got):\n%s", diff)
	}
	select {
	case got := <-w.ch:
		t.Errorf("the client watched %s, want A still", got)
	default:
	}
}

// TestNameNewAddressEndsBackoff: the name resolves to A alone; A stops and
// the client, having failed on the name's only address, backs off for an
// hour; then the name answers B (A's replacement, found by the periodic
// resolution): the connection to B becoming ready must end the backoff,
// and the client watch B, its sink seeing nothing. Without it, the client
// waits its hour and the test fails after 30 s. (The answer changes 200 ms
// after A stopped, when the client is in its backoff: it fails on A
// within milliseconds. Were it slower, the test would pass without the
// mechanism, never fail with it.)
func TestNameNewAddressEndsBackoff(t *testing.T) {
	n := onName(t, time.Hour, 20*time.Millisecond)
	a, b, _, ans, w, c := n.a, n.b, n.bAccepted, n.ans, n.w, n.c
	a.stop()
	time.Sleep(200 * time.Millisecond)
	ans.set("127.0.0.2")
	w.next(t)
	if got := b.srv.Stats().Connected; got != 1 {
		t.Errorf("B has %d backends, want 1", got)
	}
	if calls := c.TakeCalls(); len(calls) != 0 {
		t.Errorf("calls after the failover: %q, want none", calls)
	}
}

// TestRefusingControllerBacksOff: a server that accepts the connection
// but refuses the stream (no kpng service: Unimplemented) leaves the
// connection ready; the client must still wait its backoff between
// streams (100 ms doubling), not retry at once because the connection is
// ready: a few streams in a second, not thousands.
func TestRefusingControllerBacksOff(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	streams := 0
	g := grpc.NewServer(grpc.UnknownServiceHandler(func(any, grpc.ServerStream) error {
		mu.Lock()
		streams++
		mu.Unlock()
		return status.Error(codes.Unimplemented, "no kpng here")
	}))
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(lis) }()
	t.Cleanup(func() { g.Stop(); <-done })
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := remote.Run(ctx, remote.Config{Address: lis.Addr().String(), NodeName: "node-a", Insecure: true, MinBackoff: 100 * time.Millisecond, MaxBackoff: time.Second}, sinktest.NewChecker(nil)); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if streams < 1 || streams > 20 {
		t.Errorf("%d streams refused in a second, want a few (a backoff of 100 ms doubling)", streams)
	}
}

// nameRun is a client watching two loopback controllers by name
// (twoLoopbackControllers), holding its first state from A.
type nameRun struct {
	a, b      *controller
	bAccepted chan struct{}
	ans       *lookupAnswer
	w         *watched
	c         *sinktest.Checker
}

// onName starts a client on "localhost:PORT" of two loopback controllers,
// the name resolving to A (127.0.0.1) alone, with backoff as its min and
// max backoff and period as its resolution period, and waits for its
// first state from A.
func onName(t *testing.T, backoff, period time.Duration) nameRun {
	t.Helper()
	n := nameRun{ans: &lookupAnswer{}, w: newWatched()}
	var port string
	n.a, n.b, port, n.bAccepted = twoLoopbackControllers(t)
	n.ans.set("127.0.0.1")
	cfg := remote.WithLookup(remote.Config{Address: "localhost:" + port, NodeName: "node-a", Insecure: true, MinBackoff: backoff, MaxBackoff: backoff, Watching: n.w.report}, n.ans.lookup, period)
	n.c = run(t, cfg)
	n.w.next(t)
	n.c.WaitSyncs(t, 1, 30*time.Second)
	n.c.TakeCalls()
	return n
}

// expectMovedToB stops controller a, which the client c watches, and
// checks that it moves to b (w reports it), its sink seeing nothing.
func expectMovedToB(t *testing.T, a, b *controller, w *watched, c *sinktest.Checker) {
	t.Helper()
	start := time.Now()
	a.stop()
	w.next(t)
	t.Logf("moved from A to B %v after A stopped", time.Since(start))
	if got := b.srv.Stats().Connected; got != 1 {
		t.Errorf("B has %d backends, want 1", got)
	}
	if calls := c.TakeCalls(); len(calls) != 0 {
		t.Errorf("calls after the failover: %q, want none", calls)
	}
}
