//go:build linux

package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"k8s.io/client-go/kubernetes"

	"sigs.k8s.io/kpng/api/kpngv1"
	"sigs.k8s.io/kpng/cmd/kpng/app"
	"sigs.k8s.io/kpng/internal/controlplane"
	"sigs.k8s.io/kpng/internal/kubetest"
)

var cp *controlplane.ControlPlane

// runKpngEnv makes the test binary run kpng (the controller the tool
// starts) instead of the tests.
const runKpngEnv = "KPNG_SCALE_TEST_RUN_KPNG=1"

func TestMain(m *testing.M) {
	if os.Getenv("KPNG_SCALE_TEST_RUN_KPNG") == "1" {
		os.Exit(app.Main(os.Args[1:], os.Stdout, os.Stderr))
	}
	if ok, err := floorPart(); ok {
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	controlplane.Main(m, &cp)
}

// TestSmallRun runs the tool at 5 nodes and 20 services against the real
// API server and a controller process: every backend must get its whole
// first state with its own Local endpoints, and every change; nothing
// else. With a connection a backend, the light backends speak HTTP/2
// themselves (h2.go), and their first state must hash as the grpc-go
// backends' that read every field; on TCP loopback as on a unix socket.
func TestSmallRun(t *testing.T) {
	cp.Require(t)
	rc := cp.RESTConfig()
	rc.QPS, rc.Burst = 500, 1000
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name           string
		streamsPerConn int
		raw            int // light backends speaking HTTP/2 themselves
		gap            time.Duration
		tcp, tls       bool
		peers          bool // following the controller's replicas
	}{
		{"grpc-go two streams a connection following the replicas", 2, 0, 0, false, false, true},
		{"raw HTTP/2 light backends and changes 200 ms apart", 1, 3, 200 * time.Millisecond, false, false, false},
		{"on TCP loopback", 1, 3, 0, true, false, false},
		{"with TLS and node certificates following the replicas", 1, 3, 0, true, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config{
				kpng: []string{os.Args[0]}, env: []string{runKpngEnv},
				nodes: 5, services: 20, endpoints: 10, changes: 10, streamsPerConn: tc.streamsPerConn, readAll: 2,
				dir: t.TempDir(), firstStateTimeout: 2 * time.Minute, changeTimeout: time.Minute,
				namespace: kubetest.UniqueName("scale"), createWorkers: 4, logf: t.Logf,
				changeGap: tc.gap, tcp: tc.tcp, tls: tc.tls, peers: tc.peers, replicaChanges: 4,
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			res, err := run(ctx, cfg, c, cp.KubeconfigPath())
			if err != nil {
				t.Fatal(err)
			}
			// Each change after the first waits for the gap: a lower
			// bound of the changes' phase, whatever the machine (back to
			// back, 10 changes at 5 nodes take some 0.2 s).
			if least := time.Duration(cfg.changes-1) * tc.gap; res.changesTook < least || res.changesTook == 0 {
				t.Errorf("the changes took %v, less than their gaps (%v)", res.changesTook, least)
			}
			if len(res.problems) > 0 {
				t.Fatalf("the run's checks failed:\n%v", res.problems)
			}
			if res.firstStateBytes == 0 || res.bytesPerChangePerNode == 0 || res.rssPeak == 0 {
				t.Errorf("bytes or RSS not measured: %s", res.closing())
			}
			// The last floor is the state's bytes (the first states
			// were deflated): the target's.
			want := []string{"unix", "unix", "tcp", "unix", "unix"}
			if tc.tcp {
				want = []string{"tcp", "tcp", "unix", "tcp", "tcp"}
			}
			pinnedAt, connsAt, stateAt := 1, 3, 4
			if twoCores() == nil { // one CPU, or no taskset
				want = slices.Delete(want, 1, 2)
				pinnedAt, connsAt, stateAt = -1, 2, 3
			}
			if len(res.floors) != len(want) {
				t.Fatalf("%d floors measured, want %d (%v): %v", len(res.floors), len(want), want, res.floors)
			}
			for i, f := range res.floors {
				pinned := len(f.cores) == 2
				if f.network != want[i] || f.took <= 0 || pinned != (i == pinnedAt) || (f.conns > 0) != (i == connsAt) || f.state != (i == stateAt) {
					t.Errorf("floor %d: %s (%s), want one measured on %s", i, f, f.network, want[i])
				}
			}
			if sent, state := res.floors[0].bytes, res.floors[stateAt].bytes; state <= sent || state != int64(res.firstStateInflated*float64(res.nodes)) {
				t.Errorf("the state's floor wrote %d bytes, the bytes sent's %d: want the first states inflated, %.0f a backend", state, sent, res.firstStateInflated)
			}
			if c := res.floors[connsAt].conns; c != res.nodes {
				t.Errorf("the floor over the backends' connections used %d, want %d", c, res.nodes)
			}
			if res.rawBackends != tc.raw {
				t.Errorf("%d backends spoke HTTP/2 themselves, want %d", res.rawBackends, tc.raw)
			}
			// Every change of the replicas reached every backend (run
			// fails otherwise), each timed.
			if want := map[bool]int{true: cfg.replicaChanges}[tc.peers]; res.replicaChanges != want || (tc.peers && (res.replicaMax <= 0 || res.replicasHeld <= 0)) {
				t.Errorf("%d changes of the replicas measured (max %v, first list held after %v), want %d", res.replicaChanges, res.replicaMax, res.replicasHeld, want)
			}
			if want := map[bool]int{true: tc.raw}[tc.tls]; res.nodeCerts != want {
				t.Errorf("%d backends did a TLS handshake with their node's certificate, want %d", res.nodeCerts, want)
			}
			t.Log(res.details() + res.closing())
		})
	}
}

// TestBackendChecks feeds a backend batches and checks what it counts: the
// first state's services, endpoints and Local endpoints of its namespace
// only, the changes of the run after it, and set_endpoint ops that are no
// change of the run.
func TestBackendChecks(t *testing.T) {
	setEP := func(ns, name, ip string, local, ready bool) *kpngv1.Op {
		return &kpngv1.Op{Op: &kpngv1.Op_SetEndpoint{SetEndpoint: &kpngv1.SetEndpoint{
			Service: &kpngv1.ServiceKey{Namespace: ns, Name: name}, Key: ip,
			Endpoint: &kpngv1.Endpoint{Local: local, Ready: ready, Serving: true}}}}
	}
	sync := &kpngv1.Op{Op: &kpngv1.Op_Sync{Sync: &kpngv1.Sync{}}}
	first := &kpngv1.Batch{Ops: []*kpngv1.Op{
		{Op: &kpngv1.Op_Reset_{Reset_: &kpngv1.Reset{}}},
		{Op: &kpngv1.Op_SetService{SetService: &kpngv1.Service{Namespace: "scale", Name: "s00000"}}},
		setEP("scale", "s00000", "10.1.0.1", true, true),
		setEP("scale", "s00000", "10.1.0.2", false, true),
		{Op: &kpngv1.Op_SetService{SetService: &kpngv1.Service{Namespace: "default", Name: "kubernetes"}}},
		setEP("default", "kubernetes", "10.0.0.1", false, true),
		sync,
	}}
	changes := []*change{
		{service: "s00000", key: "10.1.0.2", done: make(chan struct{}), at: make([]int64, 1)},
		{service: "s00001", key: "10.1.1.1", done: make(chan struct{}), at: make([]int64, 1)},
	}
	b := &backend{name: "node-00000", namespace: "scale", all: changes, total: 1, firstState: make(chan struct{}),
		changes: map[string]int{"s00000/10.1.0.2": 0, "s00001/10.1.1.1": 1}}
	feed := func(batch *kpngv1.Batch) {
		t.Helper()
		data, err := proto.Marshal(batch)
		if err != nil {
			t.Fatal(err)
		}
		if err := (rawCodec{}).Unmarshal(data, b); err != nil {
			t.Fatal(err)
		}
	}
	feed(first)
	select {
	case <-b.firstState:
	default:
		t.Fatal("no first state after a Sync")
	}
	got := []int{b.services, b.endpoints, b.local}
	if diff := cmp.Diff([]int{1, 2, 1}, got); diff != "" {
		t.Errorf("first state: services, endpoints, local (-want +got):\n%s", diff)
	}
	// Change 0 arrives, split over two batches; a ready endpoint is not
	// change 1 (which makes it not ready), and another service's endpoint
	// is no change at all.
	feed(&kpngv1.Batch{Ops: []*kpngv1.Op{setEP("scale", "s00000", "10.1.0.2", false, false)}})
	if b.receivedAfter.Load() != 0 {
		t.Error("a change counted before the Sync ending its round")
	}
	feed(&kpngv1.Batch{Ops: []*kpngv1.Op{setEP("scale", "s00001", "10.1.1.1", false, true), setEP("scale", "s00002", "10.1.2.1", false, false), sync}})
	select {
	case <-changes[0].done:
	default:
		t.Error("change 0 not done")
	}
	select {
	case <-changes[1].done:
		t.Error("change 1 done by an endpoint made ready")
	default:
	}
	if b.unexpected != 2 {
		t.Errorf("%d unexpected set_endpoint ops, want 2", b.unexpected)
	}
	if err := (rawCodec{}).Unmarshal([]byte{0x0a, 0x05, 0x01}, b); err == nil {
		t.Error("a truncated batch was read")
	}
}

// TestHasSync checks the light backends' reading of a Batch against
// eachOp's general decoding: with and without a sync, operations whose
// length takes several bytes, and malformed batches.
func TestHasSync(t *testing.T) {
	big := &kpngv1.Op{Op: &kpngv1.Op_SetService{SetService: &kpngv1.Service{Namespace: "scale", Name: string(make([]byte, 70000))}}}
	svc := &kpngv1.Op{Op: &kpngv1.Op_SetService{SetService: &kpngv1.Service{Namespace: "scale", Name: "s00001"}}}
	sync := &kpngv1.Op{Op: &kpngv1.Op_Sync{Sync: &kpngv1.Sync{}}}
	reset := &kpngv1.Op{Op: &kpngv1.Op_Reset_{Reset_: &kpngv1.Reset{}}}
	for _, tc := range []struct {
		name string
		ops  []*kpngv1.Op
	}{
		{"empty", nil},
		{"services", []*kpngv1.Op{svc, big, svc}},
		{"services then sync", []*kpngv1.Op{svc, big, sync}},
		{"a long operation then sync", []*kpngv1.Op{big, sync}},
		{"reset", []*kpngv1.Op{reset}},
		{"sync alone", []*kpngv1.Op{sync}},
	} {
		data, err := proto.Marshal(&kpngv1.Batch{Ops: tc.ops})
		if err != nil {
			t.Fatal(err)
		}
		// Whole, and cut short by up to 8 bytes: where eachOp reads a
		// Batch, hasSync must say what it holds; where eachOp finds it
		// malformed, hasSync must not say "no sync".
		for cut := 0; cut <= min(len(data), 8); cut++ {
			part := data[:len(data)-cut]
			want := false
			_, refErr := eachPlainOp(part, func(op []byte) error {
				if k, _, _ := protowire.ConsumeTag(op); k == opSync {
					want = true
				}
				return nil
			})
			got, err := hasSync(part)
			switch {
			case refErr == nil && (err != nil || got != want):
				t.Errorf("%s cut by %d bytes: hasSync = %v, %v; want %v", tc.name, cut, got, err, want)
			case refErr != nil && !got && err == nil:
				t.Errorf("%s cut by %d bytes (malformed): hasSync says no sync, no error", tc.name, cut)
			}
		}
	}
	// Another field than ops (none today) is skipped, as eachOp does.
	sync0, err := proto.Marshal(&kpngv1.Batch{Ops: []*kpngv1.Op{sync}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		data []byte
		want bool
	}{
		{"another field alone", []byte{0x12, 0x00}, false},
		{"another field, then a sync", append([]byte{0x12, 0x01, 0x07}, sync0...), true},
	} {
		if got, err := hasSync(tc.data); err != nil || got != tc.want {
			t.Errorf("%s: hasSync = %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
}

// TestTarget checks the first states' verdict: against the floor of the
// state's bytes when the first states were deflated, within + 20% and
// not beyond; against the bytes sent, the first floor, when they are the
// state's; not measured without floors.
func TestTarget(t *testing.T) {
	sent := floor{network: "unix", took: 500 * time.Millisecond, bytes: 5e9}
	state := floor{network: "unix", took: 3 * time.Second, bytes: 36e9, state: true}
	// What the run measures after the bytes sent, as they are: on two
	// cores, on the other transport, through a connection a backend.
	others := []floor{{network: "unix", cores: []int{0, 1}, took: 2 * time.Second, bytes: 5e9}, {network: "tcp", took: time.Second, bytes: 5e9}, {network: "unix", conns: 5000, took: 400 * time.Millisecond, bytes: 5e9}}
	for _, tc := range []struct {
		name       string
		firstState time.Duration
		floors     []floor
		want       string
	}{
		{"deflated, within + 20% of the state's bytes", 3500 * time.Millisecond, append(append([]floor{sent}, others...), state), "(7200000 a backend) through a unix socket alone + 20% (3.60 s): met, 1.17 × that floor; 7.00 × the floor of the bytes sent (1000000 a backend, deflated)"},
		{"deflated, at + 20% of the state's bytes", 3600 * time.Millisecond, []floor{sent, state}, "(3.60 s): met, 1.20 × that floor"},
		{"deflated, beyond + 20% of the state's bytes", 3700 * time.Millisecond, []floor{sent, state}, "(3.60 s): not met, 1.23 × that floor"},
		{"as they are, against the bytes sent", 700 * time.Millisecond, append([]floor{sent}, others...), "(1000000 a backend) through a unix socket alone + 20% (0.60 s): not met, 1.40 × that floor"},
		{"as they are, within + 20%", 550 * time.Millisecond, append([]floor{sent}, others...), "(0.60 s): met, 1.10 × that floor"},
		{"the state's floor not measured", 550 * time.Millisecond, []floor{sent, {network: "unix", state: true}}, "target: not measured"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := result{nodes: 5000, firstStateAll: tc.firstState, floors: tc.floors, firstStateBytes: 1e6}
			got := r.target()
			if !strings.Contains(got, tc.want) {
				t.Errorf("target() = %q, want it to say %q", got, tc.want)
			}
			if !tc.floors[len(tc.floors)-1].state && strings.Contains(got, "bytes sent") {
				t.Errorf("target() = %q compares with the bytes sent twice", got)
			}
		})
	}
	if got := (result{nodes: 5000}).target(); got != "target: not measured" {
		t.Errorf("target() without floors = %q", got)
	}
}
