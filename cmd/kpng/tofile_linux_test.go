//go:build linux

package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"sigs.k8s.io/kpng/internal/e2e"
	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/localsink/statefile"
	"sigs.k8s.io/kpng/model"
)

// TestToFileOnAFullDisk runs `kpng file … to-file` writing into a 256 KiB
// tmpfs of its own (mounted in a private mount namespace: the test reaches
// it through /proc/<pid>/root). The disk is filled, then the input
// changes: the write fails, and the output keeps the last state whole, with
// no temporary file left behind; once space is freed the output catches up
// without another change (kpng retries the write). A state larger than the
// whole disk fails the same way, and the next state that fits is written.
func TestToFileOnAFullDisk(t *testing.T) {
	netns.RequirePrivileged(t)
	netns.RequireCommands(t, "unshare", "mount")
	bin := e2e.Build(t, "cmd/kpng")
	dir := t.TempDir()
	in := filepath.Join(dir, "in.yaml")
	disk := filepath.Join(dir, "disk") // the mount point, empty outside
	if err := os.Mkdir(disk, 0o755); err != nil {
		t.Fatal(err)
	}
	writeState := func(items []*model.ServiceEndpoints) {
		t.Helper()
		if err := statefile.Write(in, items); err != nil {
			t.Fatal(err)
		}
	}
	first, second := fileState(2, 2), fileState(3, 2)
	writeState(first)
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
		`mount -t tmpfs -o size=256k kpng-full-disk "$0" && exec "$@"`, disk,
		bin, "-v=2", "file", "--input="+in, "--interval=100ms", "to-file", "--output="+filepath.Join(disk, "state.yaml"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p := e2e.StartCmd(t, cmd)
	root := fmt.Sprintf("/proc/%d/root", cmd.Process.Pid) // after exec: kpng's mount namespace
	out := root + filepath.Join(disk, "state.yaml")
	waitOutput(t, out, first, "the first state")

	// The disk fills up; the state changes.
	filler, err := os.Create(root + filepath.Join(disk, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 4096)
	for {
		if _, err := filler.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling the disk: %v", err)
			}
			break
		}
	}
	filler.Close()
	writeState(second)
	for range 10 {
		time.Sleep(100 * time.Millisecond)
		checkOutput(t, out, first, "with the disk full")
	}
	if names := dirNames(t, root+disk); !cmp.Equal(names, []string{"filler", "state.yaml"}) {
		t.Errorf("the disk holds %v, want the filler and the state file only", names)
	}
	if !strings.Contains(p.Output.String(), "no space left on device") {
		t.Errorf("kpng's log does not say the disk is full:\n%s", p.Output.String())
	}
	// Space comes back: the write is retried, with no new change.
	if err := os.Remove(root + filepath.Join(disk, "filler")); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, out, second, "the state after the disk was freed")

	// A state larger than the disk, then one that fits.
	huge, third := fileState(400, 8), fileState(1, 1)
	writeState(huge)
	for range 5 {
		time.Sleep(100 * time.Millisecond)
		checkOutput(t, out, second, "with a state larger than the disk")
	}
	writeState(third)
	waitOutput(t, out, third, "the state after the one too large")
	if names := dirNames(t, root+disk); !cmp.Equal(names, []string{"state.yaml"}) {
		t.Errorf("the disk holds %v, want the state file only", names)
	}
	p.Stop(t)
}

// fileState returns n services of eps endpoints each.
func fileState(n, eps int) []*model.ServiceEndpoints {
	var items []*model.ServiceEndpoints
	for i := range n {
		se := &model.ServiceEndpoints{Service: &model.Service{
			Namespace: "ns", Name: fmt.Sprintf("svc-%04d-with-a-rather-long-name-to-fill-the-disk", i), Type: "ClusterIP",
			IPs:   model.ServiceIPs{ClusterIPs: model.IPSet{V4: []string{fmt.Sprintf("10.96.%d.%d", i/250, 1+i%250)}}},
			Ports: []*model.PortMapping{{Name: "http", Protocol: model.TCP, Port: 80, TargetPort: 8080}},
		}}
		for j := range eps {
			se.Endpoints = append(se.Endpoints, &model.Endpoint{
				IPs: model.IPSet{V4: []string{fmt.Sprintf("10.1.%d.%d", i%250, 1+j)}}, Ready: true, Serving: true,
				NodeName: fmt.Sprintf("node-%04d-with-a-rather-long-name", j),
			})
		}
		items = append(items, se)
	}
	return items
}

// readOutput reads and parses the state file at path.
func readOutput(path string) ([]*model.ServiceEndpoints, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return statefile.Parse(b)
}

// checkOutput fails the test unless the state file at path is whole and
// holds want.
func checkOutput(t *testing.T, path string, want []*model.ServiceEndpoints, when string) {
	t.Helper()
	got, err := readOutput(path)
	if err != nil {
		t.Fatalf("%s: the state file: %v", when, err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("%s: the state file (-want +got):\n%s", when, diff)
	}
}

// waitOutput waits until the state file at path holds want.
func waitOutput(t *testing.T, path string, want []*model.ServiceEndpoints, what string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := readOutput(path)
		if err == nil && cmp.Equal(want, got) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never reached the state file (last: %d services, %v)", what, len(got), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// dirNames returns the names in dir, sorted.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}
