package app

import (
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestProfilingBindAddress: kpng --profiling-bind-address serves Go's
// profiles there (the goroutine profile shows the controller's serving
// goroutine); without the flag nothing is served.
func TestProfilingBindAddress(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state.json")
	if err := os.WriteFile(state, []byte("[]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	startKpng(t, nil, "--profiling-bind-address="+addr, "file", "--input="+state, "to-api", "--listen=unix://"+filepath.Join(dir, "kpng.sock"))
	var body string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		resp, err := http.Get("http://" + addr + "/debug/pprof/goroutine?debug=1")
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if body = string(b); resp.StatusCode == http.StatusOK && strings.Contains(body, "grpc.(*Server).Serve") {
			break
		}
	}
	if !strings.Contains(body, "goroutine profile:") || !strings.Contains(body, "grpc.(*Server).Serve") {
		t.Fatalf("/debug/pprof/goroutine?debug=1 on --profiling-bind-address=%s: want the goroutine profile with the gRPC server, got:\n%.2000s", addr, body)
	}
}
