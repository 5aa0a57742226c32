//go:build linux

package main

import (
	"context"
	"net/netip"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"sigs.k8s.io/kpng/api/server"
	"sigs.k8s.io/kpng/client/remote"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

// TestRawBackendAgainstGRPC serves a state larger than a flow-control
// window (so the raw backend must give the controller its window back,
// and read messages of several frames) from the controller's gRPC server,
// to a raw backend and a grpc-go one reading every field: both must hold
// every service and endpoint, the same hash, and then a change; and the
// same with deflated operations, which the grpc-go backend inflates.
func TestRawBackendAgainstGRPC(t *testing.T) {
	for _, deflate := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "deflated"}[deflate], func(t *testing.T) { testRawBackendAgainstGRPC(t, deflate) })
	}
}

func testRawBackendAgainstGRPC(t *testing.T, deflate bool) {
	const services, endpoints, nodes = 8000, 10, 7
	ns := "scale"
	state := make([]*model.ServiceEndpoints, services)
	for i := range state {
		ip := netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}).String()
		se := &model.ServiceEndpoints{Service: &model.Service{Namespace: ns, Name: svcName(i), Type: "ClusterIP",
			IPs:   model.ServiceIPs{ClusterIPs: model.IPSet{V4: []string{ip}}},
			Ports: []*model.PortMapping{{Name: "http", Protocol: model.TCP, Port: 80, TargetPort: 8080}}}}
		for e := range endpoints {
			se.Endpoints = append(se.Endpoints, &model.Endpoint{IPs: model.IPSet{V4: []string{endpointIP(i, e)}},
				NodeName: nodeName((i*endpoints + e) % nodes), Ready: true, Serving: true})
		}
		slices.SortFunc(se.Endpoints, model.CompareEndpoints)
		state[i] = se
	}
	hub := server.NewHub(true)
	localsink.FromFullState(hub)(state)

	socket := filepath.Join(t.TempDir(), "kpng.sock")
	lis, opts, err := server.ListenConfig{Address: "unix://" + socket}.Listen()
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(opts...)
	server.NewServer(hub, 0).Register(g)
	go func() { _ = g.Serve(lis) }()
	defer g.Stop()
	target, dopts, err := remote.Config{Address: "unix://" + socket}.DialOptions()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(target, dopts...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	changed := 4321
	ch := &change{service: svcName(changed), key: endpointIP(changed, 3), done: make(chan struct{}), at: make([]int64, 2)}
	all := []*change{ch}
	index := map[string]int{ch.service + "/" + ch.key: 0}
	mk := func(id int, light, raw bool) *backend {
		b := &backend{id: id, name: nodeName(id), namespace: ns, changes: index, all: all, total: 2,
			firstState: make(chan struct{}), independent: true, light: light, raw: raw, deflate: deflate}
		return b
	}
	full, raw := mk(0, false, false), mk(1, true, true)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { full.watch(ctx, conn) })
	wg.Go(func() { raw.watchRaw(ctx, "unix", socket) })
	for _, b := range []*backend{full, raw} {
		select {
		case <-b.firstState:
		case <-time.After(time.Minute):
			t.Fatalf("backend %s: no first state after a minute (%d bytes received)", b.name, b.bytes.Load())
		}
		if !b.synced {
			t.Fatalf("backend %s: no first state: %v", b.name, b.err)
		}
	}
	if full.services != services || full.endpoints != services*endpoints {
		t.Errorf("the grpc-go backend holds %d services and %d endpoints, want %d and %d", full.services, full.endpoints, services, services*endpoints)
	}
	got := raw.bytes.Load()
	if got != full.bytes.Load() {
		t.Errorf("the raw backend received %d bytes, the grpc-go one %d; want the same", got, full.bytes.Load())
	}
	if min := int64(5 << 20); !deflate && got < min {
		t.Errorf("the backends received %d bytes, want over %d (more than the 4 MiB window)", got, min)
	}
	if inflated := full.bytes.Load() + int64(full.inflateGain); deflate && got*4 > inflated {
		t.Errorf("the first state took %d bytes, %d once inflated: want under a quarter", got, inflated)
	}
	if raw.stateHash != full.stateHash {
		t.Error("the raw backend's first state hashes differently from the grpc-go backend's")
	}

	// A change reaches both.
	se := state[changed]
	next := &model.ServiceEndpoints{Service: se.Service, Endpoints: slices.Clone(se.Endpoints)}
	for i, ep := range next.Endpoints {
		if ep.IPs.V4[0] == ch.key {
			cp := *ep
			cp.Ready = false
			next.Endpoints[i] = &cp
		}
	}
	hub.Update(se.Service.Key(), se, next)
	if err := hub.Sync(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch.done:
	case <-time.After(time.Minute):
		t.Fatalf("the change reached %d of 2 backends after a minute (raw backend: %v)", ch.arrived.Load(), raw.err)
	}
	if raw.unexpected != 0 || full.unexpected != 0 {
		t.Errorf("unexpected set_endpoint ops: raw %d, grpc-go %d", raw.unexpected, full.unexpected)
	}
}
