package server_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"sigs.k8s.io/kpng/api/kpngv1"
	"sigs.k8s.io/kpng/api/server"
	"sigs.k8s.io/kpng/client/remote"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/localsink/sinktest"
	"sigs.k8s.io/kpng/model"
)

func localKeys(state []*model.ServiceEndpoints) []string {
	var out []string
	for _, se := range state {
		for _, e := range se.Endpoints {
			if e.Local {
				out = append(out, se.Service.Name+"/"+e.Key())
			}
		}
	}
	return out
}

func TestEachBackendSeesItsNode(t *testing.T) {
	s := startServer(t, server.ListenConfig{Address: socketAddr(t)}, 0)
	s.feed([]*model.ServiceEndpoints{svc("ns", "a", ep("10.0.0.1", "node-a"), ep("10.0.0.2", "node-b"))})
	a := runClient(t, remote.Config{Address: s.addr, NodeName: "node-a"})
	b := runClient(t, remote.Config{Address: s.addr, NodeName: "node-b"})
	c := runClient(t, remote.Config{Address: s.addr, NodeName: "node-c"})
	for _, r := range []*sinktest.Checker{a, b, c} {
		r.WaitSyncs(t, 1, 20*time.Second)
	}
	for name, tc := range map[string]struct {
		r    *sinktest.Checker
		want []string
	}{"node-a": {a, []string{"a/10.0.0.1"}}, "node-b": {b, []string{"a/10.0.0.2"}}, "node-c": {c, nil}} {
		if diff := cmp.Diff(tc.want, localKeys(tc.r.State())); diff != "" {
			t.Errorf("%s local endpoints (-want +got):\n%s", name, diff)
		}
	}
	if diff := cmp.Diff([]string{"Reset", "Update ns/a service +10.0.0.1 +10.0.0.2", "Sync"}, a.TakeCalls()); diff != "" {
		t.Errorf("first state calls (-want +got):\n%s", diff)
	}
}

// rawWatch opens a Watch stream as a client before node-independent
// streams did, and returns a channel of its batches.
func rawWatch(t *testing.T, addr, node string) <-chan *kpngv1.Batch {
	t.Helper()
	return watchWith(t, addr, &kpngv1.WatchRequest{NodeName: node})
}

// watchWith opens a Watch stream with req and returns a channel of its
// batches.
func watchWith(t *testing.T, addr string, req *kpngv1.WatchRequest) <-chan *kpngv1.Batch {
	t.Helper()
	conn := dial(t, remote.Config{Address: addr})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); conn.Close() })
	stream, err := kpngv1.NewControllerClient(conn).Watch(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan *kpngv1.Batch, 100)
	go func() {
		defer close(ch)
		for {
			b, err := stream.Recv()
			if err != nil {
				return
			}
			ch <- b
		}
	}()
	return ch
}

func opNames(b *kpngv1.Batch) []string {
	var out []string
	for _, op := range b.GetOps() {
		switch o := op.GetOp().(type) {
		case *kpngv1.Op_Reset_:
			out = append(out, "Reset")
		case *kpngv1.Op_SetService:
			out = append(out, "SetService "+o.SetService.GetName())
		case *kpngv1.Op_DeleteService:
			out = append(out, "DeleteService "+o.DeleteService.GetName())
		case *kpngv1.Op_SetEndpoint:
			out = append(out, "SetEndpoint "+o.SetEndpoint.GetKey())
		case *kpngv1.Op_DeleteEndpoint:
			out = append(out, "DeleteEndpoint "+o.DeleteEndpoint.GetKey())
		case *kpngv1.Op_Sync:
			out = append(out, "Sync")
		}
	}
	return out
}

func next(t *testing.T, ch <-chan *kpngv1.Batch, who string) []string {
	t.Helper()
	select {
	case b, ok := <-ch:
		if !ok {
			t.Fatalf("%s: stream closed", who)
		}
		return opNames(b)
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no batch within 10s", who)
	}
	return nil
}

func nothing(t *testing.T, ch <-chan *kpngv1.Batch, who string) {
	t.Helper()
	select {
	case b := <-ch:
		t.Errorf("%s received %q, want nothing", who, opNames(b))
	case <-time.After(300 * time.Millisecond):
	}
}

func TestOnlyChangesToANodesViewAreSent(t *testing.T) {
	s := startServer(t, server.ListenConfig{Address: socketAddr(t)}, 0)
	hinted := ep("10.0.0.2", "node-b")
	hinted.Hints = &model.Hints{Zones: []string{"z2"}}
	s.feed([]*model.ServiceEndpoints{svc("ns", "a", ep("10.0.0.1", "node-a"), hinted)})
	a, b := rawWatch(t, s.addr, "node-a"), rawWatch(t, s.addr, "node-b")
	want := []string{"Reset", "SetService a", "SetEndpoint 10.0.0.1", "SetEndpoint 10.0.0.2", "Sync"}
	for who, ch := range map[string]<-chan *kpngv1.Batch{"node-a": a, "node-b": b} {
		if diff := cmp.Diff(want, next(t, ch, who)); diff != "" {
			t.Errorf("%s first state (-want +got):\n%s", who, diff)
		}
	}

	// node-b moves into zone z2: only node-b's view of the hinted endpoint
	// changes (SameZone), so only node-b hears of it.
	s.hub.SetNodeZone("node-b", "z2")
	if diff := cmp.Diff([]string{"SetEndpoint 10.0.0.2", "Sync"}, next(t, b, "node-b")); diff != "" {
		t.Errorf("node-b after its zone changed (-want +got):\n%s", diff)
	}
	nothing(t, a, "node-a")

	// An endpoint change is everybody's: one SetEndpoint each.
	notReady := ep("10.0.0.1", "node-a")
	notReady.Ready = false
	s.feed([]*model.ServiceEndpoints{svc("ns", "a", notReady, hinted)})
	for who, ch := range map[string]<-chan *kpngv1.Batch{"node-a": a, "node-b": b} {
		if diff := cmp.Diff([]string{"SetEndpoint 10.0.0.1", "Sync"}, next(t, ch, who)); diff != "" {
			t.Errorf("%s after an endpoint change (-want +got):\n%s", who, diff)
		}
	}
	// A round that changes nothing sends nothing.
	s.feed([]*model.ServiceEndpoints{svc("ns", "a", notReady, hinted)})
	nothing(t, a, "node-a")
	nothing(t, b, "node-b")
}

func TestReconnectSendsOnlyTheDifference(t *testing.T) {
	addr := socketAddr(t)
	state := []*model.ServiceEndpoints{
		svc("ns", "a", ep("10.0.0.1", "node-a"), ep("10.0.0.2", "node-b")),
		svc("ns", "b", ep("10.0.1.1", "node-b")),
	}
	s := startServer(t, server.ListenConfig{Address: addr}, 0)
	s.feed(state)
	r := runClient(t, remote.Config{Address: addr, NodeName: "node-a"})
	r.WaitSyncs(t, 1, 20*time.Second)
	r.TakeCalls()

	// The controller restarts; meanwhile one endpoint went away.
	s.stop()
	time.Sleep(300 * time.Millisecond)
	s2 := startServer(t, server.ListenConfig{Address: addr}, 0)
	s2.feed([]*model.ServiceEndpoints{svc("ns", "a", ep("10.0.0.1", "node-a")), state[1]})
	r.WaitSyncs(t, 2, 20*time.Second)
	if diff := cmp.Diff([]string{"Update ns/a -10.0.0.2", "Sync"}, r.TakeCalls()); diff != "" {
		t.Errorf("calls after the reconnection (-want +got):\n%s", diff)
	}
}

func TestUnixSocketIsPrivate(t *testing.T) {
	addr := socketAddr(t)
	path := strings.TrimPrefix(addr, "unix://")
	s := startServer(t, server.ListenConfig{Address: addr}, 0)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if mode := fi.Mode().Perm(); mode != 0o600 {
		t.Errorf("socket mode %o, want 600", mode)
	}
	// A stale socket (the server is gone) is replaced; a regular file is not.
	s.stop()
	s2 := startServer(t, server.ListenConfig{Address: addr}, 0)
	s2.stop()
	file := strings.TrimPrefix(socketAddr(t), "unix://")
	if err := os.WriteFile(file, []byte("precious"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := (server.ListenConfig{Address: "unix://" + file}).Listen(); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("listening over a regular file: %v, want a 'not a socket' error", err)
	}
	if b, _ := os.ReadFile(file); string(b) != "precious" {
		t.Errorf("the regular file was changed")
	}
}

func TestListenConfigChecks(t *testing.T) {
	certs := writeCerts(t)
	for _, tc := range []struct {
		cfg  server.ListenConfig
		want string
	}{
		{server.ListenConfig{Address: "127.0.0.1:0"}, "TCP needs --tls-cert and --tls-key"},
		{server.ListenConfig{Address: "0.0.0.0:0", Insecure: true}, "refusing --insecure on a non-loopback address"},
		{server.ListenConfig{Address: ":0", Insecure: true}, "refusing --insecure on a non-loopback address"},
		{server.ListenConfig{Address: "127.0.0.1:0", Insecure: true, TLSCert: certs.serverCert}, "exclusive"},
		{server.ListenConfig{Address: "unix:///tmp/x.sock", Insecure: true}, "TCP addresses only"},
		{server.ListenConfig{Address: "127.0.0.1:0", TLSCert: certs.serverCert, TLSKey: "/nonexistent"}, "load server certificate"},
		{server.ListenConfig{Address: "127.0.0.1:0", TLSCert: certs.serverCert, TLSKey: certs.serverKey, TLSClientCA: certs.serverKey}, "no PEM certificate"},
		{server.ListenConfig{Address: "http://x:1"}, "unknown scheme"},
	} {
		if _, _, err := tc.cfg.Options(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want %q", tc.cfg, err, tc.want)
		}
	}
	if _, _, err := (server.ListenConfig{Address: "127.0.0.1:0", Insecure: true}).Options(); err != nil {
		t.Errorf("--insecure on loopback: %v", err)
	}
}

func TestTLSWithClientCertificates(t *testing.T) {
	certs := writeCerts(t)
	s := startServer(t, server.ListenConfig{Address: "127.0.0.1:0", TLSCert: certs.serverCert, TLSKey: certs.serverKey, TLSClientCA: certs.ca}, 0)
	s.feed([]*model.ServiceEndpoints{svc("ns", "a", ep("10.0.0.1", "node-a"))})

	good := runClient(t, remote.Config{Address: s.addr, NodeName: "node-a", TLSCA: certs.ca, TLSCert: certs.clientCert, TLSKey: certs.clientKey})
	good.WaitSyncs(t, 1, 20*time.Second)
	if diff := cmp.Diff([]string{"a/10.0.0.1"}, localKeys(good.State())); diff != "" {
		t.Errorf("TLS client state (-want +got):\n%s", diff)
	}
	// Without a client certificate, or without trusting the server's CA,
	// nothing is received. Each goes through a proxy of its own that
	// counts its connections: a second connection means that the first
	// one was refused (the client tries again).
	clients := map[string]remote.Config{
		"no client cert": {NodeName: "node-a", TLSCA: certs.ca},
		"unknown CA":     {NodeName: "node-a", TLSCert: certs.clientCert, TLSKey: certs.clientKey},
		"plain TCP":      {NodeName: "node-a", Insecure: true},
	}
	checkers, conns := map[string]*sinktest.Checker{}, map[string]func() int{}
	for name, cfg := range clients {
		cfg.Address, conns[name] = countingProxy(t, s.addr)
		checkers[name] = runClient(t, cfg)
	}
	for name, n := range conns {
		for deadline := time.Now().Add(20 * time.Second); n() < 2; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d connections in 20 s, want a second one (the first refused)", name, n())
			}
		}
	}
	for name, r := range checkers {
		if calls := r.TakeCalls(); len(calls) != 0 {
			t.Errorf("%s: received %q, want nothing", name, calls)
		}
	}
	if _, _, err := (remote.Config{Address: "192.0.2.1:1", Insecure: true}).DialOptions(); err == nil {
		t.Errorf("client --api-insecure to a non-loopback address: no error")
	}
}

// countingProxy forwards the TCP connections made to the address it
// returns to target, until the test ends, and counts them.
func countingProxy(t *testing.T, target string) (string, func() int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var open []net.Conn
	n := 0
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			mu.Lock()
			n++
			open = append(open, c)
			if err == nil {
				open = append(open, up)
			}
			mu.Unlock()
			if err != nil {
				c.Close()
				continue
			}
			for _, pair := range [][2]net.Conn{{c, up}, {up, c}} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, _ = io.Copy(pair[0], pair[1])
					pair[0].Close()
					pair[1].Close()
				}()
			}
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range open {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String(), func() int { mu.Lock(); defer mu.Unlock(); return n }
}

func TestBadAndStalledClientsDoNotHurtOthers(t *testing.T) {
	addr := socketAddr(t)
	// The send timeout drops the stalled client; 2 s, not less, so that the
	// good client, decoding its 100,000 endpoints under -race on a loaded
	// 2-core machine (make unit runs packages in parallel), is not dropped
	// as stalled too (it was at 500 ms: 3 connections, 2 dropped).
	s := startServer(t, server.ListenConfig{Address: addr}, 2*time.Second)
	// A state bigger than a stalled client's flow-control windows (server.WindowSize).
	var state []*model.ServiceEndpoints
	for i := range 10000 {
		var eps []*model.Endpoint
		for j := range 10 {
			eps = append(eps, ep(net.IPv4(10, byte(i>>8), byte(i), byte(j+1)).String(), "node-x"))
		}
		state = append(state, svc("ns", fmt.Sprintf("s%s%05d", strings.Repeat("x", 40), i), eps...))
	}
	s.feed(state)

	good := runClient(t, remote.Config{Address: addr, NodeName: "node-a"})
	// The first state is 100,000 endpoints: under -race on a loaded
	// 2-core machine it took more than 20 s (CI, 3,260 services after 20 s).
	good.WaitSyncs(t, 1, 90*time.Second)

	// Garbage on the socket.
	conn, err := net.Dial("unix", strings.TrimPrefix(addr, "unix://"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write([]byte("GET / HTTP/1.1\r\nthis is not gRPC\r\n\r\n\x00\x01\x02")); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	// A client that opens a watch and never reads it.
	target, opts, _ := remote.Config{Address: addr}.DialOptions()
	stalledConn, err := grpc.NewClient(target, append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer stalledConn.Close()
	if _, err := kpngv1.NewControllerClient(stalledConn).Watch(context.Background(), &kpngv1.WatchRequest{NodeName: "stalled"}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for s.hub.Subscribers() != 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	// The good client still gets changes while the other one stalls.
	state[0] = svc("ns", state[0].Service.Name, ep("10.200.0.1", "node-a"))
	s.feed(state)
	good.WaitSyncs(t, 2, 20*time.Second)
	if got := localKeys(good.State()); len(got) != 1 || !strings.HasSuffix(got[0], "10.200.0.1") {
		t.Errorf("good client's local endpoints %v, want the new one", got)
	}
	// The stalled one is dropped after the send timeout (2 s); waited for
	// from here, with room for a loaded machine (the good client's sync
	// above may have taken most of the first wait).
	deadline = time.Now().Add(60 * time.Second)
	for s.hub.Subscribers() != 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := s.hub.Subscribers(); n != 1 {
		t.Errorf("%d subscribers, want the stalled one dropped", n)
	}
	st := s.srv.Stats()
	if st.Connected != 1 || st.Connections != 2 || st.Dropped != 1 || st.SentBatches < 2 || st.SentBytes < 1<<20 {
		t.Errorf("stats %+v, want 1 connected of 2 connections, 1 dropped, the first state's megabytes sent", st)
	}
}

// TestRemoteClientRetriesFailedSync checks that when a remote backend's
// Sync fails, the client calls it again after a backoff without waiting for
// a change from the controller, and then delivers changes as usual.
func TestRemoteClientRetriesFailedSync(t *testing.T) {
	s := startServer(t, server.ListenConfig{Address: socketAddr(t)}, 0)
	first := []*model.ServiceEndpoints{svc("ns", "a", ep("10.0.0.1", "node-a"))}
	s.feed(first)
	r := sinktest.NewChecker(nil)
	r.FailSyncs(fmt.Errorf("rules rejected"))
	r2 := runClientInto(t, remote.Config{Address: s.addr, NodeName: "node-a"}, r)
	r2.WaitSyncs(t, 2, 20*time.Second)
	if diff := cmp.Diff([]string{"Reset", "Update ns/a service +10.0.0.1", "Sync failed", "Sync"}, r.TakeCalls()); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
	s.feed([]*model.ServiceEndpoints{svc("ns", "a", ep("10.0.0.1", "node-a"), ep("10.0.0.2", "node-b"))})
	r.WaitSyncs(t, 3, 20*time.Second)
	if diff := cmp.Diff([]string{"Update ns/a +10.0.0.2", "Sync"}, r.TakeCalls()); diff != "" {
		t.Errorf("calls after the retry (-want +got):\n%s", diff)
	}
}

// TestClusterFactsOverTheWire: the cluster-level facts fed to the hub
// reach a remote backend's sink in the round where they change (on the
// wire: the cluster field of Sync), also their removal, and a controller
// restarted without them makes the backend drop them, with nothing else.
func TestClusterFactsOverTheWire(t *testing.T) {
	addr := socketAddr(t)
	facts := func(cidrs ...string) *model.Cluster {
		c := &model.Cluster{}
		for _, p := range cidrs {
			c.ServiceCIDRs = append(c.ServiceCIDRs, netip.MustParsePrefix(p))
		}
		return c
	}
	s := startServer(t, server.ListenConfig{Address: addr}, 0)
	f := localsink.NewFeeder(s.hub, localsink.FeederOptions{NoRetry: true})
	defer f.Close()
	a := svc("ns", "a", ep("10.0.0.1", "node-a"))
	f.SetCluster(facts("10.96.0.0/16"))
	f.Update(a.Service.Key(), a)
	_ = f.Sync()
	r := runClient(t, remote.Config{Address: addr, NodeName: "node-a"})
	r.WaitSyncs(t, 1, 20*time.Second)
	for i, step := range []struct {
		cluster *model.Cluster
		want    []string
	}{
		{facts("10.96.0.0/16", "fd00::/108"), []string{"SetCluster service CIDRs 10.96.0.0/16,fd00::/108", "Sync"}},
		{nil, []string{"SetCluster none", "Sync"}},
		{facts("10.96.0.0/16"), []string{"SetCluster service CIDRs 10.96.0.0/16", "Sync"}},
	} {
		if i == 0 {
			if diff := cmp.Diff([]string{"Reset", "SetCluster service CIDRs 10.96.0.0/16", "Update ns/a service +10.0.0.1", "Sync"}, r.TakeCalls()); diff != "" {
				t.Errorf("first round (-want +got):\n%s", diff)
			}
		}
		f.SetCluster(step.cluster)
		_ = f.Sync()
		r.WaitSyncs(t, i+2, 20*time.Second)
		if diff := cmp.Diff(step.want, r.TakeCalls()); diff != "" {
			t.Errorf("step %d (-want +got):\n%s", i, diff)
		}
	}

	// The controller restarts without the facts: the backend forgets
	// them, and nothing else changes.
	s.stop()
	time.Sleep(300 * time.Millisecond)
	s2 := startServer(t, server.ListenConfig{Address: addr}, 0)
	s2.feed([]*model.ServiceEndpoints{a})
	r.WaitSyncs(t, 5, 20*time.Second)
	if diff := cmp.Diff([]string{"SetCluster none", "Sync"}, r.TakeCalls()); diff != "" {
		t.Errorf("after a restart without facts (-want +got):\n%s", diff)
	}
}

// TestTriggerTimesReachRemoteBackends: the trigger times of the changes
// fed to the controller reach each remote backend's round record once,
// with the round that applies them (whether the backend gets the two
// rounds apart or coalesced); a change without trigger times has none.
func TestTriggerTimesReachRemoteBackends(t *testing.T) {
	s := startServer(t, server.ListenConfig{Address: socketAddr(t)}, 0)
	feeder := localsink.NewFeeder(s.hub, localsink.FeederOptions{NoRetry: true})
	defer feeder.Close()
	a := model.ServiceKey{Namespace: "ns", Name: "a"}
	feeder.Update(a, svc("ns", "a", ep("10.0.0.1", "node-a")))
	if err := feeder.Sync(); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var got []time.Time
	c := runClient(t, remote.Config{Address: s.addr, NodeName: "node-a", Observe: func(r localsink.Round) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, r.Triggers[a]...)
	}})
	c.WaitSyncs(t, 1, 20*time.Second)
	t1, t2 := time.Unix(1700000000, 1), time.Unix(1700000001, 2)
	feeder.Update(a, svc("ns", "a", ep("10.0.0.2", "node-a")))
	feeder.Triggered(a, t1)
	if err := feeder.Sync(); err != nil {
		t.Fatal(err)
	}
	feeder.Update(a, svc("ns", "a", ep("10.0.0.3", "node-a")))
	feeder.Triggered(a, t2)
	if err := feeder.Sync(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if st := c.State(); len(st) == 1 && len(st[0].Endpoints) == 1 && st[0].Endpoints[0].Key() == "10.0.0.3" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the backend never got 10.0.0.3: %v", c.State())
		}
		time.Sleep(10 * time.Millisecond)
	}
	feeder.Update(a, svc("ns", "a", ep("10.0.0.4", "node-a"))) // no trigger time
	if err := feeder.Sync(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if st := c.State(); len(st) == 1 && st[0].Endpoints[0].Key() == "10.0.0.4" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the backend never got 10.0.0.4")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 || !got[0].Equal(t1) || !got[1].Equal(t2) {
		t.Errorf("trigger times measured by the backend: %v, want %v and %v", got, t1, t2)
	}
}

// TestStalledClientMemoryIsBounded keeps a backend that opened a watch and
// never reads it (its first state alone is larger than the flow-control
// windows) while 150 rounds change 20 services each of a 1,000-service
// state: the controller's heap after the last round is no larger than
// after the 30th, give or take 4 MiB (the hub keeps, per backend, the set
// of the services changed since its last send, never a queue of states
// or batches: 120 rounds of changes are some 13 MiB of operations). That
// the stalled backend is dropped after the send timeout and the others
// are unaffected is TestBadAndStalledClientsDoNotHurtOthers.
func TestStalledClientMemoryIsBounded(t *testing.T) {
	addr := socketAddr(t)
	s := startServer(t, server.ListenConfig{Address: addr}, 10*time.Minute)
	node := strings.Repeat("n", 600) // large endpoints: a first state over the windows
	var state []*model.ServiceEndpoints
	for i := range 1000 {
		var eps []*model.Endpoint
		for j := range 8 {
			eps = append(eps, ep(net.IPv4(10, byte(i>>8), byte(i), byte(j+1)).String(), node))
		}
		state = append(state, svc("ns", fmt.Sprintf("s%05d", i), eps...))
	}
	s.feed(state)

	target, opts, _ := remote.Config{Address: addr}.DialOptions()
	stalledConn, err := grpc.NewClient(target, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer stalledConn.Close()
	if _, err := kpngv1.NewControllerClient(stalledConn).Watch(context.Background(), &kpngv1.WatchRequest{NodeName: "stalled"}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.hub.Subscribers() != 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}

	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	var at30 uint64
	start := time.Now()
	for round := 1; round <= 150; round++ {
		// 20 services get a new endpoint each round.
		for k := range 20 {
			i := (round*20 + k) % len(state)
			eps := append(slices.Clone(state[i].Endpoints[:7]), ep(fmt.Sprintf("10.200.%d.%d", round%250, k+1), node))
			state[i] = svc("ns", state[i].Service.Name, eps...)
		}
		s.feed(state)
		if round == 30 {
			at30 = heap()
		}
	}
	after := heap()
	if n := s.hub.Subscribers(); n != 1 {
		t.Fatalf("%d subscribers after the rounds, want the stalled one still there", n)
	}
	t.Logf("heap with a stalled backend: %d KiB after 30 rounds, %d KiB after 150 (%v)", at30>>10, after>>10, time.Since(start).Round(time.Millisecond))
	if after > at30+4<<20 {
		t.Errorf("the heap grew from %d KiB to %d KiB over 120 rounds while a backend stalled", at30>>10, after>>10)
	}
}
