//go:build linux

package main

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sigs.k8s.io/kpng/backends/iptables"
	"sigs.k8s.io/kpng/internal/e2e"
	"sigs.k8s.io/kpng/internal/kubetest"
	"sigs.k8s.io/kpng/internal/netns"
)

// TestKubeToLocalIPTables runs `kpng kube … to-local to-iptables`, with
// each variant, against the real API server, programming the node namespace of
// the blog topology, and checks TCP and UDP traffic from the client to a
// Service's external IPs (both families): answered by the endpoint's pod,
// then by another pod when the EndpointSlices move (one UDP flow kept
// across the move follows it: its stale conntrack entry is deleted), a
// LoadBalancer with the Local policy (node port keeping the client's
// address, health check node port), nobody once the Service is deleted;
// the chains outlive kpng and --cleanup removes them; bad flags are
// refused.
func TestKubeToLocalIPTables(t *testing.T) {
	cp.Require(t)
	netns.RequirePrivileged(t)
	netns.RequireCommands(t, "nsenter", "iptables-legacy-save", "iptables-legacy-restore", "iptables-nft-save", "iptables-nft-restore")
	bin := e2e.Build(t, "cmd/kpng")
	for _, variant := range []string{iptables.VariantLegacy, iptables.VariantNFT} {
		t.Run(variant, func(t *testing.T) { kubeToLocalIPTables(t, bin, variant) })
	}
}

// kubeToLocalIPTables is TestKubeToLocalIPTables with one variant.
func kubeToLocalIPTables(t *testing.T, bin, variant string) {
	b := netns.Blog(t)
	ctx := context.Background()
	kc := kubetest.Client{T: t, C: cp.Client()}
	ns := kubetest.Namespace(t, cp.Client())
	name := kubetest.UniqueName("ipt")
	prefix := iptables.ChainPrefix(name)
	// saved lists both families' tables: a round restores IPv4 then IPv6, so
	// a wait on one family alone can end before the other is programmed.
	saved := func() string {
		var all strings.Builder
		for _, save := range []string{"iptables-" + variant + "-save", "ip6tables-" + variant + "-save"} {
			out, _, err := b.Node.Exec(nil, save)
			if err != nil {
				t.Fatalf("%s: %v", save, err)
			}
			all.WriteString(out)
		}
		return all.String()
	}
	deleted := func(out string) bool {
		return !strings.Contains(out, netns.ServiceV4.String()) && !strings.Contains(out, netns.ServiceV6.String())
	}

	blog := e2e.CreateBlogService(kc, ns, name)
	kpng := e2e.Start(t, bin, "kube", "--kubeconfig="+cp.KubeconfigPath(), "--service-proxy-name="+name,
		"--node-name=node-a", "to-local", "to-iptables", "--iptables="+variant, "--netns="+b.Node.Path())

	e2e.WaitAnswer(t, b, netns.PodID)
	b.ExpectMasqueradedService(t, b.Client, netns.PodID)
	checkLoadBalancerLocal(t, b, kc, ns, name, true)
	// The endpoints move to the second pod: one UDP flow per family follows.
	blog.StaleUDPFlow(t, b, 40101)

	if err := cp.Client().CoreV1().Services(ns).Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && !deleted(saved()) {
		time.Sleep(50 * time.Millisecond)
	}
	if out := saved(); !deleted(out) {
		t.Errorf("the deleted Service's rules are still there:\n%s", out)
	}
	b.ExpectNoService(t, b.Client, 500*time.Millisecond)
	kpng.Stop(t)

	if !strings.Contains(saved(), prefix+"SERVICES") {
		t.Errorf("chains %s* gone after kpng stopped", prefix)
	}
	for _, extra := range [][]string{{"--cleanup"}, {"--cleanup"}, {"--cluster-cidr=10.0.0.1/8"}, {"--iptables=xtables"}, {"--masquerade-bit=0"}} {
		cmd := exec.Command(bin, append([]string{"kube", "--kubeconfig=" + cp.KubeconfigPath(), "--service-proxy-name=" + name,
			"to-local", "to-iptables", "--iptables=" + variant, "--netns=" + b.Node.Path()}, extra...)...)
		out, err := cmd.CombinedOutput()
		if extra[0] == "--cleanup" {
			if err != nil {
				t.Errorf("kpng to-iptables --cleanup: %v\n%s", err, out)
			}
			continue
		}
		var ee *exec.ExitError
		if flagName, _, _ := strings.Cut(extra[0], "="); !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), strings.TrimLeft(flagName, "-")) {
			t.Errorf("kpng to-iptables %s: %v, %s; want exit status 2 naming the flag", extra[0], err, out)
		}
	}
	if out := saved(); strings.Contains(out, prefix) {
		t.Errorf("chains left after --cleanup:\n%s", out)
	}
}
