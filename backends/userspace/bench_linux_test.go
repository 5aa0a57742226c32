//go:build linux

package userspace

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/model"
)

// The benchmarks of this file measure the userspace proxier's data path
// side by side with the same traffic sent directly to the server and
// through HAProxy in TCP mode, and its control path with 100 and 10,000
// services. They run in network namespaces and need root; each asserts
// that the traffic is answered by the right server, none asserts a time.
// See docs/benchmarks.md ("userspace backend") and hack/bench-userspace.sh.
//
// The topology (benchEnv):
//
//	client 10.0.0.1/24      routes: default via the node
//	  | eth0
//	  | eth0
//	node 10.0.0.2/24        forwarding on; the proxier (its dummy interface
//	  | vsrv                holds the cluster IPs) and HAProxy run here
//	  | 10.1.0.1/24
//	  | eth0
//	server 10.1.0.2/24      default route via the node; the sink, echo and
//	       10.1.0.3/24      identity servers of benchServerA, the identity
//	                        server of benchServerB
//
// The paths (benchPath): direct (the client to the server's address,
// forwarded by the node's kernel); userspace (the client to a cluster IP
// the proxier listens on; it connects to the server from the node), with
// the proxier in a process of its own started in the node namespace, as
// a deployed proxier runs; userspace-inproc, the same with the proxier in
// the benchmark's own process (Config.NetNS), sharing its Go runtime with
// the client and the servers; and haproxy (the client to a port HAProxy
// listens on in the node, one backend server: the same server).

// The addresses of the benchmark topology.
var (
	benchClientIP  = netip.MustParseAddr("10.0.0.1")
	benchNodeIP    = netip.MustParseAddr("10.0.0.2")
	benchGatewayIP = netip.MustParseAddr("10.1.0.1")
	benchServerA   = netip.MustParseAddr("10.1.0.2")
	benchServerB   = netip.MustParseAddr("10.1.0.3")
	// benchPerfIP is the cluster IP of the service of the data-path
	// benchmarks (benchPerfService).
	benchPerfIP = netip.MustParseAddr("10.96.0.10")
)

// The ports of the benchmark servers, the same on the service and, for
// HAProxy, benchHAProxyOffset above them.
const (
	// benchSinkPort is the sink server: it reads until EOF and answers
	// the number of bytes read.
	benchSinkPort = 5001
	// benchEchoPort is the echo server.
	benchEchoPort = 5002
	// benchWhoPort is the identity server of netns.Serve: it reads one
	// line, answers who it is, and closes.
	benchWhoPort = 6000
	// benchHAProxyOffset is added to a server's port to get the port
	// HAProxy listens on for it.
	benchHAProxyOffset = 10000
)

// The identities of the servers.
const (
	benchIDA = "server-a"
	benchIDB = "server-b"
)

// benchEnv is the benchmark topology (see the top of the file).
type benchEnv struct {
	client, node, server *netns.NS
}

// newBenchEnv builds the topology and starts the servers; everything is
// removed when b ends. It silences klog meanwhile: the proxier's lines
// would land between a benchmark's name and its figures.
func newBenchEnv(b *testing.B) *benchEnv {
	b.Helper()
	netns.RequirePrivileged(b)
	klog.LogToStderr(false)
	klog.SetOutput(io.Discard)
	b.Cleanup(func() { klog.LogToStderr(true) })
	e := &benchEnv{client: netns.New(b, "client"), node: netns.New(b, "node"), server: netns.New(b, "server")}
	e.node.EnableForwarding()
	netns.Veth(b, e.client, "eth0", e.node, "eth0")
	netns.Veth(b, e.node, "vsrv", e.server, "eth0")
	e.client.AddAddr("eth0", benchClientIP.String()+"/24")
	e.node.AddAddr("eth0", benchNodeIP.String()+"/24")
	e.node.AddAddr("vsrv", benchGatewayIP.String()+"/24")
	e.server.AddAddr("eth0", benchServerA.String()+"/24")
	e.server.AddAddr("eth0", benchServerB.String()+"/24")
	e.client.AddRoute("default", "via", benchNodeIP.String())
	e.server.AddRoute("default", "via", benchGatewayIP.String())
	// Tens of thousands of short connections per run: let the ends that
	// connect reuse ports in TIME_WAIT and use the whole port range.
	for _, ns := range []*netns.NS{e.client, e.node} {
		ns.Sysctl("net.ipv4.tcp_tw_reuse", "1")
		ns.Sysctl("net.ipv4.ip_local_port_range", "1024 65535")
	}
	e.server.Serve(benchIDA, []netip.Addr{benchServerA}, []uint16{benchWhoPort})
	e.server.Serve(benchIDB, []netip.Addr{benchServerB}, []uint16{benchWhoPort})
	benchServe(b, e.server, benchIDA, benchServerA)
	return e
}

// benchServe starts the sink and echo servers of identity id on addr in
// ns. Each greets a new connection with an answer line (netns.Answer:
// who it is, where it was reached, whom it sees); the sink then reads
// until EOF and answers the number of bytes read, the echo sends back
// everything it reads. They stop, and their connections are closed, when
// tb ends.
func benchServe(tb testing.TB, ns *netns.NS, id string, addr netip.Addr) {
	tb.Helper()
	var (
		lns   []net.Listener
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns = map[net.Conn]struct{}{}
	)
	err := ns.Do(func() error {
		for _, port := range []uint16{benchSinkPort, benchEchoPort} {
			ln, err := net.Listen("tcp4", netip.AddrPortFrom(addr, port).String())
			if err != nil {
				return fmt.Errorf("listen on %s:%d: %w", addr, port, err)
			}
			lns = append(lns, ln)
		}
		return nil
	})
	stop := func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
		mu.Lock()
		for c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}
	if err != nil {
		stop()
		tb.Fatalf("bench servers in %s: %v", ns, err)
	}
	tb.Cleanup(stop)
	for i, ln := range lns {
		handle := benchServeSink
		if i == 1 {
			handle = benchServeEcho
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c, err := ln.Accept()
				if err != nil {
					return // closed
				}
				mu.Lock()
				conns[c] = struct{}{}
				mu.Unlock()
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer func() {
						mu.Lock()
						delete(conns, c)
						mu.Unlock()
						_ = c.Close()
					}()
					a := netns.Answer{Server: id, Network: "tcp",
						Local:  c.LocalAddr().(*net.TCPAddr).AddrPort(),
						Remote: c.RemoteAddr().(*net.TCPAddr).AddrPort()}
					if _, err := io.WriteString(c, a.String()+"\n"); err != nil {
						return
					}
					handle(c)
				}()
			}
		}()
	}
}

// benchServeSink reads c until EOF and answers the number of bytes read.
func benchServeSink(c net.Conn) {
	buf := make([]byte, 256<<10)
	var n int64
	for {
		m, err := c.Read(buf)
		n += int64(m)
		if errors.Is(err, io.EOF) {
			_, _ = fmt.Fprintf(c, "%d\n", n)
			return
		}
		if err != nil {
			return
		}
	}
}

// benchServeEcho writes back what it reads from c until EOF.
func benchServeEcho(c net.Conn) {
	buf := make([]byte, 64<<10)
	for {
		m, err := c.Read(buf)
		if m > 0 {
			if _, werr := c.Write(buf[:m]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// benchPath is one way from the client to benchServerA's servers.
type benchPath struct {
	name string
	// sink, echo and who are where the client connects for each server.
	sink, echo, who netip.AddrPort
	// proxied is set when the server sees the node (benchGatewayIP) as
	// the client, not the client itself.
	proxied bool
	// start starts what serves the path for b (nil: nothing to start).
	start func(b *testing.B, e *benchEnv)
}

// benchPaths returns the paths compared side by side, in the order they
// run: direct first, as the reference of the others.
func benchPaths() []benchPath {
	at := func(a netip.Addr, offset uint16) (sink, echo, who netip.AddrPort) {
		return netip.AddrPortFrom(a, benchSinkPort+offset), netip.AddrPortFrom(a, benchEchoPort+offset), netip.AddrPortFrom(a, benchWhoPort+offset)
	}
	direct := benchPath{name: "direct"}
	direct.sink, direct.echo, direct.who = at(benchServerA, 0)
	us := benchPath{name: "userspace", proxied: true, start: benchStartProxierProcess}
	us.sink, us.echo, us.who = at(benchPerfIP, 0)
	in := benchPath{name: "userspace-inproc", proxied: true, start: benchStartPerfProxier}
	in.sink, in.echo, in.who = at(benchPerfIP, 0)
	ha := benchPath{name: "haproxy", proxied: true, start: benchStartHAProxy}
	ha.sink, ha.echo, ha.who = at(benchNodeIP, benchHAProxyOffset)
	return []benchPath{direct, us, in, ha}
}

// checkGreeting returns an error unless line is the answer of
// benchServerA reached on its own address and port port, seeing the
// client, or the node when the path is proxied.
func (p benchPath) checkGreeting(line string, port uint16) error {
	a, err := netns.ParseAnswer(line)
	if err != nil {
		return err
	}
	src := benchClientIP
	if p.proxied {
		src = benchGatewayIP
	}
	if a.Server != benchIDA || a.Local != netip.AddrPortFrom(benchServerA, port) || a.Remote.Addr() != src {
		return fmt.Errorf("%s path: answer %q, want %s on %s:%d seeing %s", p.name, strings.TrimSpace(line), benchIDA, benchServerA, port, src)
	}
	return nil
}

// benchEndpoint returns a ready endpoint at a.
func benchEndpoint(a netip.Addr) *model.Endpoint {
	return &model.Endpoint{IPs: model.IPSet{V4: []string{a.String()}}, Ready: true, Serving: true}
}

// benchService returns a ClusterIP service bench/name on ip with ports
// (name, port, target port) and one endpoint at ep.
func benchService(name string, ip, ep netip.Addr, ports ...model.PortMapping) *model.ServiceEndpoints {
	svc := &model.Service{Namespace: "bench", Name: name, Type: "ClusterIP",
		IPs: model.ServiceIPs{ClusterIPs: model.IPSet{V4: []string{ip.String()}}}}
	for _, p := range ports {
		svc.Ports = append(svc.Ports, &p)
	}
	return &model.ServiceEndpoints{Service: svc, Endpoints: []*model.Endpoint{benchEndpoint(ep)}}
}

// benchPerfService is the service of the data-path benchmarks: the three
// servers of benchServerA on benchPerfIP, on their own ports.
func benchPerfService() *model.ServiceEndpoints {
	return benchService("perf", benchPerfIP, benchServerA,
		model.PortMapping{Name: "sink", Protocol: model.TCP, Port: benchSinkPort, TargetPort: benchSinkPort},
		model.PortMapping{Name: "echo", Protocol: model.TCP, Port: benchEchoPort, TargetPort: benchEchoPort},
		model.PortMapping{Name: "who", Protocol: model.TCP, Port: benchWhoPort, TargetPort: benchWhoPort})
}

// benchPlatform wraps the proxier's platform to count and time what a
// Sync spends adding addresses (netlink) and in the namespace (opening
// sockets; dials too, but the benchmarks read it only around a Sync).
type benchPlatform struct {
	platform
	addrNs, addrCalls, inNs, inCalls atomic.Int64
}

func (p *benchPlatform) addAddress(a netip.Addr) error {
	start := time.Now()
	err := p.platform.addAddress(a)
	p.addrNs.Add(int64(time.Since(start)))
	p.addrCalls.Add(1)
	return err
}

func (p *benchPlatform) in(fn func() error) error {
	start := time.Now()
	err := p.platform.in(fn)
	p.inNs.Add(int64(time.Since(start)))
	p.inCalls.Add(1)
	return err
}

// reset sets the counters to zero.
func (p *benchPlatform) reset() {
	for _, c := range []*atomic.Int64{&p.addrNs, &p.addrCalls, &p.inNs, &p.inCalls} {
		c.Store(0)
	}
}

// newBenchProxier starts a proxier in the node namespace, its platform
// wrapped in a benchPlatform; it is closed and its interface removed when
// b ends.
func newBenchProxier(b *testing.B, e *benchEnv) (*Sink, *benchPlatform) {
	b.Helper()
	cfg := Config{ServiceProxyName: "bench", NetNS: e.node.Path(), Options: Options{NodeIPs: []netip.Addr{benchNodeIP}}}
	p, err := New(context.Background(), cfg)
	if err != nil {
		b.Fatalf("start the proxier: %v", err)
	}
	b.Cleanup(func() {
		p.Close()
		if err := Cleanup(context.Background(), cfg); err != nil {
			b.Errorf("proxier cleanup: %v", err)
		}
	})
	bp := &benchPlatform{platform: p.plat}
	p.plat, p.sock = bp, sockets{bp}
	return p, bp
}

// benchStartPerfProxier starts a proxier serving benchPerfService in the
// benchmark's process.
func benchStartPerfProxier(b *testing.B, e *benchEnv) {
	b.Helper()
	p, _ := newBenchProxier(b, e)
	se := benchPerfService()
	p.Reset()
	p.Update(se.Service.Key(), nil, se)
	if err := p.Sync(); err != nil {
		b.Fatalf("proxier sync: %v", err)
	}
}

// benchProxierEnv, set to 1, makes TestBenchProxierProcess serve.
const benchProxierEnv = "KPNG_BENCH_PROXIER"

// benchProxierReady is the line the proxier process prints once it
// listens.
const benchProxierReady = "kpng-bench-proxier ready"

// TestBenchProxierProcess is not a test but the proxier process of the
// data-path benchmarks: benchStartProxierProcess runs this test binary
// in the node namespace with KPNG_BENCH_PROXIER=1, and it serves
// benchPerfService there (Config.NetNS unset: the namespace it was
// started in, as a deployed proxier) until its standard input closes.
// Without the variable it skips.
func TestBenchProxierProcess(t *testing.T) {
	if os.Getenv(benchProxierEnv) != "1" {
		t.Skip("the proxier process of the userspace benchmarks: they run it")
	}
	cfg := Config{ServiceProxyName: "bench", Options: Options{NodeIPs: []netip.Addr{benchNodeIP}}}
	p, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("start the proxier: %v", err)
	}
	defer func() {
		p.Close()
		if err := Cleanup(context.Background(), cfg); err != nil {
			t.Errorf("proxier cleanup: %v", err)
		}
	}()
	se := benchPerfService()
	p.Reset()
	p.Update(se.Service.Key(), nil, se)
	if err := p.Sync(); err != nil {
		t.Fatalf("proxier sync: %v", err)
	}
	fmt.Println(benchProxierReady)
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// benchStartProxierProcess runs TestBenchProxierProcess of this test
// binary in the node namespace and waits until it listens; it stops it
// (closing its standard input, then killing it if it has not ended
// within 10 s) when b ends.
func benchStartProxierProcess(b *testing.B, e *benchEnv) {
	b.Helper()
	exe, err := os.Executable()
	if err != nil {
		b.Fatalf("the test binary: %v", err)
	}
	cmd := exec.Command("ip", "netns", "exec", e.node.Name, exe, "-test.run=^TestBenchProxierProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), benchProxierEnv+"=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatalf("proxier process: %v", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatalf("proxier process: %v", err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatalf("start the proxier process: %v", err)
	}
	ready := make(chan bool, 1)
	waitErr := make(chan error, 1)
	var out strings.Builder // what it printed before being ready
	go func() {
		sc := bufio.NewScanner(stdout)
		isReady := false
		for sc.Scan() {
			switch {
			case !isReady && sc.Text() == benchProxierReady:
				isReady = true
				ready <- true
			case !isReady:
				out.WriteString(sc.Text() + "\n")
			}
		}
		if !isReady {
			ready <- false
		}
		waitErr <- cmd.Wait()
	}()
	stop := sync.OnceValue(func() error {
		_ = stdin.Close()
		select {
		case err := <-waitErr:
			return err
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-waitErr
			return errors.New("did not end within 10 s of its input closing: killed")
		}
	})
	b.Cleanup(func() {
		if err := stop(); err != nil && !b.Failed() {
			b.Errorf("proxier process: %v: %s", err, stderr.String())
		}
	})
	select {
	case ok := <-ready:
		if !ok {
			err := stop()
			b.Fatalf("proxier process ended before listening: %v: %s%s", err, out.String(), stderr.String())
		}
	case <-time.After(30 * time.Second):
		b.Fatalf("proxier process not ready within 30 s")
	}
}

// benchStartHAProxy starts HAProxy in the node namespace, in TCP mode, with a
// frontend for each server of benchServerA on the node's address and the
// server's port plus benchHAProxyOffset, each with that server as its
// only backend; it waits until HAProxy answers, and kills it when b ends.
// Without the haproxy command, b is skipped (failed with
// KPNG_REQUIRE_PRIVILEGED=1).
func benchStartHAProxy(b *testing.B, e *benchEnv) {
	b.Helper()
	if _, err := exec.LookPath("haproxy"); err != nil {
		const msg = "haproxy is not installed (apt-get install haproxy, or run hack/bench-userspace.sh): the haproxy path is not measured"
		if os.Getenv(netns.RequireEnv) == "1" {
			b.Fatalf("%s (%s=1 forbids skipping)", msg, netns.RequireEnv)
		}
		b.Skip(msg)
	}
	var cfg strings.Builder
	cfg.WriteString("global\n    maxconn 4096\n\ndefaults\n    mode tcp\n    timeout connect 5s\n    timeout client 1m\n    timeout server 1m\n")
	for _, port := range []uint16{benchSinkPort, benchEchoPort, benchWhoPort} {
		fmt.Fprintf(&cfg, "\nlisten port-%d\n    bind %s\n    server s %s\n", port,
			netip.AddrPortFrom(benchNodeIP, port+benchHAProxyOffset), netip.AddrPortFrom(benchServerA, port))
	}
	file := filepath.Join(b.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(file, []byte(cfg.String()), 0o644); err != nil {
		b.Fatalf("haproxy config: %v", err)
	}
	// ip netns exec execs haproxy: the process is haproxy itself.
	cmd := exec.Command("ip", "netns", "exec", e.node.Name, "haproxy", "-f", file, "-db")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		b.Fatalf("start haproxy: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var stopped bool
	b.Cleanup(func() {
		if !stopped {
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	who := netip.AddrPortFrom(benchNodeIP, benchWhoPort+benchHAProxyOffset)
	for deadline := time.Now().Add(10 * time.Second); ; {
		select {
		case err := <-exited:
			stopped = true
			b.Fatalf("haproxy exited: %v: %s", err, out.String())
		default:
		}
		a, err := e.client.Ask("tcp", who, netns.AskOptions{Timeout: time.Second})
		if err == nil {
			if a.Server != benchIDA {
				b.Fatalf("haproxy on %s: answered by %s, want %s", who, a, benchIDA)
			}
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("haproxy does not answer on %s: %v", who, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// benchSideBySide runs fn for each path as a sub-benchmark of b, in the order
// of benchPaths, and gives fn the figures of the paths measured before
// in this call of b (by path name), for ratios measured in one run. Run
// the benchmarks with -count=1 and repeat the command for more runs (as
// hack/bench-userspace.sh does): with -count=N, Go runs each
// sub-benchmark N times in a row, and the ratios divide by the last of
// the N direct figures.
func benchSideBySide(b *testing.B, e *benchEnv, fn func(b *testing.B, p benchPath, before map[string]float64) float64) {
	before := map[string]float64{}
	for _, p := range benchPaths() {
		b.Run(p.name, func(b *testing.B) {
			if p.start != nil {
				p.start(b, e)
			}
			before[p.name] = fn(b, p, before)
		})
	}
}

// benchReportRatios reports v / before[ref] for each ref measured already but
// the path itself, as "ratio-to-<ref>".
func benchReportRatios(b *testing.B, p benchPath, v float64, before map[string]float64) {
	for _, ref := range []string{"direct", "userspace"} {
		if d, ok := before[ref]; ok && ref != p.name && d > 0 {
			b.ReportMetric(v/d, "ratio-to-"+ref)
		}
	}
}

// benchDial connects from ns to dst and reads the server's greeting.
func benchDial(ns *netns.NS, dst netip.AddrPort) (*net.TCPConn, *bufio.Reader, string, error) {
	var c net.Conn
	err := ns.Do(func() (err error) {
		c, err = net.DialTimeout("tcp4", dst.String(), 5*time.Second)
		return err
	})
	if err != nil {
		return nil, nil, "", fmt.Errorf("connect from %s to %s: %w", ns, dst, err)
	}
	r := bufio.NewReader(c)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := r.ReadString('\n')
	if err != nil {
		c.Close()
		return nil, nil, "", fmt.Errorf("greeting of %s: %w", dst, err)
	}
	_ = c.SetReadDeadline(time.Time{})
	return c.(*net.TCPConn), r, line, nil
}

// benchChunk is what the throughput benchmark writes per iteration.
const benchChunk = 1 << 20

// BenchmarkUserspaceThroughput sends one TCP stream to the sink server on
// each path: 16 MiB of warm-up, then 1 MiB per iteration, then a
// half-close; the sink answers the number of bytes it read, which must be
// all of them. Gbit/s is the payload over the time from the first timed
// write to that answer; ratio-to-direct divides it by the direct path's
// figure of the same run, ratio-to-userspace (in the paths after it) by
// the userspace path's.
func BenchmarkUserspaceThroughput(b *testing.B) {
	e := newBenchEnv(b)
	benchSideBySide(b, e, func(b *testing.B, p benchPath, before map[string]float64) float64 {
		c, r, greeting, err := benchDial(e.client, p.sink)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		if err := p.checkGreeting(greeting, benchSinkPort); err != nil {
			b.Fatal(err)
		}
		buf := make([]byte, benchChunk)
		const warmup = 16 * benchChunk
		for range warmup / benchChunk {
			if _, err := c.Write(buf); err != nil {
				b.Fatalf("write: %v", err)
			}
		}
		var sent int64
		start := time.Now()
		for b.Loop() {
			if _, err := c.Write(buf); err != nil {
				b.Fatalf("write: %v", err)
			}
			sent += benchChunk
		}
		if err := c.CloseWrite(); err != nil {
			b.Fatalf("half-close: %v", err)
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		line, err := r.ReadString('\n')
		elapsed := time.Since(start)
		if err != nil {
			b.Fatalf("the sink's count: %v", err)
		}
		if got, err := strconv.ParseInt(strings.TrimSpace(line), 10, 64); err != nil || got != sent+warmup {
			b.Fatalf("the sink read %q bytes, want %d", line, sent+warmup)
		}
		gbps := float64(sent) * 8 / elapsed.Seconds() / 1e9
		b.ReportMetric(gbps, "Gbit/s")
		benchReportRatios(b, p, gbps, before)
		return gbps
	})
}

// benchRequest is the size of a request and of its reply in
// BenchmarkUserspaceRequestResponse.
const benchRequest = 32

// BenchmarkUserspaceRequestResponse sends, on one long-lived connection
// to the echo server, a 32-byte request per iteration and waits for its
// 32-byte echo, which must be the request. p50-us and p99-us are the
// round trips' percentiles (after 200 untimed ones); added-p50-us is the
// p50 minus the direct path's p50 of the same run, vs-userspace-p50-us
// (in the paths after it) the p50 minus the userspace path's.
func BenchmarkUserspaceRequestResponse(b *testing.B) {
	e := newBenchEnv(b)
	benchSideBySide(b, e, func(b *testing.B, p benchPath, before map[string]float64) float64 {
		c, r, greeting, err := benchDial(e.client, p.echo)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		if err := p.checkGreeting(greeting, benchEchoPort); err != nil {
			b.Fatal(err)
		}
		req, resp := make([]byte, benchRequest), make([]byte, benchRequest)
		roundTrip := func(i uint64) (time.Duration, error) {
			binary.BigEndian.PutUint64(req, i)
			start := time.Now()
			if _, err := c.Write(req); err != nil {
				return 0, fmt.Errorf("request %d: %w", i, err)
			}
			if _, err := io.ReadFull(r, resp); err != nil {
				return 0, fmt.Errorf("reply %d: %w", i, err)
			}
			took := time.Since(start)
			if !bytes.Equal(req, resp) {
				return 0, fmt.Errorf("reply %d is %x, want %x", i, resp, req)
			}
			return took, nil
		}
		var i uint64
		for range 200 {
			if _, err := roundTrip(i); err != nil {
				b.Fatal(err)
			}
			i++
		}
		ds := make([]time.Duration, 0, 1<<16)
		for b.Loop() {
			d, err := roundTrip(i)
			if err != nil {
				b.Fatal(err)
			}
			ds = append(ds, d)
			i++
		}
		p50 := benchMicros(benchQuantile(ds, 0.5))
		b.ReportMetric(p50, "p50-us")
		b.ReportMetric(benchMicros(benchQuantile(ds, 0.99)), "p99-us")
		if d, ok := before["direct"]; ok && p.name != "direct" {
			b.ReportMetric(p50-d, "added-p50-us")
		}
		if u, ok := before["userspace"]; ok && p.name != "userspace" {
			b.ReportMetric(p50-u, "vs-userspace-p50-us")
		}
		return p50
	})
}

// BenchmarkUserspaceConnect opens, per iteration, a new TCP connection to
// the identity server, sends a line, reads the answer (which must come
// from benchServerA, on its address, seeing the client or the node) and
// closes it, from 1 and from 4 client goroutines at a time, each on its
// own thread in the client namespace. conn/s is the connections over the
// wall time from the first to the end of the last; ratio-to-direct divides
// it by the direct path's figure of the same run, ratio-to-userspace (in
// the paths after it) by the userspace path's.
func BenchmarkUserspaceConnect(b *testing.B) {
	e := newBenchEnv(b)
	for _, clients := range []int{1, 4} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			benchSideBySide(b, e, func(b *testing.B, p benchPath, before map[string]float64) float64 {
				rate := benchConnectRate(b, e, p, clients)
				b.ReportMetric(rate, "conn/s")
				benchReportRatios(b, p, rate, before)
				return rate
			})
		})
	}
}

// benchConnectRate runs b's iterations as connections of p from clients
// workers and returns the connections per second.
func benchConnectRate(b *testing.B, e *benchEnv, p benchPath, clients int) float64 {
	tokens := make(chan struct{}, clients)
	errs := make(chan error, clients)
	var failed atomic.Bool
	for range clients {
		go func() {
			errs <- e.client.Do(func() error {
				var first error
				for range tokens {
					if first != nil {
						continue // drain, so that the loop ends
					}
					if first = benchConnectOnce(p); first != nil {
						failed.Store(true)
					}
				}
				return first
			})
		}()
	}
	n := 0
	start := time.Now()
	for b.Loop() {
		if failed.Load() {
			break
		}
		tokens <- struct{}{}
		n++
	}
	close(tokens)
	var err error
	for range clients {
		err = errors.Join(err, <-errs)
	}
	elapsed := time.Since(start)
	if err != nil {
		b.Fatal(err)
	}
	return float64(n) / elapsed.Seconds()
}

// benchConnectOnce opens one connection to p's identity server, asks and
// checks the answer, and closes it. It runs in the client namespace.
func benchConnectOnce(p benchPath) error {
	c, err := net.DialTimeout("tcp4", p.who.String(), 5*time.Second)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", p.who, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "who are you?\n"); err != nil {
		return fmt.Errorf("request to %s: %w", p.who, err)
	}
	var buf [128]byte
	n := 0
	for n == 0 || buf[n-1] != '\n' {
		m, err := c.Read(buf[n:])
		n += m
		if err != nil || n == len(buf) {
			return fmt.Errorf("answer of %s: %q, %v", p.who, buf[:n], err)
		}
	}
	a, err := netns.ParseAnswer(string(buf[:n]))
	if err != nil {
		return fmt.Errorf("answer of %s: %w", p.who, err)
	}
	src := benchClientIP
	if p.proxied {
		src = benchGatewayIP
	}
	if a.Server != benchIDA || a.Local != netip.AddrPortFrom(benchServerA, benchWhoPort) || a.Remote.Addr() != src {
		return fmt.Errorf("%s path: answer %s, want %s on %s:%d seeing %s", p.name, a, benchIDA, benchServerA, benchWhoPort, src)
	}
	return nil
}

// benchClusterIP returns the cluster IP of scale service i: 10.96.0.0/12
// from 10.96.1.1, skipping .0 and .255 (as the nft benchmarks).
func benchClusterIP(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(96 + i/(250*256)), byte(1 + i/250%256), byte(1 + i%250)})
}

// benchScaleService returns scale service i: bench/svc-NNNNN on
// benchClusterIP(i), TCP 80 to the identity server's port of
// benchServerA, or of benchServerB when onB.
func benchScaleService(i int, onB bool) *model.ServiceEndpoints {
	ep := benchServerA
	if onB {
		ep = benchServerB
	}
	return benchService(fmt.Sprintf("svc-%05d", i), benchClusterIP(i), ep,
		model.PortMapping{Name: "who", Protocol: model.TCP, Port: 80, TargetPort: benchWhoPort})
}

// expectWho fails b unless a connection from the client to service i is
// answered by the identity server id on server.
func (e *benchEnv) expectWho(b *testing.B, i int, id string, server netip.Addr) {
	b.Helper()
	dst := netip.AddrPortFrom(benchClusterIP(i), 80)
	a, err := e.client.Ask("tcp", dst, netns.AskOptions{})
	if err != nil {
		b.Fatalf("service %d: %v", i, err)
	}
	if a.Server != id || a.Local != netip.AddrPortFrom(server, benchWhoPort) || a.Remote.Addr() != benchGatewayIP {
		b.Fatalf("service %d (%s): answer %s, want %s on %s:%d seeing the node", i, dst, a, id, server, benchWhoPort)
	}
}

// benchMemory is what the process holds at one moment.
type benchMemory struct {
	heap, stack, rss uint64
	fds, goroutines  int
}

// benchReadMemory returns the live heap and the goroutine stacks after two
// GCs, the RSS (VmRSS) after returning free memory to the OS, the open
// file descriptors and the goroutines.
func benchReadMemory(tb testing.TB) benchMemory {
	tb.Helper()
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m := benchMemory{heap: ms.HeapAlloc, stack: ms.StackInuse, goroutines: runtime.NumGoroutine()}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		tb.Fatalf("read /proc/self/status: %v", err)
	}
	for line := range strings.Lines(string(status)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				tb.Fatalf("VmRSS %q: %v", v, err)
			}
			m.rss = kb << 10
		}
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		tb.Fatalf("read /proc/self/fd: %v", err)
	}
	m.fds = len(fds) - 1 // the directory being read
	return m
}

// benchRaiseNoFile raises the soft RLIMIT_NOFILE to at least n until tb
// ends, and the hard limit too when it is lower and the process may.
func benchRaiseNoFile(tb testing.TB, n uint64) {
	tb.Helper()
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		tb.Fatalf("getrlimit: %v", err)
	}
	if old.Cur >= n {
		return
	}
	lim := syscall.Rlimit{Cur: n, Max: max(old.Max, n)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		// No CAP_SYS_RESOURCE (a container): the hard limit stays.
		if old.Max < n {
			tb.Fatalf("open file limit %d, need %d: %v (raise the hard limit: ulimit -Hn %d)", old.Max, n, err, n)
		}
		lim.Max = old.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			tb.Fatalf("raise the open file limit to %d: %v", n, err)
		}
	}
	tb.Cleanup(func() { _ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old) })
}

// BenchmarkUserspaceScale gives a new proxier 100, then 10,000 ClusterIP
// services of one TCP port (80 to the identity server of benchServerA),
// and syncs once: first-sync-ms is that Sync, after which every service
// has its address on the proxier's interface and listens; addr-ms is the
// part spent adding the addresses over netlink, listen-ms the part spent
// opening the sockets (in the node namespace). The first, middle and last
// services must then answer through the proxy. Memory is measured
// afterwards, as the growth since before the proxier was made (heap-MiB:
// live heap, with the model objects the benchmark holds too; stack-MiB:
// goroutine stacks; rss-MiB; fds; goroutines) and the process's totals
// (rss-total-MiB, fds-total, which count the benchmark's servers too).
//
// Each iteration then moves one service (services visited in a scattered
// order) from benchServerA to benchServerB or back: an Update with the
// new endpoint list, then Sync. change-p50-us and change-p99-us are over
// those Update+Sync calls. Each change must keep the service's listening
// socket, open none, add no address, and send the next connection to the
// new endpoint (checked untimed, through the proxy). Use -benchtime=Nx.
func BenchmarkUserspaceScale(b *testing.B) {
	// 10,000 listening sockets, and the benchmark's own.
	benchRaiseNoFile(b, 16384)
	for _, n := range []int{100, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			e := newBenchEnv(b)
			m0 := benchReadMemory(b)
			p, bp := newBenchProxier(b, e)
			state := make([]*model.ServiceEndpoints, n)
			onB := make([]bool, n)
			p.Reset()
			for i := range n {
				state[i] = benchScaleService(i, false)
				p.Update(state[i].Service.Key(), nil, state[i])
			}
			bp.reset()
			start := time.Now()
			err := p.Sync()
			firstSync := time.Since(start)
			if err != nil {
				b.Fatalf("first sync: %v", err)
			}
			if got := bp.addrCalls.Load(); got != int64(n) {
				b.Fatalf("first sync added %d addresses, want %d", got, n)
			}
			if got := bp.inCalls.Load(); got != int64(n) {
				b.Fatalf("first sync opened %d sockets, want %d", got, n)
			}
			addrMs, listenMs := float64(bp.addrNs.Load())/1e6, float64(bp.inNs.Load())/1e6
			for _, i := range []int{0, n / 2, n - 1} {
				e.expectWho(b, i, benchIDA, benchServerA)
			}
			m1 := benchReadMemory(b)
			runtime.KeepAlive(state)

			listener := func(i int) *net.TCPListener {
				k := frontendKey{proto: model.TCP, addr: netip.AddrPortFrom(benchClusterIP(i), 80)}
				p.mu.Lock()
				f := p.frontends[k]
				p.mu.Unlock()
				if f == nil {
					b.Fatalf("service %d: no frontend", i)
				}
				f.mu.Lock()
				defer f.mu.Unlock()
				return f.ln
			}
			var ds []time.Duration
			i := 0
			for b.Loop() {
				idx := i * 7919 % n // coprime with n: every service in turn
				onB[idx] = !onB[idx]
				prev := state[idx]
				state[idx] = benchScaleService(idx, onB[idx])
				ln := listener(idx)
				bp.reset()
				start := time.Now()
				p.Update(prev.Service.Key(), prev, state[idx])
				err := p.Sync()
				ds = append(ds, time.Since(start))
				if err != nil {
					b.Fatalf("change %d: %v", i, err)
				}
				b.StopTimer()
				if got, addrs := bp.inCalls.Load(), bp.addrCalls.Load(); got != 0 || addrs != 0 || listener(idx) != ln {
					b.Fatalf("change %d: %d sockets opened, %d addresses added, listener kept: %v; want nothing but the route changed", i, got, addrs, listener(idx) == ln)
				}
				id, server := benchIDA, benchServerA
				if onB[idx] {
					id, server = benchIDB, benchServerB
				}
				e.expectWho(b, idx, id, server)
				b.StartTimer()
				i++
			}
			b.ReportMetric(float64(firstSync)/1e6, "first-sync-ms")
			b.ReportMetric(addrMs, "addr-ms")
			b.ReportMetric(listenMs, "listen-ms")
			b.ReportMetric(benchMicros(benchQuantile(ds, 0.5)), "change-p50-us")
			b.ReportMetric(benchMicros(benchQuantile(ds, 0.99)), "change-p99-us")
			b.ReportMetric(float64(m1.heap-min(m0.heap, m1.heap))/(1<<20), "heap-MiB")
			b.ReportMetric(float64(m1.stack-min(m0.stack, m1.stack))/(1<<20), "stack-MiB")
			b.ReportMetric(float64(m1.rss-min(m0.rss, m1.rss))/(1<<20), "rss-MiB")
			b.ReportMetric(float64(m1.rss)/(1<<20), "rss-total-MiB")
			b.ReportMetric(float64(m1.fds-m0.fds), "fds")
			b.ReportMetric(float64(m1.fds), "fds-total")
			b.ReportMetric(float64(m1.goroutines-m0.goroutines), "goroutines")
		})
	}
}

// benchQuantile returns the q-quantile of ds (nearest rank), 0 for none.
func benchQuantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))]
}

// benchMicros returns d in microseconds.
func benchMicros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
