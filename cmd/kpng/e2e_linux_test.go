//go:build linux

package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"sigs.k8s.io/kpng/internal/controlplane"
	"sigs.k8s.io/kpng/internal/e2e"
	"sigs.k8s.io/kpng/internal/kubetest"
	"sigs.k8s.io/kpng/internal/netns"
)

var cp *controlplane.ControlPlane

func TestMain(m *testing.M) { controlplane.Main(m, &cp) }

// TestKubeToLocalNFT runs `kpng kube … to-local to-nft` against the real API
// server, programming the node namespace of the blog topology, and checks
// real TCP and UDP traffic from the client namespace to a Service's external
// IPs (both families, three ports): answered by the endpoint's pod, then by
// another pod when the EndpointSlices move (masqueraded: external IPs with
// the Cluster traffic policy, as kube-proxy), then by nobody once the
// Service is deleted; the tables outlive kpng, and --cleanup removes them.
func TestKubeToLocalNFT(t *testing.T) {
	cp.Require(t)
	netns.RequirePrivileged(t)
	netns.RequireCommands(t, "nft")
	b := netns.Blog(t)
	ctx := context.Background()
	kc := kubetest.Client{T: t, C: cp.Client()}
	ns := kubetest.Namespace(t, cp.Client())
	name := kubetest.UniqueName("nft")

	blog := e2e.CreateBlogService(kc, ns, name)

	bin := e2e.Build(t, "cmd/kpng")
	kpng := e2e.Start(t, bin, "kube", "--kubeconfig="+cp.KubeconfigPath(), "--service-proxy-name="+name,
		"--node-name=node-a", "to-local", "to-nft", "--netns="+b.Node.Path())

	e2e.WaitAnswer(t, b, netns.PodID)
	b.ExpectMasqueradedService(t, b.Client, netns.PodID)
	// A proxier of a service-proxy-name gets no service CIDRs.
	for _, family := range []string{"ip", "ip6"} {
		if out := b.Node.MustExec("nft", "list", "chain", family, "kpng-"+name, "cluster-ips-check"); strings.Contains(out, " drop") {
			t.Errorf("the proxier of %s drops service CIDRs:\n%s", name, out)
		}
	}
	checkLoadBalancerLocal(t, b, kc, ns, name, true)
	// The endpoints move to the second pod: one UDP flow per family follows.
	blog.StaleUDPFlow(t, b, 40100)
	b.ExpectMasqueradedService(t, b.Client, netns.Pod2ID)

	// The Service goes: its rules go, the tables stay.
	if err := cp.Client().CoreV1().Services(ns).Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	var table string
	for time.Now().Before(deadline) {
		out, _, err := b.Node.Exec(nil, "nft", "list", "table", "ip", "kpng-"+name)
		if err == nil {
			var out6 string
			out6, _, err = b.Node.Exec(nil, "nft", "list", "table", "ip6", "kpng-"+name)
			out += out6
		}
		table = out
		if err == nil && !strings.Contains(out, netns.ServiceV4.String()) && !strings.Contains(out, "web") {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if strings.Contains(table, netns.ServiceV4.String()) || strings.Contains(table, "web") {
		t.Errorf("the deleted Service's rules are still in the tables:\n%s", table)
	}
	b.ExpectNoService(t, b.Client, 500*time.Millisecond)

	kpng.Stop(t)

	// The rules outlive the process (a restart must not blackhole
	// traffic); --cleanup removes them and exits without watching.
	if out, _, err := b.Node.Exec(nil, "nft", "list", "tables"); err != nil || !strings.Contains(out, "table ip kpng-"+name+"\n") ||
		!strings.Contains(out, "table ip6 kpng-"+name+"\n") {
		t.Errorf("a table gone after kpng stopped: %q, %v", out, err)
	}
	for _, extra := range [][]string{{"--cleanup"}, {"--cleanup"}, {"--cluster-cidr=10.0.0.1/8"}, {"--node-ip=10.0.0.300"}} {
		cleanup := exec.Command(bin, append([]string{"kube", "--kubeconfig=" + cp.KubeconfigPath(), "--service-proxy-name=" + name,
			"to-local", "to-nft", "--netns=" + b.Node.Path()}, extra...)...)
		out, err := cleanup.CombinedOutput()
		if extra[0] == "--cleanup" {
			if err != nil {
				t.Errorf("kpng to-nft --cleanup: %v\n%s", err, out)
			}
			continue
		}
		var ee *exec.ExitError
		if flagName, _, _ := strings.Cut(extra[0], "="); !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), strings.TrimLeft(flagName, "-")) {
			t.Errorf("kpng to-nft %s: %v, %s; want exit status 2 naming the flag", extra[0], err, out)
		}
	}
	if out, _, err := b.Node.Exec(nil, "nft", "list", "tables"); err != nil || strings.Contains(out, "kpng-"+name) {
		t.Errorf("a table left after --cleanup: %q, %v", out, err)
	}
}

// TestKubeToLocalNFTDefaultProxier runs `kpng kube … to-local to-nft`
// without a service-proxy-name, the cluster's default proxier: the
// watcher gives the API server's service CIDRs (its ServiceCIDR object
// "kubernetes": 10.96.0.0/16, fd00:10:96::/108), and an address of them
// that no service holds, which a host beyond the node holds, stops
// answering a pod; an unlabelled Service still answers on its cluster IP.
// (TestKubeToLocalNFT checks that a named proxier gets no CIDRs.)
func TestKubeToLocalNFTDefaultProxier(t *testing.T) {
	cp.Require(t)
	netns.RequirePrivileged(t)
	netns.RequireCommands(t, "nft")
	b := netns.Blog(t)
	kc := kubetest.Client{T: t, C: cp.Client()}
	ns := kubetest.Namespace(t, cp.Client())
	svc := kc.CreateService(kubetest.Service(ns, "web", "", func(s *v1.Service) {
		s.Spec.Ports = []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(6000)}}
	}))
	kc.CreateSlice(kubetest.Slice(svc, "web-1", kubetest.EP{IP: netns.PodV4.String(), Node: "node-a"}))
	clusterIP := netip.MustParseAddr(svc.Spec.ClusterIP)
	// An address of the range that no Service holds, on a host beyond
	// the node (the client's loopback, reached by the node's default
	// route).
	unused := netip.MustParseAddr("10.96.255.254")
	all, err := cp.Client().CoreV1().Services("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range all.Items {
		if s.Spec.ClusterIP == unused.String() {
			t.Fatalf("service %s/%s holds %s, which the test takes as unused", s.Namespace, s.Name, unused)
		}
	}
	b.Client.AddAddr("lo", unused.String()+"/32")
	b.Client.Serve("outside", []netip.Addr{unused}, []uint16{80})
	if a, err := b.Pod2.Ask("tcp", netip.AddrPortFrom(unused, 80), netns.AskOptions{}); err != nil || a.Server != "outside" {
		t.Fatalf("before kpng, %s from pod2: %v, %v; want the outside host", unused, a, err)
	}

	bin := e2e.Build(t, "cmd/kpng")
	kpng := e2e.Start(t, bin, "kube", "--kubeconfig="+cp.KubeconfigPath(), "--node-name=node-a",
		"to-local", "to-nft", "--netns="+b.Node.Path(), "--healthcheck=false")
	defer kpng.Stop(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		a, err := b.Pod2.Ask("tcp", netip.AddrPortFrom(clusterIP, 80), netns.AskOptions{Timeout: 300 * time.Millisecond})
		_, uerr := b.Pod2.Ask("tcp", netip.AddrPortFrom(unused, 80), netns.AskOptions{Timeout: 300 * time.Millisecond})
		if err == nil && a.Server == netns.PodID && uerr != nil && !errors.Is(uerr, syscall.ECONNREFUSED) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("30 s after kpng started: %s: %v, %v (want the pod); %s: %v (want no answer)\n%s", clusterIP, a, err, unused, uerr, kpng.Output.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	out := b.Node.MustExec("nft", "list", "chain", "ip", "kpng", "cluster-ips-check")
	if !strings.Contains(out, "ip daddr 10.96.0.0/16 drop") {
		t.Errorf("chain cluster-ips-check:\n%s\nwant ip daddr 10.96.0.0/16 drop", out)
	}
}

// checkLoadBalancerLocal creates a LoadBalancer Service with
// externalTrafficPolicy: Local whose endpoint is the pod on this node, and
// checks, from the client, its node port (answered by the pod, which sees
// the client's address) and its health check node port (200 with one
// local endpoint). keepsClient says whether the pod must see the client's
// address (a kernel backend) or not (a userspace proxy).
func checkLoadBalancerLocal(t *testing.T, b *netns.BlogTopology, kc kubetest.Client, ns, proxyName string, keepsClient bool) {
	t.Helper()
	lb := kc.CreateService(kubetest.Service(ns, "lb", proxyName, func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		s.Spec.Ports = []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(6000)}}
	}))
	if lb.Spec.HealthCheckNodePort == 0 || lb.Spec.Ports[0].NodePort == 0 {
		t.Fatalf("the API server allocated no node port or health check node port: %+v", lb.Spec)
	}
	kc.CreateSlice(kubetest.Slice(lb, "lb-v4", kubetest.EP{IP: netns.PodV4.String(), Node: "node-a"}))
	nodePort := netip.AddrPortFrom(netns.NodeV4, uint16(lb.Spec.Ports[0].NodePort))
	health := netip.AddrPortFrom(netns.NodeV4, uint16(lb.Spec.HealthCheckNodePort))

	deadline := time.Now().Add(30 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		a, err := b.Client.Ask("tcp", nodePort, netns.AskOptions{Timeout: 300 * time.Millisecond})
		code, body, herr := httpGet(b.Client, health)
		last = fmt.Sprintf("node port: %v %v; health check: %d %q %v", a, err, code, body, herr)
		if err == nil && a.Server == netns.PodID && code == 200 {
			if (a.Remote.Addr() == netns.ClientV4) != keepsClient {
				t.Errorf("node port with the Local policy: the pod saw %s; the client is %s, kept: %v", a.Remote, netns.ClientV4, keepsClient)
			}
			if !strings.Contains(body, `"localEndpoints":1`) || !strings.Contains(body, `"name":"lb"`) {
				t.Errorf("health check body %q", body)
			}
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("LoadBalancer service with the Local policy not served within 30s: %s", last)
}

// httpGet sends GET /healthz to dst from the namespace n (one connection
// made in it) and returns the status code and body.
func httpGet(n *netns.NS, dst netip.AddrPort) (int, string, error) {
	var code int
	var body string
	err := n.Do(func() error {
		c, err := net.DialTimeout("tcp", dst.String(), time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := fmt.Fprintf(c, "GET /healthz HTTP/1.0\r\nHost: %s\r\n\r\n", dst); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		code, body = resp.StatusCode, string(data)
		return err
	})
	return code, body, err
}
