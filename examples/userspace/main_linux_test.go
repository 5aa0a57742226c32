//go:build linux

package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/kpng/internal/controlplane"
	"sigs.k8s.io/kpng/internal/e2e"
	"sigs.k8s.io/kpng/internal/kubetest"
	"sigs.k8s.io/kpng/internal/netns"
)

var cp *controlplane.ControlPlane

func TestMain(m *testing.M) { controlplane.Main(m, &cp) }

// TestOnController runs kpng-userspace as a separate program fed by a
// kpng controller over its gRPC API (`kpng kube … to-api`), the seed's
// shape, proxying in the node namespace of the blog topology: TCP and UDP
// to the Service's external IPs reach the pod, then follow the endpoint
// to the second pod, and stop once the Service is deleted; both programs
// exit 0 on SIGTERM.
func TestOnController(t *testing.T) {
	cp.Require(t)
	netns.RequirePrivileged(t)
	b := netns.Blog(t)
	kc := kubetest.Client{T: t, C: cp.Client()}
	ns := kubetest.Namespace(t, cp.Client())
	name := kubetest.UniqueName("us-api")
	blog := e2e.CreateBlogService(kc, ns, name)

	sock := "unix://" + filepath.Join(t.TempDir(), "kpng.sock")
	controller := e2e.Start(t, e2e.Build(t, "cmd/kpng"), "kube", "--kubeconfig="+cp.KubeconfigPath(), "--service-proxy-name="+name,
		"to-api", "--listen="+sock)
	proxier := e2e.Start(t, e2e.Build(t, "examples/userspace"), "--api="+sock, "--node-name=node-a", "--name="+name,
		"--netns="+b.Node.Path(), "--node-ip=10.0.0.2,fd00::2")

	e2e.WaitAnswer(t, b, netns.PodID)
	e2e.AskUDP(t, b, netns.PodID)
	blog.MoveEndpoints(netns.Pod2V4, netns.Pod2V6)
	e2e.WaitAnswer(t, b, netns.Pod2ID)
	kc.DeleteService(ns, "web")
	e2e.WaitNoAnswer(t, b)
	proxier.Stop(t)
	controller.Stop(t)
}

// TestUsageErrors: bad flags exit 2 with a message naming the flag.
func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{{"--cluster-cidr=10.0.0.1/8"}, {"--node-ip=nope"}, {"--udp-idle-timeout=-1s"}, {"--no-such-flag"}} {
		var stderr bytes.Buffer
		if code := run(args, &stderr); code != 2 {
			t.Errorf("%v: exit status %d, want 2", args, code)
		}
		flagName, _, _ := strings.Cut(strings.TrimPrefix(args[0], "--"), "=")
		if !strings.Contains(stderr.String(), flagName) {
			t.Errorf("%v: stderr %q does not name the flag", args, stderr.String())
		}
	}
}
