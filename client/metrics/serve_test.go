package metrics

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/kpng/internal/testio"
)

// TestServeDropsStalledAndIdleClients serves on a real loopback port with
// short timeouts: a client that asks for an endless answer and stops
// reading it is dropped (the handler's write fails and it returns), and a
// keep-alive connection left idle after its answer is closed by the
// server. Without the write and idle timeouts both connections are held
// for ever.
func TestServeDropsStalledAndIdleClients(t *testing.T) {
	saved := serveTimeouts
	serveTimeouts = timeouts{readHeader: time.Second, read: time.Second, write: 200 * time.Millisecond, idle: 200 * time.Millisecond}
	t.Cleanup(func() { serveTimeouts = saved })

	writerDone := make(chan error, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("/endless", func(w http.ResponseWriter, _ *http.Request) {
		chunk := []byte(strings.Repeat("x", 64<<10))
		for {
			if _, err := w.Write(chunk); err != nil {
				writerDone <- err
				return
			}
		}
	})
	mux.HandleFunc("/small", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	addr := testio.FreeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop, err := Serve(ctx, addr, mux)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	// A client that asks and never reads.
	stalled, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	if _, err := io.WriteString(stalled, "GET /endless HTTP/1.1\r\nHost: kpng\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-writerDone:
		t.Logf("the answer to the stalled client ended: %v", err)
	case <-time.After(20 * time.Second):
		t.Error("the server still writes to a client that stopped reading (no write timeout)")
	}

	// A keep-alive connection left idle after one answer.
	idle, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	if _, err := io.WriteString(idle, "GET /small HTTP/1.1\r\nHost: kpng\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(idle)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if body, err := io.ReadAll(resp.Body); err != nil || string(body) != "ok" || resp.Close {
		t.Fatalf("GET /small: %q, %v, close %v; want ok on a kept-alive connection", body, err, resp.Close)
	}
	if err := idle.SetReadDeadline(time.Now().Add(20 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Errorf("reading the idle connection: %v, want EOF (the server closes it; no idle timeout)", err)
	}
}
