//go:build linux

package main

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/kpng/backends/iptables"
	"sigs.k8s.io/kpng/internal/e2e"
	"sigs.k8s.io/kpng/internal/kubetest"
	"sigs.k8s.io/kpng/internal/netns"
)

// TestKubeToLocalNFTForwardAccept runs `kpng kube … to-local to-nft` on a
// node whose FORWARD policy is DROP (iptables-nft, both families, as
// Docker sets it), against the real API server: without --forward-accept
// the blog Service, programmed in the nftables tables, is not answered
// (the control); with it, it is (TCP and UDP, both families), the node's
// iptables filter table holding kpng's chain; --cleanup, without the
// flag, removes the chain and its jump with the tables.
func TestKubeToLocalNFTForwardAccept(t *testing.T) {
	cp.Require(t)
	netns.RequirePrivileged(t)
	netns.RequireCommands(t, "nft", "nsenter", "iptables-nft-restore", "ip6tables-nft-restore")
	b := netns.Blog(t)
	for _, bin := range []string{"iptables-nft", "ip6tables-nft"} {
		b.Node.MustExec(bin, "-P", "FORWARD", "DROP")
	}
	kc := kubetest.Client{T: t, C: cp.Client()}
	ns := kubetest.Namespace(t, cp.Client())
	name := kubetest.UniqueName("fwd")
	e2e.CreateBlogService(kc, ns, name)
	bin := e2e.Build(t, "cmd/kpng")
	args := []string{"kube", "--kubeconfig=" + cp.KubeconfigPath(), "--service-proxy-name=" + name,
		"--node-name=node-a", "to-local", "to-nft", "--netns=" + b.Node.Path(), "--healthcheck=false", "--check-period=100ms"}

	kpng := e2e.Start(t, bin, args...)
	// The control counts only once kpng programmed the Service.
	programmed := false
	for deadline := time.Now().Add(30 * time.Second); !programmed && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		out, _, err := b.Node.Exec(nil, "nft", "list", "table", "ip6", "kpng-"+name)
		programmed = err == nil && strings.Contains(out, netns.ServiceV6.String())
	}
	if !programmed {
		t.Fatalf("without --forward-accept: the Service %s/%s not in kpng's table ip6 within 30 s", ns, name)
	}
	b.ExpectNoService(t, b.Client, 500*time.Millisecond)
	kpng.Stop(t)

	kpng = e2e.Start(t, bin, append(args, "--forward-accept")...)
	e2e.WaitAnswer(t, b, netns.PodID)
	e2e.AskUDP(t, b, netns.PodID)
	chainName := iptables.ForwardAcceptChain(name)
	for _, save := range []string{"iptables-nft-save", "ip6tables-nft-save"} {
		if out := b.Node.MustExec(save, "-t", "filter"); !strings.Contains(out, "-j "+chainName) {
			t.Errorf("%s: no jump to %s:\n%s", save, chainName, out)
		}
	}
	kpng.Stop(t)

	cleanup := exec.Command(bin, append(args[:len(args)-2:len(args)-2], "--cleanup")...)
	if out, err := cleanup.CombinedOutput(); err != nil {
		t.Fatalf("kpng to-nft --cleanup: %v\n%s", err, out)
	}
	for _, save := range []string{"iptables-nft-save", "ip6tables-nft-save"} {
		if out := b.Node.MustExec(save, "-t", "filter"); strings.Contains(out, chainName) {
			t.Errorf("%s after --cleanup: chain %s left:\n%s", save, chainName, out)
		}
	}
	b.ExpectNoService(t, b.Client, 500*time.Millisecond)
}
