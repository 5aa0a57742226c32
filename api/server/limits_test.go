package server_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/api/kpngv1"
	"sigs.k8s.io/kpng/api/server"
	"sigs.k8s.io/kpng/client/remote"
	"sigs.k8s.io/kpng/internal/testio"
	"sigs.k8s.io/kpng/model"
)

// bigLabels returns labels of about n bytes.
func bigLabels(n int) map[string]string {
	l := map[string]string{}
	for i := 0; i*1000 < n; i++ {
		l[fmt.Sprintf("label-%04d", i)] = strings.Repeat("v", 1000)
	}
	return l
}

// TestBatchesStayUnderTheMessageLimit serves 600 services with 40 KiB of
// labels each: the first 1,000 operations (a batch by count: 500 services
// with their endpoint) would be some 20 MiB, more than the 16 MiB a
// message may carry. The backend must receive it all, in more messages,
// each within the limit.
func TestBatchesStayUnderTheMessageLimit(t *testing.T) {
	s := startServer(t, server.ListenConfig{Address: socketAddr(t)}, 0)
	var state []*model.ServiceEndpoints
	for i := range 600 {
		se := svc("ns", fmt.Sprintf("s%04d", i), ep(fmt.Sprintf("10.1.%d.%d", i/250, 1+i%250), "node-a"))
		se.Service.Labels = bigLabels(40 << 10)
		state = append(state, se)
	}
	s.feed(state)
	r := runClient(t, remote.Config{Address: s.addr, NodeName: "node-a"})
	r.WaitSyncs(t, 1, 30*time.Second)
	if got := r.State(); len(got) != len(state) {
		t.Errorf("the backend holds %d services, want %d", len(got), len(state))
	}
}

// TestOversizeServiceIsReported serves a state where one service alone is
// larger than a message may carry: the controller says which one and how
// large, in an error log, and serves the rest.
func TestOversizeServiceIsReported(t *testing.T) {
	for _, perNode := range []bool{false, true} {
		t.Run(map[bool]string{false: "node-independent", true: "per-node"}[perNode], func(t *testing.T) { oversizeService(t, perNode) })
	}
}

func oversizeService(t *testing.T, perNode bool) {
	var logs testio.SyncBuffer
	klog.LogToStderr(false)
	klog.SetOutput(&logs)
	defer func() { klog.SetOutput(os.Stderr); klog.LogToStderr(true) }()

	s := startServer(t, server.ListenConfig{Address: socketAddr(t)}, 0)
	huge := svc("ns", "huge", ep("10.1.0.1", "node-a"))
	huge.Service.Labels = bigLabels(17 << 20)
	state := []*model.ServiceEndpoints{svc("ns", "a", ep("10.1.0.2", "node-a")), huge, svc("ns", "z", ep("10.1.0.3", "node-a"))}
	s.feed(state)
	r := runClient(t, remote.Config{Address: s.addr, NodeName: "node-a", PerNodeView: perNode})
	r.WaitSyncs(t, 1, 30*time.Second)
	var names []string
	for _, se := range r.State() {
		names = append(names, se.Service.Name)
	}
	if strings.Join(names, ",") != "a,z" {
		t.Errorf("the backend holds %v, want the services a and z", names)
	}
	klog.Flush()
	if !strings.Contains(logs.String(), "ns/huge") || !strings.Contains(logs.String(), "larger than") {
		t.Errorf("no error log naming the service too large:\n%.2000s", logs.String())
	}
	// A service the backend has grows too large: the backend loses it,
	// and gets it back once it is small again.
	grown := svc("ns", "a", ep("10.1.0.2", "node-a"))
	grown.Service.Labels = huge.Service.Labels
	s.feed([]*model.ServiceEndpoints{grown, huge, state[2]})
	r.WaitSyncs(t, 2, 30*time.Second)
	if calls := r.TakeCalls(); !slices.Contains(calls, "Update ns/a deleted") {
		t.Errorf("calls after service a grew too large: %q, want it deleted", calls)
	}
	s.feed(state)
	r.WaitSyncs(t, 3, 30*time.Second)
	// Back whole: with its endpoints, which did not change while it was
	// too large (the backend was told it was gone).
	if calls := r.TakeCalls(); len(calls) != 2 || calls[0] != "Update ns/a service +10.1.0.2" {
		t.Errorf("calls after service a is small again: %q, want it back with its endpoint", calls)
	}
}

// TestRequestPastTheSizeLimit sends a watch request larger than the 64
// KiB the controller accepts: the stream fails with ResourceExhausted,
// saying so, and the controller keeps serving others.
func TestRequestPastTheSizeLimit(t *testing.T) {
	s := startServer(t, server.ListenConfig{Address: socketAddr(t)}, 0)
	s.feed([]*model.ServiceEndpoints{svc("ns", "a", ep("10.1.0.2", "node-a"))})
	conn := dial(t, remote.Config{Address: s.addr})
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := kpngv1.NewControllerClient(conn).Watch(ctx, &kpngv1.WatchRequest{NodeName: strings.Repeat("n", 100<<10)})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "larger than max") {
		t.Errorf("a 100 KiB request: %v, want ResourceExhausted saying it is larger than the limit", err)
	}
	good := runClient(t, remote.Config{Address: s.addr, NodeName: "node-a"})
	good.WaitSyncs(t, 1, 20*time.Second)
}

// TestNodeNameIsLoggedBoundedOnOneLine: a client's node name holding
// newlines and what looks like a log record is logged by the controller
// (when the backend connects and disconnects) on one line, escaped. A
// name over server.MaxNodeName bytes is refused, logged cut
// (TestNodeNameLengthIsBounded).
func TestNodeNameIsLoggedBoundedOnOneLine(t *testing.T) {
	var logs testio.SyncBuffer
	klog.LogToStderr(false)
	klog.SetOutput(&logs)
	defer func() { klog.SetOutput(os.Stderr); klog.LogToStderr(true) }()

	s := startServer(t, server.ListenConfig{Address: socketAddr(t)}, 0)
	s.feed([]*model.ServiceEndpoints{svc("ns", "a", ep("10.1.0.2", "node-a"))})
	node := "node-a\nE1127 00:00:00.000000       1 forged.go:1] \"Forged record\"\n" + strings.Repeat("x", 150)
	conn := dial(t, remote.Config{Address: s.addr})
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := kpngv1.NewControllerClient(conn).Watch(ctx, &kpngv1.WatchRequest{NodeName: node})
	if err == nil {
		_, err = stream.Recv()
	}
	if err != nil {
		t.Fatalf("watch as a node of %d bytes: %v", len(node), err)
	}
	cancel()
	for deadline := time.Now().Add(20 * time.Second); !strings.Contains(logs.String(), "Backend disconnected"); {
		if time.Now().After(deadline) {
			t.Fatalf("the controller logged no disconnection:\n%.3000s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	klog.Flush()
	var records int
	for _, line := range strings.Split(strings.TrimSuffix(logs.String(), "\n"), "\n") {
		if len(line) > 1000 {
			t.Errorf("a log line of %d bytes: %.300s…", len(line), line)
		}
		if strings.Contains(line, "Forged record") && !strings.Contains(line, "Backend ") {
			t.Errorf("the node name made a log line of its own: %q", line)
		}
		if strings.Contains(line, "Backend connected") || strings.Contains(line, "Backend disconnected") {
			records++
			if !strings.Contains(line, `node-a\\nE1127`) {
				t.Errorf("the node name is not logged escaped: %.600s", line)
			}
		}
	}
	if records != 2 {
		t.Errorf("%d log records of the backend connecting and disconnecting, want 2:\n%.3000s", records, logs.String())
	}
}

// rawCodec sends and receives bytes as they are: a client sending
// whatever it likes in a gRPC message.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error)      { return v.([]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error { *v.(*[]byte) = data; return nil }
func (rawCodec) Name() string                       { return "proto" }

// TestGarbageAndUncertifiedClients serves over TCP with client
// certificates required while clients misbehave: 50 connections sending
// random bytes, 50 sending a TLS client hello and then garbage, a gRPC
// watch whose request is not a WatchRequest (InvalidArgument or Internal,
// saying it cannot be decoded), and a client without a certificate (its
// stream fails saying a certificate is required). The controller's heap
// does not grow with them, and a good backend keeps getting changes.
func TestGarbageAndUncertifiedClients(t *testing.T) {
	certs := writeCerts(t)
	// No per-client limit: the 100 connections from loopback must reach
	// the garbage and handshake paths, not be closed on accept
	// (TestConnectionsPerClientAndInAllAreLimited checks that limit).
	s := startServer(t, server.ListenConfig{Address: "127.0.0.1:0", TLSCert: certs.serverCert, TLSKey: certs.serverKey, TLSClientCA: certs.ca,
		Limits: server.Limits{MaxConnectionsPerClient: -1}}, 0)
	s.feed([]*model.ServiceEndpoints{svc("ns", "a", ep("10.1.0.1", "node-a"))})
	good := runClient(t, remote.Config{Address: s.addr, NodeName: "node-a", TLSCA: certs.ca, TLSCert: certs.clientCert, TLSKey: certs.clientKey})
	good.WaitSyncs(t, 1, 20*time.Second)

	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	garbage := make([]byte, 64<<10)
	for i := range garbage {
		garbage[i] = byte(i*7 + i>>8)
	}
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.DialTimeout("tcp", s.addr, 5*time.Second)
			if err != nil {
				t.Errorf("dial: %v", err)
				return
			}
			defer c.Close()
			if i%2 == 1 {
				// A TLS client hello, then garbage.
				c.Write([]byte{0x16, 0x03, 0x01, 0x00, 0x05, 0x01, 0x00, 0x00, 0x01, 0x00})
			}
			c.SetDeadline(time.Now().Add(5 * time.Second))
			c.Write(garbage)
			io.Copy(io.Discard, c) // until the server closes it
		}()
	}
	wg.Wait()

	// A gRPC watch whose request is no WatchRequest.
	tlsOpts := func(cert bool) []grpc.DialOption {
		cfg := remote.Config{Address: s.addr, TLSCA: certs.ca}
		if cert {
			cfg.TLSCert, cfg.TLSKey = certs.clientCert, certs.clientKey
		}
		_, opts, err := cfg.DialOptions()
		if err != nil {
			t.Fatal(err)
		}
		return opts
	}
	conn, err := grpc.NewClient("passthrough:///"+s.addr, tlsOpts(true)...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := conn.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, kpngv1.Controller_Watch_FullMethodName, grpc.ForceCodec(rawCodec{}))
	if err == nil {
		err = stream.SendMsg([]byte{0xff, 0xff, 0xff, 0xff, 0x0f, 0x01})
	}
	if err == nil {
		err = stream.CloseSend()
	}
	if err == nil {
		var out []byte
		err = stream.RecvMsg(&out)
	}
	if c := status.Code(err); (c != codes.Internal && c != codes.InvalidArgument) || !strings.Contains(err.Error(), "unmarshal") {
		t.Errorf("a request that is no WatchRequest: %v, want an error saying it cannot be decoded", err)
	}

	// No client certificate: with TLS 1.3 the client learns it from the
	// server's alert after its own side of the handshake, and the server
	// keeps reading until the client has read it (without that, the
	// client's first write made the connection reset: "broken pipe").
	for i := range 3 {
		noCert, err := grpc.NewClient("passthrough:///"+s.addr, tlsOpts(false)...)
		if err != nil {
			t.Fatal(err)
		}
		w, err := kpngv1.NewControllerClient(noCert).Watch(ctx, &kpngv1.WatchRequest{NodeName: "node-a"})
		if err == nil {
			_, err = w.Recv()
		}
		noCert.Close()
		if err == nil || !strings.Contains(err.Error(), "certificate required") {
			t.Errorf("a client without a certificate, try %d: %v, want an error saying a certificate is required", i+1, err)
		}
	}

	after := heap()
	t.Logf("heap %d KiB before the bad clients, %d KiB after", before>>10, after>>10)
	if after > before+4<<20 {
		t.Errorf("the heap grew from %d KiB to %d KiB with the bad clients", before>>10, after>>10)
	}
	s.feed([]*model.ServiceEndpoints{svc("ns", "a", ep("10.1.0.1", "node-a"), ep("10.1.0.2", "node-b"))})
	good.WaitSyncs(t, 2, 20*time.Second)
	if calls := good.TakeCalls(); !slices.Contains(calls, "Update ns/a +10.1.0.2") {
		t.Errorf("the good backend after the bad clients: %q, want the change", calls)
	}
}
