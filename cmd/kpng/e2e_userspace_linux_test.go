//go:build linux

package main

import (
	"errors"
	"os/exec"
	"strings"
	"testing"

	"sigs.k8s.io/kpng/backends/userspace"
	"sigs.k8s.io/kpng/internal/e2e"
	"sigs.k8s.io/kpng/internal/kubetest"
	"sigs.k8s.io/kpng/internal/netns"
)

// TestKubeToLocalUserspace runs `kpng kube … to-local to-userspace`
// against the real API server, proxying in the node namespace of the
// blog topology: TCP and UDP from the client to the Service's external
// IPs (both families) reach the pod, then follow the EndpointSlices to the
// second pod; a LoadBalancer Service with the Local policy has its node
// port and health check served; the Service deleted, nothing answers;
// SIGTERM exits 0; --cleanup removes the interface; bad flags exit 2.
func TestKubeToLocalUserspace(t *testing.T) {
	cp.Require(t)
	netns.RequirePrivileged(t)
	b := netns.Blog(t)
	kc := kubetest.Client{T: t, C: cp.Client()}
	ns := kubetest.Namespace(t, cp.Client())
	name := kubetest.UniqueName("us")
	blog := e2e.CreateBlogService(kc, ns, name)

	bin := e2e.Build(t, "cmd/kpng")
	backend := []string{"kube", "--kubeconfig=" + cp.KubeconfigPath(), "--service-proxy-name=" + name, "--node-name=node-a",
		"to-local", "to-userspace", "--netns=" + b.Node.Path()}
	kpng := e2e.Start(t, bin, append(backend, "--node-ip=10.0.0.2,fd00::2", "--cluster-cidr=11.0.2.0/24,1100::200/120")...)

	e2e.WaitAnswer(t, b, netns.PodID)
	e2e.AskUDP(t, b, netns.PodID)
	checkLoadBalancerLocal(t, b, kc, ns, name, false)
	blog.MoveEndpoints(netns.Pod2V4, netns.Pod2V6)
	e2e.WaitAnswer(t, b, netns.Pod2ID)
	e2e.AskUDP(t, b, netns.Pod2ID)
	kc.DeleteService(ns, "web")
	e2e.WaitNoAnswer(t, b)
	kpng.Stop(t)

	iface := userspace.InterfaceName(name)
	if out := b.Node.IP("link", "show"); !strings.Contains(out, iface) {
		t.Errorf("interface %s gone after kpng stopped (its addresses should stay, refused by the kernel):\n%s", iface, out)
	}
	for _, extra := range []string{"--cluster-cidr=10.0.0.1/8", "--node-ip=10.0.0.300", "--dial-timeout=-1s", "--cleanup"} {
		out, err := exec.Command(bin, append(backend, extra)...).CombinedOutput()
		if extra == "--cleanup" {
			if err != nil {
				t.Errorf("kpng to-userspace --cleanup: %v\n%s", err, out)
			}
			continue
		}
		var ee *exec.ExitError
		if flagName, _, _ := strings.Cut(extra, "="); !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), flagName[2:]) {
			t.Errorf("kpng to-userspace %s: %v, %s; want exit status 2 naming the flag", extra, err, out)
		}
	}
	if out := b.Node.IP("link", "show"); strings.Contains(out, iface) {
		t.Errorf("interface %s left after --cleanup:\n%s", iface, out)
	}
}
