package deploy_test

import (
	"bytes"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"sigs.k8s.io/kpng/internal/netns"
)

// programmed says whether a backend's rules are in a namespace, given its
// variant's flags.
var programmed = map[string]func(ns *netns.NS, variant []string) bool{
	"to-nft": func(ns *netns.NS, _ []string) bool {
		out, _, err := ns.Exec(nil, "nft", "list", "tables")
		return err == nil && strings.Contains(out, "table inet kpng")
	},
	"to-iptables": func(ns *netns.NS, variant []string) bool {
		v := "nft"
		if slices.Contains(variant, "--iptables=legacy") {
			v = "legacy"
		}
		out, _, err := ns.Exec(nil, "iptables-"+v+"-save", "-t", "nat")
		return err == nil && strings.Contains(out, ":KPNG-")
	},
}

// TestCapabilities runs the backend of each DaemonSet, as the image's kpng
// with the blog's state from a file, in a fresh network namespace, as root
// with exactly the capabilities the DaemonSet adds (what a container that
// drops ALL and adds them holds): the rules are programmed. Without any one
// of them, they are not.
func TestCapabilities(t *testing.T) {
	netns.RequirePrivileged(t)
	netns.RequireCommands(t, "setpriv", "nft", "iptables-legacy-save", "iptables-nft-save")
	kpng := filepath.Join(buildImage(t).out, "kpng")
	state, err := filepath.Abs(filepath.Join(root, "examples", "json", "testdata", "kpng-example.golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range daemonSets {
		p := decode(t, d.file)
		c := p.container(t)
		cmd := parseCommand(t, c, nil)
		backend := cmd.args[slices.Index(cmd.args, "to-local"):]
		caps := c.SecurityContext.Capabilities.Add
		check := programmed[d.backend]
		if check == nil {
			t.Fatalf("%s: no check of backend %s", d.file, d.backend)
		}
		for _, variant := range d.variants {
			t.Run(fmt.Sprintf("%s%v/%v", d.backend, variant, caps), func(t *testing.T) {
				if ok, out := runWithCaps(t, kpng, state, append(slices.Clone(backend), variant...), caps, check, variant); !ok {
					t.Errorf("with %v, the rules were not programmed:\n%s", caps, out)
				}
			})
		}
		for _, drop := range caps {
			fewer := slices.DeleteFunc(slices.Clone(caps), func(c v1.Capability) bool { return c == drop })
			variant := d.variants[0]
			t.Run(fmt.Sprintf("%s%v/without-%s", d.backend, variant, drop), func(t *testing.T) {
				if ok, out := runWithCaps(t, kpng, state, append(slices.Clone(backend), variant...), fewer, check, variant); ok {
					t.Errorf("without %s, the rules were programmed: the capability is not needed\n%s", drop, out)
				}
			})
		}
	}
}

// runWithCaps runs `kpng file --input=state <backend…>` in a fresh network
// namespace as root with only caps (setpriv's bounding set), until its
// rules are programmed (true) or it fails: it exits, or reports a round it
// could not apply (false). It returns kpng's output too.
func runWithCaps(t *testing.T, kpng, state string, backend []string, caps []v1.Capability, check func(*netns.NS, []string) bool, variant []string) (bool, string) {
	t.Helper()
	ns := netns.New(t, "caps")
	bounding := "-all"
	for _, c := range caps {
		bounding += ",+" + strings.ToLower(string(c))
	}
	args := append([]string{"netns", "exec", ns.Name, "setpriv", "--bounding-set", bounding, "--inh-caps", "-all", "--",
		kpng, "file", "--input=" + state}, backend...)
	cmd := exec.Command("ip", args...)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() {
		_ = cmd.Process.Kill() // ip netns exec and setpriv exec kpng: this is kpng
		<-exited
	}
	deadline := time.After(30 * time.Second)
	for {
		if check(ns, variant) {
			stop()
			return true, out.String()
		}
		if strings.Contains(out.String(), "could not apply a round") {
			stop()
			return false, out.String()
		}
		select {
		case err := <-exited:
			if check(ns, variant) {
				return true, out.String()
			}
			return false, fmt.Sprintf("%s\n(exit: %v)", out.String(), err)
		case <-deadline:
			stop()
			t.Fatalf("after 30s, neither programmed nor failed:\n%s", out.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// syncBuffer is a bytes.Buffer that the process writes while the test
// reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
