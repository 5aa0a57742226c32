package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"sigs.k8s.io/kpng/api/kpngv1"
	"sigs.k8s.io/kpng/api/server"
	"sigs.k8s.io/kpng/client/remote"
)

// recvPeers returns the next list of a Peers stream, failing the test
// after 10 s.
func recvPeers(t *testing.T, stream grpc.ServerStreamingClient[kpngv1.PeerAddresses]) []string {
	t.Helper()
	got := make(chan *kpngv1.PeerAddresses, 1)
	errc := make(chan error, 1)
	go func() {
		m, err := stream.Recv()
		if err != nil {
			errc <- err
			return
		}
		got <- m
	}()
	select {
	case m := <-got:
		return m.GetIps()
	case err := <-errc:
		t.Fatalf("Peers stream: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no list of peers within 10 s")
	}
	return nil
}

// TestPeersStream: a Peers stream sends nothing until the replicas are
// known, then the list (sorted, without duplicates, IPv4-mapped addresses
// as IPv4), then each change and only changes; a bad address is refused
// and changes nothing; Stop ends the stream with Unavailable.
func TestPeersStream(t *testing.T) {
	peers := server.NewPeers()
	s := startServerWith(t, server.ListenConfig{Address: socketAddr(t)}, server.Options{Peers: peers})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := kpngv1.NewControllerClient(dialUnix(t, s.addr)).Peers(ctx, &kpngv1.PeersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// Nothing before Set: the first message must be the first list.
	time.Sleep(100 * time.Millisecond)
	if err := peers.Set([]string{"10.0.0.2", "::ffff:10.0.0.1", "10.0.0.2", "fd00::1"}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"10.0.0.1", "10.0.0.2", "fd00::1"}, recvPeers(t, stream)); diff != "" {
		t.Errorf("first list (-want +got):\n%s", diff)
	}
	if err := peers.Set([]string{"10.0.0.1", "not-an-ip"}); err == nil {
		t.Error("Set took an address that is not an IP address")
	}
	var many []string
	for i := range kpngv1.MaxPeers + 1 {
		many = append(many, fmt.Sprintf("10.1.%d.%d", i/256, i%256))
	}
	if err := peers.Set(many); err == nil {
		t.Errorf("Set took %d addresses, more than MaxPeers", len(many))
	}
	// The same list again is not sent: the next message is the change.
	if err := peers.Set([]string{"fd00::1", "10.0.0.2", "10.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	if err := peers.Set([]string{"10.0.0.3"}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"10.0.0.3"}, recvPeers(t, stream)); diff != "" {
		t.Errorf("after the change (-want +got):\n%s", diff)
	}
	// A new stream gets the current list at once.
	second, err := kpngv1.NewControllerClient(dialUnix(t, s.addr)).Peers(ctx, &kpngv1.PeersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"10.0.0.3"}, recvPeers(t, second)); diff != "" {
		t.Errorf("a new stream's first list (-want +got):\n%s", diff)
	}
	s.srv.Stop()
	if _, err := stream.Recv(); status.Code(err) != codes.Unavailable {
		t.Errorf("after Stop: %v, want Unavailable", err)
	}
}

// TestPeersWithoutService: a controller not given its replicas answers
// FailedPrecondition naming the flag; with client certificates, one
// without a node identity is refused as by Watch (and counted), unless its
// common name may watch any node's view; a stopping controller answers
// Unavailable.
func TestPeersWithoutService(t *testing.T) {
	s := startServerWith(t, server.ListenConfig{Address: socketAddr(t)}, server.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := kpngv1.NewControllerClient(dialUnix(t, s.addr)).Peers(ctx, &kpngv1.PeersRequest{})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.FailedPrecondition || !cmp.Equal(status.Convert(err).Message(), "this controller was not given its replicas' Service (to-api --peers-service)") {
		t.Errorf("Peers without --peers-service: %v, want FailedPrecondition naming the flag", err)
	}

	certs := writeCerts(t)
	peers := server.NewPeers()
	if err := peers.Set([]string{"10.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	ts := tlsServer(t, certs, server.Options{Peers: peers, AnyNodeCommonNames: []string{"kpng-any"}})
	readerCert, readerKey := certs.client("kpng-reader")
	anyCert, anyKey := certs.client("kpng-any")
	for _, c := range []struct {
		name       string
		cert, key  string
		want       codes.Code
		wantListed bool
	}{
		{"node-a", certs.clientCert, certs.clientKey, codes.OK, true},
		{"no node identity", readerCert, readerKey, codes.PermissionDenied, false},
		{"any node's view", anyCert, anyKey, codes.OK, true},
	} {
		conn := dial(t, remote.Config{Address: ts.addr, TLSCA: certs.ca, TLSCert: c.cert, TLSKey: c.key})
		stream, err := kpngv1.NewControllerClient(conn).Peers(ctx, &kpngv1.PeersRequest{})
		var m *kpngv1.PeerAddresses
		if err == nil {
			m, err = stream.Recv()
		}
		if status.Code(err) != c.want || (m != nil) != c.wantListed {
			t.Errorf("%s: %v, %v; want %v", c.name, m, err, c.want)
		}
		if c.want == codes.PermissionDenied && !strings.Contains(status.Convert(err).Message(), `client certificate "kpng-reader" has no node identity`) {
			t.Errorf("%s: refused with %q, want the certificate named", c.name, status.Convert(err).Message())
		}
		conn.Close()
	}
	if n := ts.srv.Stats().Refused; n != 1 {
		t.Errorf("%d refusals counted, want 1", n)
	}
	ts.srv.Stop()
	conn := dial(t, remote.Config{Address: ts.addr, TLSCA: certs.ca, TLSCert: certs.clientCert, TLSKey: certs.clientKey})
	defer conn.Close()
	stream, err = kpngv1.NewControllerClient(conn).Peers(ctx, &kpngv1.PeersRequest{})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.Unavailable {
		t.Errorf("Peers on a stopping controller: %v, want Unavailable", err)
	}
}
