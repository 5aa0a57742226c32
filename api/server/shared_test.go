package server_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"

	"sigs.k8s.io/kpng/api/kpngv1"
	"sigs.k8s.io/kpng/api/server"
	"sigs.k8s.io/kpng/client/remote"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/localsink/sinktest"
	"sigs.k8s.io/kpng/model"
)

// watchIndependent opens a node-independent Watch stream (have: the state
// hash the client holds) and returns a channel of its batches.
func watchIndependent(t *testing.T, addr, node string, have []byte) <-chan *kpngv1.Batch {
	t.Helper()
	return watchWith(t, addr, &kpngv1.WatchRequest{NodeName: node, NodeIndependent: true, HaveState: have})
}

func nextBatch(t *testing.T, ch <-chan *kpngv1.Batch, who string) *kpngv1.Batch {
	t.Helper()
	select {
	case b, ok := <-ch:
		if !ok {
			t.Fatalf("%s: stream closed", who)
		}
		return b
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no batch within 10s", who)
	}
	return nil
}

// untilSync reads batches up to the one holding a sync (a first state
// is several) and returns their operations as one Batch.
func untilSync(t *testing.T, ch <-chan *kpngv1.Batch, who string) *kpngv1.Batch {
	t.Helper()
	all := &kpngv1.Batch{}
	for {
		b := nextBatch(t, ch, who)
		all.Ops = append(all.Ops, b.GetOps()...)
		for _, op := range b.GetOps() {
			if op.GetSync() != nil {
				return all
			}
		}
	}
}

// TestNodeIndependentStreamsShareTheirBytes: backends that compute their
// own view are all sent the same batches, from one snapshot, with no
// endpoint marked local; only the Reset (their node's facts) and a node's
// set_node are their own.
func TestNodeIndependentStreamsShareTheirBytes(t *testing.T) {
	s := startServer(t, server.ListenConfig{Address: socketAddr(t)}, 0)
	s.hub.SetNodeZone("node-a", "z1")
	hinted := ep("10.0.0.2", "node-b")
	hinted.Hints = &model.Hints{Zones: []string{"z1", "z2"}}
	s.feed([]*model.ServiceEndpoints{svc("ns", "a", ep("10.0.0.1", "node-a"), hinted), svc("ns", "b", ep("10.0.1.1", "node-c"))})

	nodes := []string{"node-a", "node-b", "node-c"}
	streams := map[string]<-chan *kpngv1.Batch{}
	for _, n := range nodes {
		streams[n] = watchIndependent(t, s.addr, n, nil)
	}
	var first []*kpngv1.Batch
	for _, n := range nodes {
		reset := nextBatch(t, streams[n], n)
		wantZone := map[string]string{"node-a": "z1"}[n]
		if len(reset.GetOps()) != 1 || reset.GetOps()[0].GetReset_().GetNode() == nil || reset.GetOps()[0].GetReset_().GetNode().GetZone() != wantZone {
			t.Fatalf("%s: first batch %v, want a Reset naming zone %q", n, reset, wantZone)
		}
		state := untilSync(t, streams[n], n)
		for _, op := range state.GetOps() {
			if e := op.GetSetEndpoint().GetEndpoint(); e.GetLocal() || e.GetHints().GetSameZone() {
				t.Errorf("%s: endpoint %s sent with its node's view (local %v, same_zone %v), want none", n, op.GetSetEndpoint().GetKey(), e.GetLocal(), e.GetHints().GetSameZone())
			}
		}
		if first == nil {
			first = []*kpngv1.Batch{state}
		} else if !proto.Equal(first[0], state) {
			t.Errorf("%s: first state differs from node-a's:\n%v\n%v", n, state, first[0])
		}
	}
	if got := s.hub.SharedStats().Snapshots; got != 1 {
		t.Errorf("snapshots encoded for 3 first states: %d, want 1", got)
	}

	// A change: the same round for all.
	notReady := ep("10.0.0.1", "node-a")
	notReady.Ready = false
	s.feed([]*model.ServiceEndpoints{svc("ns", "a", notReady, hinted), svc("ns", "b", ep("10.0.1.1", "node-c"))})
	var round *kpngv1.Batch
	for _, n := range nodes {
		b := nextBatch(t, streams[n], n)
		if diff := cmp.Diff([]string{"SetEndpoint 10.0.0.1", "Sync"}, opNames(b)); diff != "" {
			t.Errorf("%s: round (-want +got):\n%s", n, diff)
		}
		if round == nil {
			round = b
		} else if !proto.Equal(round, b) {
			t.Errorf("%s: round differs: %v, want %v", n, b, round)
		}
	}

	// node-b's zone: only node-b hears of it, as its node's facts.
	s.hub.SetNodeZone("node-b", "z2")
	b := nextBatch(t, streams["node-b"], "node-b")
	if ops := b.GetOps(); len(ops) != 2 || ops[0].GetSetNode().GetZone() != "z2" || ops[1].GetSync() == nil || len(ops[1].GetSync().GetStateHash()) != 0 {
		t.Errorf("node-b after its zone changed: %v, want set_node z2 then a sync naming no state", b)
	}
	nothing(t, streams["node-a"], "node-a")
	nothing(t, streams["node-c"], "node-c")
}

// TestClientComputesItsView: through the remote client, each backend sees
// its own Local endpoints and hint matches, and a zone change reaches the
// sink as a change of the hinted endpoint only, whichever way the view is
// computed.
func TestClientComputesItsView(t *testing.T) {
	for _, perNode := range []bool{false, true} {
		name := map[bool]string{false: "node-independent", true: "per-node"}[perNode]
		t.Run(name, func(t *testing.T) {
			s := startServer(t, server.ListenConfig{Address: socketAddr(t)}, 0)
			hinted := ep("10.0.0.2", "node-b")
			hinted.Hints = &model.Hints{Zones: []string{"z2"}}
			s.feed([]*model.ServiceEndpoints{svc("ns", "a", ep("10.0.0.1", "node-a"), hinted)})
			a := runClient(t, remote.Config{Address: s.addr, NodeName: "node-a", PerNodeView: perNode})
			b := runClient(t, remote.Config{Address: s.addr, NodeName: "node-b", PerNodeView: perNode})
			a.WaitSyncs(t, 1, 20*time.Second)
			b.WaitSyncs(t, 1, 20*time.Second)
			if diff := cmp.Diff([]string{"a/10.0.0.1"}, localKeys(a.State())); diff != "" {
				t.Errorf("node-a local endpoints (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]string{"a/10.0.0.2"}, localKeys(b.State())); diff != "" {
				t.Errorf("node-b local endpoints (-want +got):\n%s", diff)
			}
			a.TakeCalls()
			b.TakeCalls()
			s.hub.SetNodeZone("node-b", "z2")
			b.WaitSyncs(t, 2, 20*time.Second)
			if diff := cmp.Diff([]string{"Update ns/a +10.0.0.2", "Sync"}, b.TakeCalls()); diff != "" {
				t.Errorf("node-b after its zone changed (-want +got):\n%s", diff)
			}
			if h := b.State()[0].Endpoints[1].Hints; h == nil || !h.SameZone {
				t.Errorf("node-b's view of the hinted endpoint: %+v, want same_zone", h)
			}
			if got := a.TakeCalls(); len(got) != 0 {
				t.Errorf("node-a after node-b's zone changed: %q, want nothing", got)
			}
		})
	}
}

// TestStreamsWithoutNodeViewsAreShared: a hub without node views (the file
// and api inputs) sends every backend, old clients included, the shared
// state as it was fed.
func TestStreamsWithoutNodeViewsAreShared(t *testing.T) {
	hub := server.NewHub(false)
	s := startServerOn(t, server.ListenConfig{Address: socketAddr(t)}, server.Options{}, hub)
	local := ep("10.0.0.1", "node-a")
	local.Local = true
	s.feed([]*model.ServiceEndpoints{svc("ns", "a", local, ep("10.0.0.2", "node-b"))})
	old := rawWatch(t, s.addr, "node-b")
	if diff := cmp.Diff([]string{"Reset"}, next(t, old, "old client")); diff != "" {
		t.Errorf("old client's first batch (-want +got):\n%s", diff)
	}
	c := runClient(t, remote.Config{Address: s.addr, NodeName: "node-b"})
	c.WaitSyncs(t, 1, 20*time.Second)
	if diff := cmp.Diff([]string{"a/10.0.0.1"}, localKeys(c.State())); diff != "" {
		t.Errorf("local endpoints as fed (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"SetService a", "SetEndpoint 10.0.0.1", "SetEndpoint 10.0.0.2", "Sync"}, opNames(untilSync(t, old, "old client"))); diff != "" {
		t.Errorf("old client's first state (-want +got):\n%s", diff)
	}
	if got := hub.SharedStats().Snapshots; got != 1 {
		t.Errorf("snapshots: %d, want 1 for both", got)
	}
}

// gatedSink passes the calls on to a sink, but Sync waits while the gate
// is closed: the client stops reading its stream.
type gatedSink struct {
	localsink.Sink
	mu   sync.Mutex
	open chan struct{}
}

func (g *gatedSink) close() {
	g.mu.Lock()
	g.open = make(chan struct{})
	g.mu.Unlock()
}

func (g *gatedSink) reopen() {
	g.mu.Lock()
	close(g.open)
	g.mu.Unlock()
}

func (g *gatedSink) Sync() error {
	g.mu.Lock()
	open := g.open
	g.mu.Unlock()
	if open != nil {
		<-open
	}
	return g.Sink.Sync()
}

// TestSlowStreamCatchesUpFromASnapshot: a backend that stops reading while
// the rounds it misses outgrow the hub's log costs the hub no more than
// the log's bound, and when it reads again it is sent the latest state
// whole, which its client turns into the difference.
func TestSlowStreamCatchesUpFromASnapshot(t *testing.T) {
	s := startServer(t, server.ListenConfig{Address: socketAddr(t)}, 0)
	server.SetLogLimit(s.hub, 1<<20)
	big := func(gen int) *model.ServiceEndpoints {
		se := svc("ns", "big", ep("10.0.0.1", "node-a"))
		se.Service.Labels = map[string]string{"blob": strings.Repeat("x", 200<<10), "gen": strings.Repeat("g", gen%50+1)}
		return se
	}
	s.feed([]*model.ServiceEndpoints{big(0), svc("ns", "a", ep("10.0.1.1", "node-a"))})
	gate := &gatedSink{}
	c := sinktest.NewChecker(nil)
	cfg := remote.Config{Address: s.addr, NodeName: "node-a", MinBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond}
	sinktest.RunSource(t, "remote.Run", c, func(ctx context.Context, sink localsink.Sink) error {
		gate.Sink = sink
		return remote.Run(ctx, cfg, gate)
	})
	c.WaitSyncs(t, 1, 20*time.Second)
	deflated := s.hub.SharedStats().Deflated

	// The client stops reading while the hub publishes 100 rounds of
	// 200 KiB (20 MiB, past the 4 MiB flow-control windows and the
	// socket's buffers).
	gate.close()
	for i := 1; i <= 100; i++ {
		s.feed([]*model.ServiceEndpoints{big(i), svc("ns", "a", ep("10.0.1.1", "node-a"))})
	}
	last := []*model.ServiceEndpoints{big(100), svc("ns", "a", ep("10.0.1.1", "node-a"), ep("10.0.1.2", "node-b"))}
	s.feed(last)
	if st := s.hub.SharedStats(); st.LogBytes > 2<<20 {
		t.Errorf("log holds %d bytes for a stalled backend, want at most its 1 MiB bound and one round", st.LogBytes)
	}
	gate.reopen()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := c.State()
		if len(st) == 2 && len(st[0].Endpoints) == 2 && st[1].Service.Labels["gen"] == strings.Repeat("g", 100%50+1) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the slow backend did not catch up: %d services", len(st))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := s.hub.SharedStats().CaughtUp; got == 0 {
		t.Errorf("the slow backend caught up without a snapshot: it was not behind the log")
	}
	if got := s.hub.SharedStats().Deflated; got == deflated {
		t.Errorf("the slow backend caught up with a snapshot whose changed batch was not compressed (client/remote takes deflated operations)")
	}
}

// TestReconnectToAControllerHoldingTheSameState: a backend that moves to
// another controller holding the same state (fed in another order) is not
// sent it again: the new stream starts with a sync, and the changes after
// it follow.
func TestReconnectToAControllerHoldingTheSameState(t *testing.T) {
	addr := socketAddr(t)
	a := svc("ns", "a", ep("10.0.0.1", "node-a"), ep("10.0.0.2", "node-b"))
	a.Service.Labels = map[string]string{"x": "1", "y": "2", "z": "3"}
	b := svc("ns", "b", ep("10.0.1.1", "node-b"))
	s := startServer(t, server.ListenConfig{Address: addr}, 0)
	s.feed([]*model.ServiceEndpoints{a, b})
	r := runClient(t, remote.Config{Address: addr, NodeName: "node-a"})
	r.WaitSyncs(t, 1, 20*time.Second)
	r.TakeCalls()
	s.stop()

	// Another controller, which saw the services come in another order.
	s2 := startServer(t, server.ListenConfig{Address: addr}, 0)
	s2.feed([]*model.ServiceEndpoints{b})
	s2.feed([]*model.ServiceEndpoints{b, a})
	deadline := time.Now().Add(20 * time.Second)
	for s2.hub.SharedStats().Resumed == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the backend did not resume on the second controller: %+v, %+v", s2.hub.SharedStats(), s2.srv.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st := s2.srv.Stats(); st.SentBytes > 100 {
		t.Errorf("the second controller sent %d bytes to a backend holding its state, want only a sync", st.SentBytes)
	}
	c := svc("ns", "c", ep("10.0.2.1", "node-a"))
	s2.feed([]*model.ServiceEndpoints{a, b, c})
	r.WaitSyncs(t, 2, 20*time.Second)
	// The sync the stream started with changed nothing: the sink was not
	// called for it.
	if diff := cmp.Diff([]string{"Update ns/c service +10.0.2.1", "Sync"}, r.TakeCalls()); diff != "" {
		t.Errorf("calls after moving (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"a/10.0.0.1", "c/10.0.2.1"}, localKeys(r.State())); diff != "" {
		t.Errorf("local endpoints after moving (-want +got):\n%s", diff)
	}
}

// TestFirstStateIsTheStateNow: a stream's first state is the state as it
// is now, not an earlier snapshot followed by the rounds since: a client
// that held the newer state (from another controller, whose state differs
// in something else) would see the newer services go and come back.
func TestFirstStateIsTheStateNow(t *testing.T) {
	addr := socketAddr(t)
	a, x := svc("ns", "a", ep("10.0.0.1", "node-a")), svc("ns", "x", ep("10.0.3.1", "node-a"))
	y := svc("ns", "y", ep("10.0.4.1", "node-b"))
	s1 := startServer(t, server.ListenConfig{Address: addr}, 0)
	s1.feed([]*model.ServiceEndpoints{a, x})
	r := runClient(t, remote.Config{Address: addr, NodeName: "node-a"})
	r.WaitSyncs(t, 1, 20*time.Second)
	r.TakeCalls()

	// The second controller has y too (the states differ: no resume). A
	// backend connected before x came made it encode a snapshot without x.
	s2 := startServer(t, server.ListenConfig{Address: socketAddr(t)}, 0)
	s2.feed([]*model.ServiceEndpoints{a, y})
	early := watchIndependent(t, s2.addr, "node-c", nil)
	nextBatch(t, early, "node-c")
	untilSync(t, early, "node-c")
	s2.feed([]*model.ServiceEndpoints{a, x, y})

	// The client moves to the second controller.
	s1.stop()
	s2.stop()
	startServerOn(t, server.ListenConfig{Address: addr}, server.Options{}, s2.hub)
	r.WaitSyncs(t, 2, 20*time.Second)
	time.Sleep(300 * time.Millisecond)
	if diff := cmp.Diff([]string{"Update ns/y service +10.0.4.1", "Sync"}, r.TakeCalls()); diff != "" {
		t.Errorf("calls after moving (-want +got):\n%s", diff)
	}
}

// TestDeflatedFirstStates: backends that take deflated operations get the
// large batches of their first state compressed, once for all of them, and
// hold the same operations as a backend that does not; a snapshot after a
// change compresses only the batch the change touched; a per-node stream
// asking for them gets its view as before.
func TestDeflatedFirstStates(t *testing.T) {
	s := startServer(t, server.ListenConfig{Address: socketAddr(t)}, 0)
	state := make([]*model.ServiceEndpoints, 2000)
	for i := range state {
		var eps []*model.Endpoint
		for e := range 10 {
			eps = append(eps, ep(fmt.Sprintf("10.%d.%d.%d", i>>8, i&255, e), fmt.Sprintf("node-%03d", (i*10+e)%500)))
		}
		state[i] = svc("ns", fmt.Sprintf("s%04d", i), eps...)
	}
	s.feed(state)

	type firstState struct {
		ops              *kpngv1.Batch
		bytes            int // received, as sent
		messages, fields int // messages with deflated_ops, and their fields
	}
	read := func(req *kpngv1.WatchRequest) firstState {
		ch := watchWith(t, s.addr, req)
		var fs firstState
		fs.ops = &kpngv1.Batch{}
		for first := true; ; first = false {
			b := nextBatch(t, ch, req.GetNodeName())
			fs.bytes += proto.Size(b)
			if n := len(b.GetDeflatedOps()); n > 0 {
				fs.messages++
				fs.fields += n
			}
			if ops := b.GetOps(); (first || (len(ops) > 0 && ops[len(ops)-1].GetSync() != nil)) && len(b.GetDeflatedOps()) > 0 {
				t.Errorf("%s: the first state's reset or sync came with deflated operations", req.GetNodeName())
			}
			if err := b.Inflate(); err != nil {
				t.Fatalf("%s: %v", req.GetNodeName(), err)
			}
			fs.ops.Ops = append(fs.ops.Ops, b.GetOps()...)
			if ops := b.GetOps(); len(ops) > 0 && ops[len(ops)-1].GetSync() != nil {
				return fs
			}
		}
	}
	plain := read(&kpngv1.WatchRequest{NodeName: "node-a", NodeIndependent: true})
	a := read(&kpngv1.WatchRequest{NodeName: "node-a", NodeIndependent: true, AcceptDeflated: true})
	b := read(&kpngv1.WatchRequest{NodeName: "node-a", NodeIndependent: true, AcceptDeflated: true})
	if plain.fields != 0 {
		t.Errorf("a backend that did not ask for deflated operations got %d batches of them", plain.fields)
	}
	if a.fields < 4 || b.fields != a.fields || b.messages != a.messages {
		t.Fatalf("deflated batches: %d and %d, in %d and %d messages; want the same, several", a.fields, b.fields, a.messages, b.messages)
	}
	if a.messages*2 > a.fields {
		t.Errorf("%d deflated batches came in %d messages, want several a message", a.fields, a.messages)
	}
	if !proto.Equal(plain.ops, a.ops) || !proto.Equal(plain.ops, b.ops) {
		t.Error("the first states inflated differ from the one sent as it is")
	}
	if a.bytes*3 > plain.bytes {
		t.Errorf("a deflated first state took %d bytes, the plain one %d: want under a third", a.bytes, plain.bytes)
	}
	st := s.hub.SharedStats()
	if st.Deflated != uint64(a.fields) {
		t.Errorf("batches compressed for two first states: %d, want %d (once each)", st.Deflated, a.fields)
	}

	// One endpoint changes: the next deflated first state compresses the
	// one batch holding its service again (s1000 is in the middle of a
	// batch: the batches end where they did).
	changed := *state[1000]
	changed.Endpoints = append([]*model.Endpoint(nil), changed.Endpoints...)
	cp := *changed.Endpoints[3]
	cp.Ready = false
	changed.Endpoints[3] = &cp
	next := append([]*model.ServiceEndpoints(nil), state...)
	next[1000] = &changed
	s.feed(next)
	c := read(&kpngv1.WatchRequest{NodeName: "node-c", NodeIndependent: true, AcceptDeflated: true})
	if got := s.hub.SharedStats().Deflated; got != st.Deflated+1 {
		t.Errorf("batches compressed after one service changed: %d more, want 1", got-st.Deflated)
	}
	plain2 := read(&kpngv1.WatchRequest{NodeName: "node-c", NodeIndependent: true})
	if !proto.Equal(plain2.ops, c.ops) {
		t.Error("after the change, the deflated first state differs from the plain one")
	}

	// A per-node stream: its node's view, as before.
	perNode := read(&kpngv1.WatchRequest{NodeName: "node-a", AcceptDeflated: true})
	if perNode.fields != 0 {
		t.Errorf("a per-node stream got %d deflated batches, want none", perNode.fields)
	}
}
