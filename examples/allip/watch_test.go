//go:build linux

package main

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sigs.k8s.io/kpng/examples/allip/allip"
	"sigs.k8s.io/kpng/internal/controlplane"
	"sigs.k8s.io/kpng/internal/e2e"
	"sigs.k8s.io/kpng/internal/manifests"
	"sigs.k8s.io/kpng/internal/netns"
)

// openIn returns an opener for the namespace ns.
func openIn(ns *netns.NS) opener {
	return func() (*allip.Proxier, func(), error) {
		f, err := os.Open(ns.Path())
		if err != nil {
			return nil, nil, err
		}
		nft, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
		if err != nil {
			f.Close()
			return nil, nil, err
		}
		h, err := netlink.NewHandleAt(vnetns.NsHandle(int(f.Fd())))
		if err != nil {
			f.Close()
			return nil, nil, err
		}
		return &allip.Proxier{NFT: nft, Conntrack: h}, func() { h.Close(); f.Close() }, nil
	}
}

// waitServed waits until the client's TCP requests to both service
// addresses are answered by server: the states are applied asynchronously,
// and the two EndpointSlices (one per family) may arrive in two states.
func waitServed(t *testing.T, b *netns.BlogTopology, server string) {
	t.Helper()
	waitFor(t, "both service addresses to be served by "+server, func() (bool, string) {
		ok, saw := true, ""
		for _, svc := range []netip.Addr{netns.ServiceV4, netns.ServiceV6} {
			a, err := b.Client.Ask("tcp", netip.AddrPortFrom(svc, 6000), netns.AskOptions{Timeout: 300 * time.Millisecond})
			ok = ok && err == nil && a.Server == server
			saw += fmt.Sprintf("%s: answer %q, error %v\n", svc, a, err)
		}
		return ok, saw
	})
}

// TestProgramWatchesAPIServer is the blog's example end to end: the blog's
// Service and EndpointSlices on a real kube-apiserver, kpng-allip's watch
// loop (run with kpng's client flags, programming the node of the blog's
// topology), and traffic from the client. Moving node-a's endpoint in the
// EndpointSlices moves the traffic; deleting the Service removes the rules.
// The API server listens on the test's loopback, so the program's data
// plane, not the program, is in the node's namespace.
func TestProgramWatchesAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the test control plane (kube-apiserver + etcd)")
	}
	netns.RequirePrivileged(t)
	cp := startControlPlane(t)
	ctx := context.Background()
	applyBlogManifests(t, cp)
	b := netns.Blog(t)

	runCtx, stop := context.WithCancel(ctx)
	var stderr bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(runCtx, []string{
			"--kubeconfig=" + cp.KubeconfigPath(),
			"--service-proxy-name=kpng-example",
			"--node-name=node-a",
			"--min-sync-interval=10ms",
		}, nil, &stderr, openIn(b.Node))
	}()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			stop()
			<-done
		}
	})

	waitServed(t, b, netns.PodID)
	b.ExpectService(t, b.Client, netns.PodID)

	// The pod on node-a is replaced by pod2.
	moveNodeA(t, cp, netns.Pod2V4, netns.Pod2V6)
	waitServed(t, b, netns.Pod2ID)
	b.ExpectService(t, b.Client, netns.Pod2ID)

	if err := cp.Client().CoreV1().Services("default").Delete(ctx, "kpng-example", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the rules to go after the service's deletion", func() (bool, string) {
		rules := nftRules(t, b.Node)
		return rules == nil, fmt.Sprint(rules)
	})
	b.ExpectNoService(t, b.Client, 500*time.Millisecond)

	stop()
	stopped = true
	if code := <-done; code != 0 {
		t.Errorf("kpng-allip exited with status %d: %s", code, stderr.String())
	}
}

// startControlPlane starts a kube-apiserver and etcd for one test.
func startControlPlane(t *testing.T) *controlplane.ControlPlane {
	t.Helper()
	controlplane.SkipIfShort(t)
	cp, err := controlplane.Start()
	if err != nil {
		t.Fatalf("test control plane: %v", err)
	}
	t.Cleanup(func() {
		if err := cp.Stop(); err != nil {
			t.Error(err)
		}
	})
	return cp
}

// applyBlogManifests creates the blog's Service and its EndpointSlices.
func applyBlogManifests(t *testing.T, cp *controlplane.ControlPlane) {
	t.Helper()
	for _, m := range []string{"kpng-example.yaml", "kpng-example-endpointslices.yaml"} {
		if err := manifests.ApplyFile(context.Background(), cp.Client(), filepath.Join("..", "manifests", m)); err != nil {
			t.Fatal(err)
		}
	}
}

// moveNodeA gives node-a's endpoints of the blog's EndpointSlices the
// addresses v4 and v6, as if its pod had been replaced.
func moveNodeA(t *testing.T, cp *controlplane.ControlPlane, v4, v6 netip.Addr) {
	t.Helper()
	ctx := context.Background()
	slices := cp.Client().DiscoveryV1().EndpointSlices("default")
	for name, to := range map[string]netip.Addr{"kpng-example-ipv4": v4, "kpng-example-ipv6": v6} {
		s, err := slices.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for i := range s.Endpoints {
			if s.Endpoints[i].NodeName != nil && *s.Endpoints[i].NodeName == "node-a" {
				s.Endpoints[i].Addresses = []string{to.String()}
			}
		}
		if _, err := slices.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// waitFor polls cond for up to 30s; cond returns whether it holds and, if
// not, what it saw instead.
func waitFor(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, saw := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after 30s waiting for %s; last saw:\n%s", what, saw)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestScriptWithCallout runs the script the way the blog does, as
// kpng-callout's callout (CALLOUT="ip netns exec NODE bash
// kpng-example-allip"), against a real kube-apiserver: the blog's Service
// reaches the local pod, moving node-a's endpoint moves the traffic, deleting
// the Service removes every rule. kpng-callout watches the API server
// itself.
func TestScriptWithCallout(t *testing.T) { blogFlow(t, false) }

// TestBlogFlowThroughController is the blog's whole flow: the kpng
// controller (`kpng kube --service-proxy-name=kpng-example to-api`) serves a
// unix socket, and kpng-callout (`--api=unix://...`) runs the all-IP script
// for node-a; traffic from the client namespace follows the Service's
// endpoint, and the rules go with the Service.
func TestBlogFlowThroughController(t *testing.T) { blogFlow(t, true) }

func blogFlow(t *testing.T, viaController bool) {
	if testing.Short() {
		t.Skip("needs the test control plane (kube-apiserver + etcd)")
	}
	netns.RequirePrivileged(t)
	cp := startControlPlane(t)
	applyBlogManifests(t, cp)
	b := netns.Blog(t)
	s := newScriptRunner(t, b.Node)

	bin := e2e.Build(t, "examples/callout")
	source := []string{"--kubeconfig=" + cp.KubeconfigPath(), "--service-proxy-name=kpng-example", "--min-sync-interval=10ms"}
	var controller *e2e.Proc
	if viaController {
		sock := "unix://" + filepath.Join(t.TempDir(), "kpng.sock")
		controller = e2e.Start(t, e2e.Build(t, "cmd/kpng"), append(append([]string{"kube"}, source...), "--node-name=controller", "to-api", "--listen="+sock)...)
		source = []string{"--api=" + sock}
	}
	cmd := exec.Command(bin, append(source, "--node-name=node-a", "--retry-min=100ms", "--retry-max=1s")...)
	cmd.Env = append(os.Environ(), fmt.Sprintf("CALLOUT=ip netns exec %s env KPNG_ALLIP_LOCK=%s bash %s", b.Node.Name, s.lock, s.script))
	callout := e2e.StartCmd(t, cmd)

	// waitServed asks from the client only (PREROUTING); the node's own
	// traffic (OUTPUT) must be served as soon as the client's is: the
	// script adds a family's chain and both its jumps in one transaction,
	// and keeps the conntrack entries of the flows already sent to the new
	// target (TestScriptFamilyInOneTransaction,
	// TestScriptKeepsFlowsToNewTarget).
	waitServed(t, b, netns.PodID)
	b.ExpectService(t, b.Client, netns.PodID)
	b.ExpectService(t, b.Node, netns.PodID)

	moveNodeA(t, cp, netns.Pod2V4, netns.Pod2V6)
	waitServed(t, b, netns.Pod2ID)
	b.ExpectService(t, b.Client, netns.Pod2ID)

	if err := cp.Client().CoreV1().Services("default").Delete(context.Background(), "kpng-example", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the script to remove its rules", func() (bool, string) {
		save := natSave(t, b.Node)
		return !strings.Contains(strings.ToLower(save), "kpng"), save
	})
	b.ExpectNoService(t, b.Client, 500*time.Millisecond)
	callout.Stop(t)
	if controller != nil {
		controller.Stop(t)
	}
}
