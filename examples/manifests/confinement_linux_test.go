package manifests_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"sigs.k8s.io/kpng/internal/netns"
)

// largeState is a state of n services as kpng-callout hands it to the
// callout (kpng-json's output: one JSON object per line), each with one
// external IP and one local endpoint.
func largeState(t *testing.T, n int) []byte {
	t.Helper()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	for i := range n {
		ip := func(first int) string { return fmt.Sprintf("%d.0.%d.%d", first, i/250, i%250+1) }
		item := map[string]any{
			"Service": map[string]any{"Namespace": "default", "Name": fmt.Sprintf("s%d", i), "Type": "ClusterIP",
				"IPs":   map[string]any{"ClusterIPs": map[string]any{}, "ExternalIPs": map[string]any{"V4": []string{ip(10)}}},
				"Ports": []map[string]any{{"Protocol": 1, "Port": 80, "TargetPort": 80}}},
			"Endpoints": []map[string]any{{"IPs": map[string]any{"V4": []string{ip(11)}}, "Local": true, "Ready": true}},
		}
		if err := enc.Encode(item); err != nil {
			t.Fatal(err)
		}
	}
	return b.Bytes()
}

// TestExampleCalloutConfinement runs the example's callout, the all-IP
// script, as its container does: in a fresh network namespace, as root
// with only the capabilities the container adds (setpriv's bounding set),
// on a read-only root file system with a fresh tmpfs at each of the
// container's emptyDir mounts (a private mount namespace), with the
// container's environment, on a state of 400 services (over 64 KiB, which
// bash writes to a temporary file). Its rules are programmed; without
// NET_ADMIN, or without the writable /tmp, they are not.
func TestExampleCalloutConfinement(t *testing.T) {
	netns.RequirePrivileged(t)
	netns.RequireCommands(t, "setpriv", "unshare", "jq", "iptables-nft", "iptables-nft-restore", "ip6tables-nft")
	ds := exampleProxy(t)
	c := container(t, ds, "kpng-callout")
	var env []string
	callout := ""
	for _, e := range c.Env {
		switch {
		case e.Name == "CALLOUT":
			callout = e.Value
		case e.ValueFrom == nil:
			env = append(env, e.Name+"="+e.Value)
		}
	}
	if callout == "" {
		t.Fatal("the callout container has no CALLOUT")
	}
	// The image's /usr/local/bin/kpng-example-allip is examples/allip's,
	// handed over open (as /dev/fd/3): the checkout may lie under a path
	// the container gets a fresh tmpfs at (a clone in /tmp).
	script, err := os.Open(filepath.Join("..", "allip", filepath.Base(callout)))
	if err != nil {
		t.Fatal(err)
	}
	defer script.Close()
	emptyDirs := map[string]bool{}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.EmptyDir != nil {
			emptyDirs[v.Name] = true
		}
	}
	var tmpfs []string
	for _, m := range c.VolumeMounts {
		if emptyDirs[m.Name] {
			tmpfs = append(tmpfs, m.MountPath)
		}
	}
	if c.SecurityContext == nil || c.SecurityContext.Capabilities == nil {
		t.Fatal("the callout container adds no capabilities (privileged?)")
	}
	caps := c.SecurityContext.Capabilities.Add
	state := largeState(t, 400)

	run := func(t *testing.T, caps []v1.Capability, tmpfs []string) (bool, string) {
		ns := netns.New(t, "callout")
		bounding := "-all"
		for _, c := range caps {
			bounding += ",+" + strings.ToLower(string(c))
		}
		setup := "mount -o remount,bind,ro / || exit 98; if touch /kpng-rw-probe 2>/dev/null; then rm -f /kpng-rw-probe; exit 99; fi"
		for _, p := range tmpfs {
			setup += " ; mount -t tmpfs tmpfs " + p + " || exit 98"
		}
		args := append([]string{"netns", "exec", ns.Name, "unshare", "--mount", "--propagation", "private", "--",
			"sh", "-c", setup + ` ; exec "$@"`, "sh", "setpriv", "--bounding-set", bounding, "--inh-caps", "-all", "--",
			"env"}, append(env, "/dev/fd/3")...)
		cmd := exec.Command("ip", args...)
		cmd.ExtraFiles = []*os.File{script}
		cmd.Stdin = bytes.NewReader(state)
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() >= 98 {
			t.Fatalf("setting up the container's file systems: %v\n%s", err, out)
		}
		rules, _, _ := ns.Exec(nil, "iptables-nft", "-t", "nat", "-S", "KPNG-ALLIP")
		return err == nil && strings.Count(rules, "-j DNAT") == 400, fmt.Sprintf("%v\n%s", err, out)
	}
	t.Run(fmt.Sprintf("%v", caps), func(t *testing.T) {
		if ok, out := run(t, caps, tmpfs); !ok {
			t.Errorf("with %v and tmpfs at %v, the rules were not programmed: %s", caps, tmpfs, out)
		}
	})
	for _, drop := range caps {
		t.Run("without-"+string(drop), func(t *testing.T) {
			fewer := slices.DeleteFunc(slices.Clone(caps), func(c v1.Capability) bool { return c == drop })
			if ok, out := run(t, fewer, tmpfs); ok {
				t.Errorf("without %s, the rules were programmed: the capability is not needed\n%s", drop, out)
			}
		})
	}
	for _, p := range tmpfs {
		t.Run("read-only-"+p, func(t *testing.T) {
			fewer := slices.DeleteFunc(slices.Clone(tmpfs), func(q string) bool { return q == p })
			if ok, out := run(t, caps, fewer); ok {
				t.Errorf("without the emptyDir at %s, the rules were programmed: the volume is not needed\n%s", p, out)
			}
		})
	}
}
