//go:build linux

package userspace

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/model"
)

// The kernel tests run the proxier in the node of netns.Blog, with real
// traffic from the client and the pods, for what the conformance kit does
// not cover: what happens to open connections on a change, limits, UDP
// flows, conflicts with other programs, and what is left behind.

var (
	cipV4 = netip.MustParseAddr("10.96.0.10")
	cipV6 = netip.MustParseAddr("fd00:10:96::10")
)

// kernelProxier starts a proxier in the node of a new Blog topology; it is
// closed and its interface removed when the test ends.
func kernelProxier(t *testing.T, opts Options) (*netns.BlogTopology, *Sink) {
	t.Helper()
	netns.RequirePrivileged(t)
	topo := netns.Blog(t)
	return topo, startProxier(t, topo, opts)
}

// startProxier starts a proxier in the node of topo.
func startProxier(t *testing.T, topo *netns.BlogTopology, opts Options) *Sink {
	t.Helper()
	opts.NodeIPs = []netip.Addr{netns.NodeV4, netns.NodeV6}
	opts.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("11.0.2.0/24"), netip.MustParsePrefix("1100::200/120")}
	cfg := Config{ServiceProxyName: "kernel", NetNS: topo.Node.Path(), Options: opts}
	p, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Close()
		if err := Cleanup(context.Background(), cfg); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return p
}

// set gives the proxier the new value of one service (nil: deleted) and
// syncs.
func set(t *testing.T, p *Sink, key model.ServiceKey, se *model.ServiceEndpoints) error {
	t.Helper()
	p.Update(key, nil, se)
	return p.Sync()
}

// mustSet is set failing the test on a Sync error.
func mustSet(t *testing.T, p *Sink, se *model.ServiceEndpoints) {
	t.Helper()
	if err := set(t, p, se.Service.Key(), se); err != nil {
		t.Fatalf("Sync: %v", err)
	}
}

// podEndpoints returns local ready endpoints of the pods ids, both
// families.
func podEndpoints(ids ...string) []*model.Endpoint {
	addrs := map[string][]string{
		netns.PodID:  {netns.PodV4.String(), netns.PodV6.String()},
		netns.Pod2ID: {netns.Pod2V4.String(), netns.Pod2V6.String()},
	}
	var eps []*model.Endpoint
	for _, id := range ids {
		for _, a := range addrs[id] {
			eps = append(eps, ep(a, true))
		}
	}
	return eps
}

// echoService is default/<name> on both cluster IPs: TCP 80 to the pods'
// identity servers (6000) and TCP 90 to their echo servers (9000).
func echoService(name string, ports ...*model.PortMapping) *model.Service {
	if ports == nil {
		ports = []*model.PortMapping{
			{Name: "id", Protocol: model.TCP, Port: 80, TargetPort: 6000},
			{Name: "echo", Protocol: model.TCP, Port: 90, TargetPort: 9000},
		}
	}
	return &model.Service{Namespace: "default", Name: name, Type: "ClusterIP",
		IPs: model.ServiceIPs{ClusterIPs: ipset(cipV4.String(), cipV6.String())}, Ports: ports}
}

// echoConn is an open connection to an echo server.
type echoConn struct {
	net.Conn
	r *bufio.Reader
}

// dialEcho connects from ns to dst.
func dialEcho(t *testing.T, ns *netns.NS, dst netip.AddrPort) *echoConn {
	t.Helper()
	var c net.Conn
	if err := ns.Do(func() (err error) { c, err = net.DialTimeout("tcp", dst.String(), 2*time.Second); return err }); err != nil {
		t.Fatalf("dial %s: %v", dst, err)
	}
	t.Cleanup(func() { c.Close() })
	return &echoConn{c, bufio.NewReader(c)}
}

// roundTrip sends msg and returns the echo server's answer, or an error.
func (c *echoConn) roundTrip(msg string) error {
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte(msg + "\n")); err != nil {
		return err
	}
	got, err := c.r.ReadString('\n')
	if err != nil {
		return err
	}
	if got != "echo "+msg+"\n" {
		return fmt.Errorf("answer %q to %q", got, msg)
	}
	return nil
}

// askFrom asks dst from ns and returns the server that answered.
func askFrom(t *testing.T, ns *netns.NS, network string, dst netip.AddrPort) string {
	t.Helper()
	a, err := ns.Ask(network, dst, netns.AskOptions{})
	if err != nil {
		t.Errorf("%v", err)
	}
	return a.Server
}

// fds counts the process's open sockets (the other descriptors come and
// go with the ip commands the topology runs).
func fds(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n
}

// eventually polls cond for up to 5 s.
func eventually(cond func() bool) bool {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// TestKernelChangesAndOpenConnections: an endpoint removed lets its open
// connections finish while new ones go elsewhere; a port added rebinds
// nothing else; a service deleted closes its connections and takes its
// addresses off; the proxier closed leaves no goroutine and no file
// descriptor behind.
func TestKernelChangesAndOpenConnections(t *testing.T) {
	netns.RequirePrivileged(t)
	topo := netns.Blog(t)
	topo.Pod.ServeEcho(t, 9000)
	topo.Pod2.ServeEcho(t, 9000)
	goroutines, files := runtime.NumGoroutine(), fds(t)
	p := startProxier(t, topo, Options{})
	svc := echoService("echo")
	key := svc.Key()
	mustSet(t, p, &model.ServiceEndpoints{Service: svc, Endpoints: podEndpoints(netns.PodID)})
	conns := []*echoConn{dialEcho(t, topo.Client, netip.AddrPortFrom(cipV4, 90)), dialEcho(t, topo.Client, netip.AddrPortFrom(cipV6, 90))}
	for _, c := range conns {
		if err := c.roundTrip("before"); err != nil {
			t.Fatal(err)
		}
	}

	// The endpoint goes: open connections go on, new ones reach pod2.
	mustSet(t, p, &model.ServiceEndpoints{Service: svc, Endpoints: podEndpoints(netns.Pod2ID)})
	for _, c := range conns {
		if err := c.roundTrip("after the endpoint left"); err != nil {
			t.Errorf("open connection %s after its endpoint left: %v", c.RemoteAddr(), err)
		}
	}
	for _, ip := range []netip.Addr{cipV4, cipV6} {
		if got := askFrom(t, topo.Client, "tcp", netip.AddrPortFrom(ip, 80)); got != netns.Pod2ID {
			t.Errorf("new connection to %s after the change answered by %q, want pod2", ip, got)
		}
	}

	// A port added: the others keep their sockets and connections.
	bigger := echoService("echo", append(svc.Ports, &model.PortMapping{Name: "echo2", Protocol: model.TCP, Port: 91, TargetPort: 9000})...)
	mustSet(t, p, &model.ServiceEndpoints{Service: bigger, Endpoints: podEndpoints(netns.Pod2ID)})
	for _, c := range conns {
		if err := c.roundTrip("after a port was added"); err != nil {
			t.Errorf("open connection %s after a port was added: %v", c.RemoteAddr(), err)
		}
	}
	added := dialEcho(t, topo.Client, netip.AddrPortFrom(cipV4, 91))
	if err := added.roundTrip("new port"); err != nil {
		t.Errorf("the new port: %v", err)
	}
	conns = append(conns, added)

	// Deleted: the connections are closed and the addresses are gone.
	if err := set(t, p, key, nil); err != nil {
		t.Fatal(err)
	}
	for _, c := range conns {
		if err := c.roundTrip("after the service was deleted"); err == nil {
			t.Errorf("connection %s still open after its service was deleted", c.RemoteAddr())
		}
	}
	if out := topo.Node.IP("-o", "addr", "show", "dev", p.opts.Interface); strings.Contains(out, cipV4.String()) || strings.Contains(out, cipV6.String()) {
		t.Errorf("addresses left on %s after the service was deleted:\n%s", p.opts.Interface, out)
	}
	if len(p.frontends) != 0 || len(p.addrRefs) != 0 || len(p.limits) != 0 {
		t.Errorf("state left after the service was deleted: %d frontends, %d addresses, %d limits", len(p.frontends), len(p.addrRefs), len(p.limits))
	}

	p.Close()
	for _, c := range conns {
		c.Close()
	}
	if !eventually(func() bool { return runtime.NumGoroutine() <= goroutines }) {
		buf := make([]byte, 1<<16)
		t.Errorf("goroutines: %d before, %d after Close:\n%s", goroutines, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
	}
	if got := fds(t); got > files {
		t.Errorf("sockets: %d before, %d after Close", files, got)
	}
}

// TestKernelNoLeakPerConnection: many connections and UDP flows come and
// go; once they are done, the proxier holds no goroutine or descriptor
// for them.
func TestKernelNoLeakPerConnection(t *testing.T) {
	topo, p := kernelProxier(t, Options{UDPIdleTimeout: 200 * time.Millisecond})
	svc := echoService("web", &model.PortMapping{Name: "tcp", Protocol: model.TCP, Port: 80, TargetPort: 6000},
		&model.PortMapping{Name: "udp", Protocol: model.UDP, Port: 80, TargetPort: 6000})
	mustSet(t, p, &model.ServiceEndpoints{Service: svc, Endpoints: podEndpoints(netns.PodID, netns.Pod2ID)})
	askFrom(t, topo.Client, "tcp", netip.AddrPortFrom(cipV4, 80)) // warm up
	// No garbage collection meanwhile: its finalizers would close the
	// sockets the proxier forgot.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	runtime.GC()
	goroutines, files := runtime.NumGoroutine(), fds(t)
	for range 50 {
		for _, network := range []string{"tcp", "udp"} {
			askFrom(t, topo.Client, network, netip.AddrPortFrom(cipV4, 80))
		}
	}
	flows := func() (n int) {
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, f := range p.frontends {
			f.mu.Lock()
			n += len(f.flows) + len(f.conns)
			f.mu.Unlock()
		}
		return n
	}
	if !eventually(func() bool { return flows() == 0 && runtime.NumGoroutine() <= goroutines && fds(t) <= files }) {
		t.Errorf("after 50 TCP connections and 50 UDP flows ended: %d still tracked, goroutines %d → %d, descriptors %d → %d",
			flows(), goroutines, runtime.NumGoroutine(), files, fds(t))
	}
	if n := p.limits[svc.Key()].n.Load(); n != 0 {
		t.Errorf("the service's connection count is %d with nothing open", n)
	}
}

// TestKernelConnectionLimit: beyond MaxConnectionsPerService, a new
// connection is reset; once one closes, new ones are served again.
func TestKernelConnectionLimit(t *testing.T) {
	topo, p := kernelProxier(t, Options{MaxConnectionsPerService: 1})
	topo.Pod.ServeEcho(t, 9000)
	mustSet(t, p, &model.ServiceEndpoints{Service: echoService("echo"), Endpoints: podEndpoints(netns.PodID)})
	first := dialEcho(t, topo.Client, netip.AddrPortFrom(cipV4, 90))
	if err := first.roundTrip("first"); err != nil {
		t.Fatal(err)
	}
	// The reset may come before the client's connect returns, or after.
	var second net.Conn
	err := topo.Client.Do(func() (err error) {
		second, err = net.DialTimeout("tcp", netip.AddrPortFrom(cipV4, 90).String(), 2*time.Second)
		return err
	})
	if err == nil {
		defer second.Close()
		err = (&echoConn{second, bufio.NewReader(second)}).roundTrip("second")
	}
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("a connection beyond the limit: %v, want a reset", err)
	}
	first.Close()
	if !eventually(func() bool { return p.limits[echoService("echo").Key()].n.Load() == 0 }) {
		t.Fatal("the first connection is still counted after it closed")
	}
	if err := dialEcho(t, topo.Client, netip.AddrPortFrom(cipV4, 90)).roundTrip("third"); err != nil {
		t.Errorf("a connection after the first closed: %v", err)
	}
}

// TestKernelHalfClose: a client that sends its request and shuts down its
// side still gets the whole answer (the server answers only at the end of
// the request).
func TestKernelHalfClose(t *testing.T) {
	topo, p := kernelProxier(t, Options{})
	var ln net.Listener
	if err := topo.Pod.Do(func() (err error) { ln, err = net.Listen("tcp", ":9100"); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n, _ := io.Copy(io.Discard, c)
			fmt.Fprintf(c, "got %d\n", n)
			c.Close()
		}
	}()
	svc := echoService("drain", &model.PortMapping{Protocol: model.TCP, Port: 100, TargetPort: 9100})
	mustSet(t, p, &model.ServiceEndpoints{Service: svc, Endpoints: podEndpoints(netns.PodID)})
	for _, ip := range []netip.Addr{cipV4, cipV6} {
		c := dialEcho(t, topo.Client, netip.AddrPortFrom(ip, 100))
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write(make([]byte, 1<<20)); err != nil {
			t.Fatal(err)
		}
		if err := c.Conn.(*net.TCPConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(c)
		if err != nil || string(got) != "got 1048576\n" {
			t.Errorf("%s: answer %q, %v; want the server's count of the whole request", ip, got, err)
		}
	}
}

// TestKernelDialRetry: an endpoint that refuses connections is skipped:
// every connection reaches the one that answers.
func TestKernelDialRetry(t *testing.T) {
	topo, p := kernelProxier(t, Options{})
	svc := echoService("web", &model.PortMapping{Name: "http", Protocol: model.TCP, Port: 80, TargetPortName: "http"})
	good, bad := ep(netns.PodV4.String(), true), ep(netns.Pod2V4.String(), true)
	good.PortOverrides = map[string]int32{"http": 6000}
	bad.PortOverrides = map[string]int32{"http": 6999} // nothing listens there
	mustSet(t, p, &model.ServiceEndpoints{Service: svc, Endpoints: []*model.Endpoint{good, bad}})
	for i := range 10 {
		if got := askFrom(t, topo.Client, "tcp", netip.AddrPortFrom(cipV4, 80)); got != netns.PodID {
			t.Errorf("connection %d answered by %q, want pod (pod2's port refuses)", i, got)
		}
	}
}

// TestKernelAddressTaken: a node port another program listens on fails
// the Sync, naming the service; the other services are served meanwhile,
// and the port is taken at a later Sync once the program lets it go.
func TestKernelAddressTaken(t *testing.T) {
	topo, p := kernelProxier(t, Options{})
	var squatter net.Listener
	if err := topo.Node.Do(func() (err error) {
		squatter, err = net.Listen("tcp", netip.AddrPortFrom(netns.NodeV4, 30080).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer squatter.Close()
	np := echoService("np", &model.PortMapping{Protocol: model.TCP, Port: 80, NodePort: 30080, TargetPort: 6000})
	np.Type = "NodePort"
	other := echoService("other", &model.PortMapping{Protocol: model.TCP, Port: 80, TargetPort: 6000})
	other.IPs.ClusterIPs = ipset("10.96.0.20")
	p.Update(np.Key(), nil, &model.ServiceEndpoints{Service: np, Endpoints: podEndpoints(netns.PodID)})
	p.Update(other.Key(), nil, &model.ServiceEndpoints{Service: other, Endpoints: podEndpoints(netns.Pod2ID)})
	err := p.Sync()
	if err == nil || !strings.Contains(err.Error(), "default/np") || !strings.Contains(err.Error(), "10.0.0.2:30080") {
		t.Fatalf("Sync with a node port taken: %v, want an error naming default/np and 10.0.0.2:30080", err)
	}
	if got := askFrom(t, topo.Client, "tcp", netip.MustParseAddrPort("10.96.0.20:80")); got != netns.Pod2ID {
		t.Errorf("the other service: answered by %q, want pod2", got)
	}
	if got := askFrom(t, topo.Client, "tcp", netip.AddrPortFrom(cipV4, 80)); got != netns.PodID {
		t.Errorf("np's cluster IP: answered by %q, want pod", got)
	}
	if got := askFrom(t, topo.Client, "tcp", netip.AddrPortFrom(netns.NodeV6, 30080)); got != netns.PodID {
		t.Errorf("np's IPv6 node port: answered by %q, want pod", got)
	}
	squatter.Close()
	if err := p.Sync(); err != nil {
		t.Fatalf("Sync after the port was let go: %v", err)
	}
	if got := askFrom(t, topo.Client, "tcp", netip.AddrPortFrom(netns.NodeV4, 30080)); got != netns.PodID {
		t.Errorf("the node port once free: answered by %q, want pod", got)
	}
}

// TestKernelConflictBetweenServices: two services on one address and
// port: the first in key order has it, and the other gets it in the round
// where the first lets it go.
func TestKernelConflictBetweenServices(t *testing.T) {
	topo, p := kernelProxier(t, Options{})
	a := echoService("a", &model.PortMapping{Protocol: model.TCP, Port: 80, TargetPort: 6000})
	b := echoService("b", &model.PortMapping{Protocol: model.TCP, Port: 80, TargetPort: 6000})
	p.Update(a.Key(), nil, &model.ServiceEndpoints{Service: a, Endpoints: podEndpoints(netns.PodID)})
	p.Update(b.Key(), nil, &model.ServiceEndpoints{Service: b, Endpoints: podEndpoints(netns.Pod2ID)})
	if err := p.Sync(); err != nil {
		t.Fatal(err)
	}
	if got := askFrom(t, topo.Client, "tcp", netip.AddrPortFrom(cipV4, 80)); got != netns.PodID {
		t.Errorf("shared address: answered by %q, want a's pod", got)
	}
	if err := set(t, p, a.Key(), nil); err != nil {
		t.Fatal(err)
	}
	for _, ip := range []netip.Addr{cipV4, cipV6} {
		if got := askFrom(t, topo.Client, "tcp", netip.AddrPortFrom(ip, 80)); got != netns.Pod2ID {
			t.Errorf("%s once a was deleted: answered by %q, want b's pod2", ip, got)
		}
	}
}

// TestKernelUDPFlows: a client's datagrams stay on one flow (one
// endpoint) while it talks, replies come from the service address (the
// client's connected socket accepts nothing else), and an idle flow ends.
func TestKernelUDPFlows(t *testing.T) {
	topo, p := kernelProxier(t, Options{UDPIdleTimeout: 300 * time.Millisecond})
	svc := echoService("dns", &model.PortMapping{Protocol: model.UDP, Port: 53, TargetPort: 6000})
	mustSet(t, p, &model.ServiceEndpoints{Service: svc, Endpoints: podEndpoints(netns.PodID, netns.Pod2ID)})
	// IPv6 first, right after the Sync: the first datagram must not be
	// lost (a new IPv6 address is local only once the kernel's work
	// queue inserted its route, which the proxier waits for).
	for _, ip := range []netip.Addr{cipV6, cipV4} {
		seen := map[string]bool{}
		for i := range 6 {
			a, err := topo.Client.Ask("udp", netip.AddrPortFrom(ip, 53), netns.AskOptions{LocalPort: 40000})
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
			seen[a.Server] = true
		}
		if len(seen) != 1 {
			t.Errorf("%s: one client port went to %v: want one flow, one endpoint", ip, seen)
		}
	}
	f := p.frontends[frontendKey{model.UDP, netip.AddrPortFrom(cipV4, 53)}]
	count := func() int { f.mu.Lock(); defer f.mu.Unlock(); return len(f.flows) }
	if !eventually(func() bool { return count() == 0 }) {
		t.Errorf("%d flows left after the idle timeout", count())
	}
}

// TestKernelDropHolds: a connection the proxier drops (the Local policy
// without a local endpoint) gets neither an answer nor a reset: the
// client waits, as it would for a dropped SYN, until the service goes.
func TestKernelDropHolds(t *testing.T) {
	topo, p := kernelProxier(t, Options{})
	svc := echoService("local", &model.PortMapping{Protocol: model.TCP, Port: 80, TargetPort: 6000})
	svc.InternalTrafficToLocal = true
	remote := podEndpoints(netns.Pod2ID)
	for _, e := range remote {
		e.Local = false
	}
	mustSet(t, p, &model.ServiceEndpoints{Service: svc, Endpoints: remote})
	c := dialEcho(t, topo.Client, netip.AddrPortFrom(cipV4, 80))
	_, _ = c.Write([]byte("who are you?\n"))
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := c.r.ReadByte(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("a dropped connection: %v, want silence until the deadline", err)
	}
	if err := set(t, p, svc.Key(), nil); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.r.ReadByte(); errors.Is(err, os.ErrDeadlineExceeded) {
		t.Error("the held connection is still open after its service was deleted")
	}
}

// TestKernelUDPFlowFollowsEndpointRemoval: a client that keeps its port
// and keeps talking is moved off an endpoint that was removed (kube-proxy
// deletes the conntrack entries of stale UDP endpoints), while its flow
// to an endpoint that stays is kept.
func TestKernelUDPFlowFollowsEndpointRemoval(t *testing.T) {
	topo, p := kernelProxier(t, Options{})
	svc := echoService("dns", &model.PortMapping{Protocol: model.UDP, Port: 53, TargetPort: 6000})
	mustSet(t, p, &model.ServiceEndpoints{Service: svc, Endpoints: podEndpoints(netns.PodID)})
	dst := netip.AddrPortFrom(cipV4, 53)
	ask := func(port uint16) string {
		a, err := topo.Client.Ask("udp", dst, netns.AskOptions{LocalPort: port})
		if err != nil {
			t.Fatal(err)
		}
		return a.Server
	}
	if got := ask(40001); got != netns.PodID {
		t.Fatalf("first answer from %q, want pod", got)
	}
	mustSet(t, p, &model.ServiceEndpoints{Service: svc, Endpoints: podEndpoints(netns.PodID, netns.Pod2ID)})
	if got := ask(40001); got != netns.PodID {
		t.Errorf("the flow moved to %q when an endpoint was added, want it kept on pod", got)
	}
	mustSet(t, p, &model.ServiceEndpoints{Service: svc, Endpoints: podEndpoints(netns.Pod2ID)})
	if got := ask(40001); got != netns.Pod2ID {
		t.Errorf("the same client port after pod was removed: answered by %q, want pod2", got)
	}
}

// TestKernelServiceCIDRBlackholes: the service CIDRs of the cluster facts
// (the default proxier's) get blackhole routes of kpng's protocol; a
// restarted default proxier replaces those of the previous run, a proxier
// of a service-proxy-name (never given facts) never touches them, nor
// does anyone touch a route of another protocol; Cleanup of the default
// proxier removes them.
func TestKernelServiceCIDRBlackholes(t *testing.T) {
	netns.RequirePrivileged(t)
	ns := netns.New(t, "blackhole")
	ns.IP("route", "add", "blackhole", "10.99.0.0/16")
	routes := func() string {
		out := ns.IP("-4", "route", "show", "type", "blackhole") + ns.IP("-6", "route", "show", "type", "blackhole")
		return strings.Join(strings.Fields(out), " ")
	}
	facts := func(cidrs ...string) *model.Cluster {
		c := &model.Cluster{}
		for _, s := range cidrs {
			c.ServiceCIDRs = append(c.ServiceCIDRs, netip.MustParsePrefix(s))
		}
		return c
	}
	start := func(name string) (*Sink, Config) {
		t.Helper()
		cfg := Config{ServiceProxyName: name, NetNS: ns.Path(), Options: Options{NodeIPs: []netip.Addr{netns.NodeV4}}}
		p, err := New(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		return p, cfg
	}
	round := func(p *Sink, c *model.Cluster) {
		t.Helper()
		p.Reset()
		if c != nil {
			p.SetCluster(c)
		}
		if err := p.Sync(); err != nil {
			t.Fatalf("Sync: %v", err)
		}
	}

	def, _ := start("")
	round(def, facts("10.96.0.0/16", "fd00:10:96::/108"))
	want := "blackhole 10.96.0.0/16 proto 107 blackhole 10.99.0.0/16 blackhole fd00:10:96::/108 dev lo proto 107 metric 1024 pref medium"
	if got := routes(); got != want {
		t.Errorf("routes:\n%s\nwant\n%s", got, want)
	}
	named, namedCfg := start("named")
	round(named, nil)
	named.Close()
	if err := Cleanup(context.Background(), namedCfg); err != nil {
		t.Fatal(err)
	}
	if got := routes(); got != want {
		t.Errorf("after a named proxier ran and was cleaned up:\n%s\nwant\n%s", got, want)
	}
	def.Close()
	restarted, cfg := start("")
	round(restarted, facts("10.97.0.0/16"))
	if got, want := routes(), "blackhole 10.97.0.0/16 proto 107 blackhole 10.99.0.0/16"; got != want {
		t.Errorf("after a restart with other CIDRs:\n%s\nwant\n%s", got, want)
	}
	round(restarted, nil)
	if got, want := routes(), "blackhole 10.99.0.0/16"; got != want {
		t.Errorf("after the facts went:\n%s\nwant\n%s", got, want)
	}
	round(restarted, facts("10.97.0.0/16"))
	restarted.Close()
	if err := Cleanup(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	if got, want := routes(), "blackhole 10.99.0.0/16"; got != want {
		t.Errorf("after Cleanup:\n%s\nwant\n%s", got, want)
	}
}
