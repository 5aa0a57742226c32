//go:build linux

// Command kpng-sidebyside runs kube-proxy and `kpng kube … to-local
// to-<backend>` one after the other, each in a network namespace of its
// own, on the same Services and EndpointSlices in the test control plane
// (a real kube-apiserver and etcd), and prints what each took.
//
// --mode=iptables (kube-proxy --proxy-mode=iptables, kpng to-iptables):
// cold start to the first complete sync, one endpoint change and one
// service added and deleted (from the API call to the end of the sync
// that applied it, the sync's own duration and the bytes handed to
// iptables-restore), the latency of a connection's first packet at a
// small and at the full number of services, and memory.
// hack/bench-iptables.sh builds the binaries and runs it.
//
// --mode=nftables (kube-proxy --proxy-mode=nftables, kpng to-nft): cold
// start, then for each of many endpoint changes the time from the
// EndpointSlice update's API call to the new endpoint's map element being
// committed in the kernel, as the namespace's nftables notifications
// (netlink) show it, and kpng's path through its own log: watch event,
// round, transaction. hack/bench-e2e-nft.sh builds the binaries and runs
// it.
//
// The results go to docs/benchmarks.md. Both proxiers handle the services
// without a service-proxy-name (kpng runs without one): the same
// objects, loaded once.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"sigs.k8s.io/kpng/internal/benchnode"
	"sigs.k8s.io/kpng/internal/controlplane"
	"sigs.k8s.io/kpng/internal/netns"
	procfs "sigs.k8s.io/kpng/internal/proc"
)

// config is the command line.
type config struct {
	kubeProxy, kpng string
	mode            string
	variants        []string
	services, small int
	endpoints       int
	changes         int
	// kubeProxyChanges, when not negative, replaces changes for
	// kube-proxy in the nftables mode.
	kubeProxyChanges int
	probes           int
	coldTimeout      time.Duration
	shimDir          string
	logDir           string
	// nftables mode only.
	proxiers      []string
	quiet         time.Duration
	changeTimeout time.Duration
	kpngV         int
	// swapRules: after the interleaved first packet, probe again with the
	// two proxiers' rulesets swapped between their namespaces.
	swapRules bool
}

func main() {
	var cfg config
	var variants, proxiers string
	flag.StringVar(&cfg.kubeProxy, "kube-proxy", "", "the kube-proxy binary")
	flag.StringVar(&cfg.kpng, "kpng", "", "the kpng binary")
	flag.StringVar(&cfg.mode, "mode", "iptables", "iptables (kube-proxy --proxy-mode=iptables, kpng to-iptables) or nftables (kube-proxy --proxy-mode=nftables, kpng to-nft: API call to the element in the kernel)")
	flag.StringVar(&variants, "variants", "legacy,nft", "the iptables variants, in order (iptables mode)")
	flag.StringVar(&proxiers, "proxiers", "kpng,kube-proxy", "the proxiers, in order (nftables mode)")
	flag.DurationVar(&cfg.quiet, "quiet", 1500*time.Millisecond, "the time without changes before each endpoint change, once the previous one is in the kernel and synced (nftables mode; kube-proxy's minimum sync period is 1 s)")
	flag.DurationVar(&cfg.changeTimeout, "change-timeout", 2*time.Minute, "how long to wait for one endpoint change to reach the kernel (nftables mode)")
	flag.BoolVar(&cfg.swapRules, "swap-rules", false, "after the interleaved first packet, save both proxiers' rulesets to --log-dir, load each into the other's namespace and probe in turn again (nftables mode, two proxiers): whether a difference follows the rules or the namespace")
	flag.IntVar(&cfg.kpngV, "kpng-v", 2, "kpng's log verbosity (nftables mode; its breakdown needs 2 or more)")
	flag.IntVar(&cfg.services, "services", 10000, "services in the full state")
	flag.IntVar(&cfg.small, "small", 100, "services in the small state (first-packet latency)")
	flag.IntVar(&cfg.endpoints, "endpoints", 10, "endpoints per service")
	flag.IntVar(&cfg.changes, "changes", 10, "endpoint changes measured")
	flag.IntVar(&cfg.kubeProxyChanges, "kube-proxy-changes", -1, "endpoint changes measured with kube-proxy (nftables mode; its syncs take seconds each at 10,000 services); negative: --changes")
	flag.IntVar(&cfg.probes, "probes", 300, "connections whose first packet is timed")
	flag.DurationVar(&cfg.coldTimeout, "cold-timeout", 10*time.Minute, "how long to wait for a proxier's first complete sync")
	flag.StringVar(&cfg.logDir, "log-dir", filepath.Join(os.TempDir(), "kpng-sidebyside"), "where the proxiers' logs go")
	flag.Parse()
	cfg.variants = strings.Split(variants, ",")
	cfg.proxiers = strings.Split(proxiers, ",")
	if cfg.kubeProxy == "" || cfg.kpng == "" {
		fmt.Fprintln(os.Stderr, "usage: kpng-sidebyside --kube-proxy=PATH --kpng=PATH [flags]")
		os.Exit(2)
	}
	if err := run(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "kpng-sidebyside:", err)
		os.Exit(1)
	}
}

// logf prints progress on stderr.
func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// nodeName and nodeIP are the Node both proxiers run as.
const nodeName = "node-a"

var nodeIP = benchnode.NodeIP

// ns is the namespace of the benchmark's objects.
const ns = "bench"

func run(cfg config) error {
	dir := os.Getenv("KPNG_CONTROLPLANE_DIR")
	if dir == "" {
		return errors.New("KPNG_CONTROLPLANE_DIR is not set (hack/bench-iptables.sh and hack/bench-e2e-nft.sh set it)")
	}
	if cfg.mode != "iptables" && cfg.mode != "nftables" {
		return fmt.Errorf("--mode=%q: want iptables or nftables", cfg.mode)
	}
	shim, err := os.MkdirTemp("", "kpng-sidebyside-shim-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(shim)
	cfg.shimDir = shim
	logf("starting the control plane")
	cp, err := controlplane.Start(controlplane.WithBinaryDir(dir))
	if err != nil {
		return fmt.Errorf("control plane: %w", err)
	}
	defer cp.Stop()
	// The loader's own client: the control plane's allows 50 requests a
	// second, 25 services a second (a service and its slice each), which
	// made loading 50,000 services take over half an hour.
	rc := cp.RESTConfig()
	rc.QPS, rc.Burst = 5000, 10000
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	ctx := context.Background()
	if _, err := c.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace %s: %w", ns, err)
	}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, Labels: map[string]string{"kubernetes.io/hostname": nodeName}}}
	node, err = c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create node %s: %w", nodeName, err)
	}
	node.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: nodeIP.String()}}
	if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("node %s status: %w", nodeName, err)
	}
	b := &bench{cfg: cfg, cp: cp, c: c}
	if cfg.mode == "nftables" {
		return runNFTables(b)
	}
	return runIPTables(b)
}

// bench holds what the phases share.
type bench struct {
	cfg config
	cp  *controlplane.ControlPlane
	c   kubernetes.Interface
	// clusterIPs are the services' cluster IPs, by index.
	mu         sync.Mutex
	clusterIPs map[int]netip.Addr
}

// endpointIP is the address of endpoint e of service i.
func endpointIP(i, e int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(1 + i/250), byte(i % 250), byte(1 + e)})
}

// svcName is the name of service i.
func svcName(i int) string { return fmt.Sprintf("s%05d", i) }

// slice returns the EndpointSlice of service i with its endpoints (the
// first one replaced by alt when valid).
func (b *bench) slice(i int, alt netip.Addr) *discovery.EndpointSlice {
	name := svcName(i)
	s := &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-1", Namespace: ns, Labels: map[string]string{
			discovery.LabelServiceName: name, discovery.LabelManagedBy: "kpng-sidebyside",
		}},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr("http"), Protocol: ptr(v1.ProtocolTCP), Port: ptr(int32(8080))}},
	}
	for e := range b.cfg.endpoints {
		addr := endpointIP(i, e)
		if e == 0 && alt.IsValid() {
			addr = alt
		}
		s.Endpoints = append(s.Endpoints, discovery.Endpoint{
			Addresses:  []string{addr.String()},
			Conditions: discovery.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)},
			NodeName:   ptr(fmt.Sprintf("node-%d", e)),
		})
	}
	return s
}

func ptr[T any](v T) *T { return &v }

// checkChange fails when writing addr as the first endpoint of service
// i's slice would change nothing: the API server sends no event for such
// an update, so no proxier would sync, and the wait for it would time
// out as if the proxier were at fault. Called before a measured change
// (it reads the slice).
func (b *bench) checkChange(ctx context.Context, i int, addr netip.Addr) error {
	s, err := b.c.DiscoveryV1().EndpointSlices(ns).Get(ctx, svcName(i)+"-1", metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read the slice of %s: %w", svcName(i), err)
	}
	if len(s.Endpoints) > 0 && slices.Equal(s.Endpoints[0].Addresses, []string{addr.String()}) {
		return fmt.Errorf("%s's first endpoint is %s already: no change to measure", svcName(i), addr)
	}
	return nil
}

// createService creates service i and its slice.
func (b *bench) createService(ctx context.Context, i int) error {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: svcName(i), Namespace: ns},
		Spec: v1.ServiceSpec{
			Type:  v1.ServiceTypeClusterIP,
			Ports: []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}
	created, err := b.c.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("service %s: %w", svc.Name, err)
	}
	ip, err := netip.ParseAddr(created.Spec.ClusterIP)
	if err != nil {
		return fmt.Errorf("service %s: cluster IP %q: %w", svc.Name, created.Spec.ClusterIP, err)
	}
	b.mu.Lock()
	if b.clusterIPs == nil {
		b.clusterIPs = map[int]netip.Addr{}
	}
	b.clusterIPs[i] = ip
	b.mu.Unlock()
	if _, err := b.c.DiscoveryV1().EndpointSlices(ns).Create(ctx, b.slice(i, netip.Addr{}), metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("slice of %s: %w", svc.Name, err)
	}
	return nil
}

// populate creates services from..to-1, with 8 workers.
func (b *bench) populate(from, to int) error {
	ctx := context.Background()
	next := make(chan int)
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range next {
				if err := b.createService(ctx, i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for i := from; i < to; i++ {
		select {
		case next <- i:
		case err := <-errs:
			close(next)
			wg.Wait()
			return err
		}
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// probeServices are the services whose first packets are timed: spread
// over the first `small` ones, present in both states.
func (b *bench) probeServices() []int {
	var out []int
	for i := 0; i < b.cfg.small; i += max(1, b.cfg.small/20) {
		out = append(out, i)
	}
	return out
}

// memory returns the VmRSS and VmHWM of pid, in KiB.
func memory(pid int) (rss, hwm int64) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(fields[1], 10, 64)
		switch fields[0] {
		case "VmRSS:":
			rss = v
		case "VmHWM:":
			hwm = v
		}
	}
	return rss, hwm
}

// node is a network namespace standing for the node (benchnode: the node
// IP, the probe services' endpoint addresses on lo, a TCP server on
// :8080), with a forwarder to the API server.
type node struct {
	*benchnode.Node
	apiFwd  net.Listener
	shimLog string
}

// newNode makes the namespace.
func (b *bench) newNode(label string) (*node, error) {
	name := "kpngsbs-" + label
	var eps []netip.Addr
	for _, i := range b.probeServices() {
		for e := range b.cfg.endpoints {
			eps = append(eps, endpointIP(i, e))
		}
	}
	bn, err := benchnode.Make(name, eps)
	if err != nil {
		return nil, err
	}
	n := &node{Node: bn, shimLog: filepath.Join(b.cfg.shimDir, name+".log")}
	// The API server, reached from the namespace at the address of the
	// kubeconfig (127.0.0.1:port): a forwarder listening in the
	// namespace and dialling from here.
	host := strings.TrimPrefix(b.cp.Host(), "https://")
	if n.apiFwd, err = netns.RunIn(n.Path, func() (net.Listener, error) { return net.Listen("tcp", host) }); err != nil {
		n.close()
		return nil, err
	}
	go netns.Forward(n.apiFwd, host)
	return n, nil
}

// close removes the namespace.
func (n *node) close() {
	if n.apiFwd != nil {
		n.apiFwd.Close()
	}
	n.Node.Close()
}

// firstPacket returns the median time of a TCP connect from the node
// namespace to the probe services' cluster IPs (the first packet crosses
// the proxier's dispatch; the endpoints are local addresses), once the
// machine is quiet: what the rules cost a connection, not what the work
// after a sync (the proxier's, the API server's after the load) costs the
// 2 cores the probes share with it. (Probing at once after the cold start,
// the first proxier measured was the slower by 30–80%, kpng or
// kube-proxy, whichever went first.)
func (b *bench) firstPacket(n *node, p *proc) (time.Duration, error) {
	waited, used := waitIdle(p.cmd.Process.Pid, time.Minute)
	logf("%s: the machine quiet %s after the sync (the proxier used %.2f s of CPU meanwhile); probing", n.Name, waited.Round(10*time.Millisecond), used)
	probes := b.probeServices()
	return netns.RunIn(n.Path, func() (time.Duration, error) {
		var times []time.Duration
		for k := range b.cfg.probes {
			b.mu.Lock()
			ip := b.clusterIPs[probes[k%len(probes)]]
			b.mu.Unlock()
			d, err := connectTime(ip)
			if err != nil {
				return 0, err
			}
			times = append(times, d)
		}
		return median(times), nil
	})
}

// connectTime returns how long a TCP connect to ip:80 took, from the
// calling goroutine's network namespace (the connection is closed).
func connectTime(ip netip.Addr) (time.Duration, error) {
	start := time.Now()
	conn, err := net.DialTimeout("tcp", netip.AddrPortFrom(ip, 80).String(), 2*time.Second)
	if err != nil {
		return 0, fmt.Errorf("connect to %s: %w", ip, err)
	}
	d := time.Since(start)
	conn.Close()
	return d, nil
}

// waitIdle waits until the machine is quiet: its CPUs busy under 10% of
// the time for a second (four quarter-seconds in a row; the proxier, the
// API server digesting the load, whatever else runs), or limit passed. It
// returns the time waited and the CPU seconds pid used meanwhile.
func waitIdle(pid int, limit time.Duration) (time.Duration, float64) {
	const step = 250 * time.Millisecond
	start := time.Now()
	first, _ := procfs.CPUSeconds(pid)
	busy, total, err := machineCPU()
	if err != nil {
		return 0, 0
	}
	for quiet := 0; quiet < 4 && time.Since(start) < limit; {
		time.Sleep(step)
		b, t, err := machineCPU()
		if err != nil {
			break
		}
		if t > total && float64(b-busy) < 0.10*float64(t-total) {
			quiet++
		} else {
			quiet = 0
		}
		busy, total = b, t
	}
	last, _ := procfs.CPUSeconds(pid)
	return time.Since(start), last - first
}

// machineCPU returns the machine's busy and total CPU time so far, in
// clock ticks (/proc/stat's first line: idle and iowait are not busy).
func machineCPU() (busy, total uint64, err error) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	line, _, _ := strings.Cut(string(data), "\n")
	fields := strings.Fields(line)
	if len(fields) < 6 || fields[0] != "cpu" {
		return 0, 0, fmt.Errorf("/proc/stat: unexpected first line %q", line)
	}
	for i, f := range fields[1:] {
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc/stat: %w", err)
		}
		total += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, total, nil
}

// median returns the median of ds (0 for none).
func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// proc is a running proxier whose log is followed for its syncs (and,
// for kpng, its rounds).
type proc struct {
	cmd     *exec.Cmd
	started time.Time
	syncs   chan logEvent
	rounds  chan logEvent // nil: the proxier logs no rounds
	done    chan struct{}
}

// logEvent is a log line of interest: when it was read, when the
// proxier logged it (its klog header), how long the proxier says the
// work took, and the line's other submatches by name.
type logEvent struct {
	at, logged time.Time
	took       time.Duration
	fields     map[string]string
}

// The log lines of a complete sync: kube-proxy's (-v=2), the kpng iptables
// and nftables backends' (-v=2); and kpng's rounds (client/watcher, -v=2).
// Each has a group "took".
var (
	kubeProxySync    = regexp.MustCompile(`"SyncProxyRules complete" ipFamily="IPv4" elapsed="(?P<took>[^"]+)"`)
	kpngIPTablesSync = regexp.MustCompile(`"iptables chains synced".* duration="(?P<took>[^"]+)"`)
	kpngNFTSync      = regexp.MustCompile(`"nftables table synced" .*full=(?P<full>\w+) services=(?P<services>\d+) messages=(?P<messages>\d+) .*duration="(?P<took>[^"]+)"`)
	kpngRound        = regexp.MustCompile(`"Delivered state" dirtyServices=(?P<dirty>\d+) .*failed=(?P<failed>\w+) waited="(?P<waited>[^"]+)" duration="(?P<took>[^"]+)"`)
)

// start starts the proxier for the namespace n: in iptables mode with the
// shims of the variant first in its PATH.
func (b *bench) start(proxier, variant string, n *node) (*proc, error) {
	var cmd *exec.Cmd
	var syncRE, roundRE *regexp.Regexp
	switch {
	case proxier == "kube-proxy":
		args := []string{"netns", "exec", n.Name, b.cfg.kubeProxy, "--kubeconfig=" + b.cp.KubeconfigPath(),
			"--hostname-override=" + nodeName, "--proxy-mode=" + b.cfg.mode, "-v=2",
			"--metrics-bind-address=127.0.0.1:10249", "--healthz-bind-address=127.0.0.1:10256",
			"--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0"}
		cmd = exec.Command("ip", args...)
		syncRE = kubeProxySync
	case proxier == "kpng" && b.cfg.mode == "iptables":
		cmd = exec.Command(b.cfg.kpng, "-v=2", "kube", "--kubeconfig="+b.cp.KubeconfigPath(), "--node-name="+nodeName,
			"to-local", "to-iptables", "--iptables="+variant, "--netns="+n.Path)
		syncRE = kpngIPTablesSync
	case proxier == "kpng" && b.cfg.mode == "nftables":
		cmd = exec.Command(b.cfg.kpng, "-v="+strconv.Itoa(b.cfg.kpngV), "kube", "--kubeconfig="+b.cp.KubeconfigPath(), "--node-name="+nodeName,
			"to-local", "to-nft", "--netns="+n.Path)
		syncRE, roundRE = kpngNFTSync, kpngRound
	default:
		return nil, fmt.Errorf("unknown proxier %q", proxier)
	}
	cmd.Env = os.Environ()
	if b.cfg.mode == "iptables" {
		bin, err := b.shims(variant, n)
		if err != nil {
			return nil, err
		}
		cmd.Env = append(cmd.Env, "PATH="+bin+":"+os.Getenv("PATH"), "KPNG_SHIM_LOG="+n.shimLog)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", proxier, err)
	}
	cmd.Stdout = io.Discard
	p := &proc{cmd: cmd, syncs: make(chan logEvent, 4096), done: make(chan struct{})}
	if roundRE != nil {
		p.rounds = make(chan logEvent, 4096)
	}
	if err := os.MkdirAll(b.cfg.logDir, 0o755); err != nil {
		return nil, err
	}
	logFile, err := os.Create(filepath.Join(b.cfg.logDir, n.Name+".log"))
	if err != nil {
		return nil, err
	}
	p.started = time.Now()
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", proxier, err)
	}
	go func() {
		defer close(p.done)
		defer logFile.Close()
		sc := bufio.NewScanner(stderr)
		sc.Buffer(nil, 4<<20)
		for sc.Scan() {
			line := sc.Text()
			at := time.Now()
			fmt.Fprintln(logFile, line)
			for _, f := range []struct {
				re *regexp.Regexp
				ch chan logEvent
			}{{syncRE, p.syncs}, {roundRE, p.rounds}} {
				if f.re == nil {
					continue
				}
				if ev, ok := matchLog(f.re, line, at); ok {
					select {
					case f.ch <- ev:
					default: // never block the proxier's logging: a lost line shows as a timeout
						logf("%s: dropped a log line (nobody reads them): %s", proxier, line)
					}
				}
			}
		}
		// The pipe must be drained until the end before Wait.
		_, _ = io.Copy(io.Discard, stderr)
	}()
	return p, nil
}

// matchLog returns the event of line if re matches it, read at at.
func matchLog(re *regexp.Regexp, line string, at time.Time) (logEvent, bool) {
	m := re.FindStringSubmatch(line)
	if m == nil {
		return logEvent{}, false
	}
	ev := logEvent{at: at, fields: map[string]string{}}
	for i, name := range re.SubexpNames() {
		if name != "" {
			ev.fields[name] = m[i]
		}
	}
	ev.took, _ = time.ParseDuration(ev.fields["took"])
	ev.logged, _ = klogTime(line, at)
	return ev, true
}

// klogHeader is the start of a klog text line: severity, month and day,
// time of day to the microsecond (local time).
var klogHeader = regexp.MustCompile(`^[IWEF](\d{4} \d{2}:\d{2}:\d{2}\.\d{6}) `)

// klogTime returns the time in the klog header of line, in the year of
// now (the header has none).
func klogTime(line string, now time.Time) (time.Time, bool) {
	m := klogHeader.FindStringSubmatch(line)
	if m == nil {
		return time.Time{}, false
	}
	t, err := time.ParseInLocation("0102 15:04:05.000000", m[1], time.Local)
	if err != nil {
		return time.Time{}, false
	}
	return time.Date(now.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), t.Nanosecond(), time.Local), true
}

// waitSync returns the first complete sync read after since.
func (p *proc) waitSync(since time.Time, timeout time.Duration) (logEvent, error) {
	return p.wait(p.syncs, "complete sync", since, timeout)
}

// wait returns the first event of ch read after since.
func (p *proc) wait(ch chan logEvent, what string, since time.Time, timeout time.Duration) (logEvent, error) {
	deadline := time.After(timeout)
	for {
		select {
		case ev := <-ch:
			if ev.at.After(since) {
				return ev, nil
			}
		case <-p.done:
			return logEvent{}, errors.New("the proxier exited")
		case <-deadline:
			return logEvent{}, fmt.Errorf("no %s within %s", what, timeout)
		}
	}
}

// stop stops the proxier.
func (p *proc) stop() {
	if p.cmd.Process != nil {
		_ = p.cmd.Process.Signal(os.Interrupt)
	}
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	_ = p.cmd.Wait()
}
