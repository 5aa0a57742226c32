package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/kpng/internal/controlplane"
)

// TestExitsCleanlyOnSignal runs kpng-json until it has printed its first
// state, sends SIGTERM (then, in a second run, SIGINT) and expects exit
// status 0 promptly.
func TestExitsCleanlyOnSignal(t *testing.T) {
	cp.Require(t)
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "kpng-json")
	run(t, root, nil, "go", "build", "-o", bin, "./examples/json")
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			// No service carries this name: the first state is empty, and
			// kpng-json prints nothing; wait for its "synced" log line.
			cmd := exec.Command(bin, "--kubeconfig="+cp.KubeconfigPath(), "--service-proxy-name=nobody", "--node-name=n")
			stderr, err := cmd.StderrPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			synced := make(chan struct{})
			go func() {
				sc := bufio.NewScanner(stderr)
				closed := false
				for sc.Scan() {
					if !closed && strings.Contains(sc.Text(), "Informers synced") {
						close(synced)
						closed = true
					}
				}
			}()
			select {
			case <-synced:
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				t.Fatal("kpng-json did not sync within 30s")
			}
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("kpng-json after %v: %v, want exit status 0", sig, err)
				}
			case <-time.After(15 * time.Second):
				_ = cmd.Process.Signal(os.Kill)
				t.Errorf("kpng-json did not exit within 15s of %v", sig)
			}
		})
	}
}
