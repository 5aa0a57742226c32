//go:build linux

// Package e2e holds what the end-to-end tests of the proxiers share: the
// blog topology's Service written to the test API server, and waiting for
// traffic to follow it.
package e2e

import (
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"sigs.k8s.io/kpng/internal/controlplane"
	"sigs.k8s.io/kpng/internal/kubetest"
	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/internal/testio"
)

// BlogService is the Service of netns.Blog in the API server, and its
// EndpointSlices.
type BlogService struct {
	Service *v1.Service
	// Slices are the Service's slices by family ("4", "6").
	Slices map[string]*discovery.EndpointSlice
	kc     kubetest.Client
}

// CreateBlogService creates in ns, for proxyName, the blog's Service:
// dual-stack, on the external IPs netns.ServiceV4 and ServiceV6, TCP and
// UDP on each of netns.BlogPorts, with one EndpointSlice per family whose
// endpoint is the first pod, on node-a.
func CreateBlogService(kc kubetest.Client, ns, proxyName string) *BlogService {
	svc := kubetest.Service(ns, "web", proxyName, func(s *v1.Service) {
		p := v1.IPFamilyPolicyRequireDualStack
		s.Spec.IPFamilyPolicy = &p
		s.Spec.ExternalIPs = []string{netns.ServiceV4.String(), netns.ServiceV6.String()}
		s.Spec.Ports = nil
		for _, port := range netns.BlogPorts {
			for _, proto := range []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP} {
				s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{
					Name: PortName(proto, port), Protocol: proto, Port: int32(port), TargetPort: intstr.FromInt32(int32(port)),
				})
			}
		}
	})
	b := &BlogService{Service: kc.CreateService(svc), Slices: map[string]*discovery.EndpointSlice{}, kc: kc}
	for _, ip := range []netip.Addr{netns.PodV4, netns.PodV6} {
		s := kubetest.Slice(b.Service, "web-v"+Family(ip), kubetest.EP{IP: ip.String(), Node: "node-a"})
		s.Ports = nil
		for _, port := range netns.BlogPorts {
			for _, proto := range []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP} {
				n, pr, po := PortName(proto, port), proto, int32(port)
				s.Ports = append(s.Ports, discovery.EndpointPort{Name: &n, Protocol: &pr, Port: &po})
			}
		}
		b.Slices[Family(ip)] = kc.CreateSlice(s)
	}
	return b
}

// MoveEndpoints makes v4 and v6 the slices' endpoint addresses.
func (b *BlogService) MoveEndpoints(v4, v6 netip.Addr) {
	for fam, ip := range map[string]netip.Addr{"4": v4, "6": v6} {
		s := b.Slices[fam]
		s.Endpoints[0].Addresses = []string{ip.String()}
		b.Slices[fam] = b.kc.UpdateSlice(s)
	}
}

// PortName names a port of the blog Service: "tcp-6000".
func PortName(proto v1.Protocol, port uint16) string {
	return fmt.Sprintf("%s-%d", strings.ToLower(string(proto)), port)
}

// Family is "4" or "6".
func Family(ip netip.Addr) string {
	if ip.Is4() {
		return "4"
	}
	return "6"
}

// WaitAnswer waits up to 30 s until TCP from the client to both external
// IPs on the first blog port is answered by server.
func WaitAnswer(t *testing.T, b *netns.BlogTopology, server string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		ok := true
		last = ""
		for _, svc := range []netip.Addr{netns.ServiceV4, netns.ServiceV6} {
			a, err := b.Client.Ask("tcp", netip.AddrPortFrom(svc, netns.BlogPorts[0]), netns.AskOptions{Timeout: 300 * time.Millisecond})
			ok = ok && err == nil && a.Server == server
			last += fmt.Sprintf("%s: %q %v; ", svc, a, err)
		}
		if ok {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("service not answered by %s within 30s: %s", server, last)
}

// Proc is a program under test, started by Start.
type Proc struct {
	cmd     *exec.Cmd
	Output  testio.SyncBuffer
	exited  chan error
	stopped bool
}

// Start starts bin with args; the process is killed when the test ends
// (if Stop did not end it), and its output logged if the test failed.
func Start(t *testing.T, bin string, args ...string) *Proc {
	t.Helper()
	return StartCmd(t, exec.Command(bin, args...))
}

// StartCmd is Start for a command prepared by the caller (its environment,
// say); its output goes to Proc.Output.
func StartCmd(t *testing.T, cmd *exec.Cmd) *Proc {
	t.Helper()
	p := &Proc{cmd: cmd, exited: make(chan error, 1)}
	bin := cmd.Path
	p.cmd.Stdout, p.cmd.Stderr = &p.Output, &p.Output
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		if !p.stopped {
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", filepath.Base(bin), p.Output.String())
		}
	})
	return p
}

// Stop sends SIGTERM and fails the test unless the process exits with
// status 0 within 20 s.
func (p *Proc) Stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.exited:
		p.stopped = true
		if err != nil {
			t.Errorf("%s after SIGTERM: %v", p.cmd.Path, err)
		}
	case <-time.After(20 * time.Second):
		t.Errorf("%s still running 20s after SIGTERM", p.cmd.Path)
	}
}

// Kill kills the process with SIGKILL, as in a crash, and waits for it.
func (p *Proc) Kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-p.exited
	p.stopped = true
}

// Build builds the main package at dir (relative to the repository root)
// into a temporary directory and returns the binary's path.
func Build(t *testing.T, dir string) string {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), filepath.Base(dir))
	cmd := exec.Command("go", "build", "-o", bin, "./"+dir)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", dir, err, out)
	}
	return bin
}

// WaitNoAnswer waits up to 30 s until TCP from the client to both
// external IPs on the first blog port is no longer answered, then checks
// that no port of either address answers, TCP or UDP.
func WaitNoAnswer(t *testing.T, b *netns.BlogTopology) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		answered := false
		for _, svc := range []netip.Addr{netns.ServiceV4, netns.ServiceV6} {
			_, err := b.Client.Ask("tcp", netip.AddrPortFrom(svc, netns.BlogPorts[0]), netns.AskOptions{Timeout: 300 * time.Millisecond})
			answered = answered || err == nil
		}
		if !answered {
			break
		}
	}
	b.ExpectNoService(t, b.Client, 500*time.Millisecond)
}

// AskUDP checks that UDP from the client to both external IPs on the
// first blog port is answered by server.
func AskUDP(t *testing.T, b *netns.BlogTopology, server string) {
	t.Helper()
	for _, svc := range []netip.Addr{netns.ServiceV4, netns.ServiceV6} {
		if a, err := b.Client.Ask("udp", netip.AddrPortFrom(svc, netns.BlogPorts[0]), netns.AskOptions{}); err != nil || a.Server != server {
			t.Errorf("UDP to %s: %q, %v; want %s", svc, a, err, server)
		}
	}
}

// StaleUDPFlow checks a kernel backend's conntrack cleanup end to end: it
// opens one UDP flow (one client port, so one conntrack entry in the node)
// per family to the external IPs, answered by the first pod, moves the
// endpoints to the second pod, and checks that the same flow follows them
// within 5 s (without the cleanup it would stay on the first pod for as
// long as it keeps sending, its entry's timeout being renewed).
func (b *BlogService) StaleUDPFlow(t *testing.T, topo *netns.BlogTopology, clientPort uint16) {
	t.Helper()
	for _, svc := range []netip.Addr{netns.ServiceV4, netns.ServiceV6} {
		a, err := topo.Client.Ask("udp", netip.AddrPortFrom(svc, netns.BlogPorts[0]), netns.AskOptions{LocalPort: clientPort})
		if err != nil || a.Server != netns.PodID {
			t.Errorf("UDP flow to %s: %q, %v; want %s", svc, a, err, netns.PodID)
		}
	}
	b.MoveEndpoints(netns.Pod2V4, netns.Pod2V6)
	WaitAnswer(t, topo, netns.Pod2ID)
	// The backend deletes the entries right after it moved the endpoint,
	// which WaitAnswer may have seen first: the flow may still reach the
	// first pod for a moment, not for long.
	for _, svc := range []netip.Addr{netns.ServiceV4, netns.ServiceV6} {
		var a netns.Answer
		var err error
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			a, err = topo.Client.Ask("udp", netip.AddrPortFrom(svc, netns.BlogPorts[0]), netns.AskOptions{LocalPort: clientPort})
			if err == nil && a.Server == netns.Pod2ID {
				break
			}
		}
		if err != nil || a.Server != netns.Pod2ID {
			t.Errorf("the same UDP flow to %s after the move: %q, %v; want %s within 5s (stale conntrack entry?)", svc, a, err, netns.Pod2ID)
		}
	}
}
