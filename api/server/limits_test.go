package server_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/api/kpngv1"
	"sigs.k8s.io/kpng/api/server"
	"sigs.k8s.io/kpng/client/model"
	"sigs.k8s.io/kpng/client/remote"
	"sigs.k8s.io/kpng/internal/testio"
)

// bigLabels returns labels of about n bytes.
func bigLabels(n int) map[string]string {
	l := map[string]string{}
	for i := 0; i*1000 < n; i++ {
		l[fmt.Sprintf("label-%04d", i)] = strings.Repeat("v", 1000)
	}
	return l
}

// TestBatchesStayUnderTheMessageLimit serves a state whose first 1,000
// operations (a batch by count: 500 services with their endpoint) would be some 20 MiB, more than the 16
// MiB a message may carry: the backend must receive it all, in more
// messages, each within the limit.
func TestBatchesStayUnderTheMessageLimit(t *testing.T) {
	s := startServer(t, server.ListenConfig{Address: socketAddr(t)}, 0)
	var state []*model.ServiceEndpoints
	for i := range 1100 {
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
	var logs testio.SyncBuffer
	klog.LogToStderr(false)
	klog.SetOutput(&logs)
	defer func() { klog.SetOutput(os.Stderr); klog.LogToStderr(true) }()

	s := startServer(t, server.ListenConfig{Address: socketAddr(t)}, 0)
	huge := svc("ns", "huge", ep("10.1.0.1", "node-a"))
	huge.Service.Labels = bigLabels(17 << 20)
	state := []*model.ServiceEndpoints{svc("ns", "a", ep("10.1.0.2", "node-a")), huge, svc("ns", "z", ep("10.1.0.3", "node-a"))}
	s.feed(state)
	r := runClient(t, remote.Config{Address: s.addr, NodeName: "node-a"})
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
	if calls := r.TakeCalls(); len(calls) != 2 || !strings.HasPrefix(calls[0], "Update ns/a service") {
		t.Errorf("calls after service a is small again: %q, want it back", calls)
	}
}

// TestRequestPastTheSizeLimit sends a watch request larger than the 64
// KiB the controller accepts: the stream fails with ResourceExhausted,
// saying so, and the controller keeps serving others.
func TestRequestPastTheSizeLimit(t *testing.T) {
	s := startServer(t, server.ListenConfig{Address: socketAddr(t)}, 0)
	s.feed([]*model.ServiceEndpoints{svc("ns", "a", ep("10.1.0.2", "node-a"))})
	target, opts, err := remote.Config{Address: s.addr}.DialOptions()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		t.Fatal(err)
	}
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
