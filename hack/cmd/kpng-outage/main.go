//go:build linux

// Command kpng-outage measures how long service traffic stops when
// another program changes a proxier's rules: for kpng (to-nft,
// to-iptables with each variant) and kube-proxy (--proxy-mode=nftables,
// iptables with each variant), each in a network namespace of its own on
// the same Services and EndpointSlices in the test control plane, it
// runs an action (nft flush ruleset, iptables -t nat -F, the table
// deleted, a base chain or jump removed) and times, from the end of the
// action's command (which commits just before it ends), the first TCP connection to a service's cluster IP that an
// endpoint answers again (a connection tried every --interval, each
// given --interval to connect). hack/repair-outage.sh builds the binaries
// and runs it; the results go to docs/reliability.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"sigs.k8s.io/kpng/internal/benchnode"
	"sigs.k8s.io/kpng/internal/controlplane"
	"sigs.k8s.io/kpng/internal/netns"
)

const (
	nodeName  = "node-a"
	namespace = "outage"
	endpoints = 3
)

// nodeIP is the node namespace's address.
var nodeIP = benchnode.NodeIP

// config is the command line.
type config struct {
	kubeProxy, kpng   string
	services          int
	reps, kubeProxyRs int
	limit, interval   time.Duration
	proxiers          []string
	logDir            string
}

func main() {
	var cfg config
	var proxiers string
	flag.StringVar(&cfg.kubeProxy, "kube-proxy", "", "the kube-proxy binary")
	flag.StringVar(&cfg.kpng, "kpng", "", "the kpng binary")
	flag.IntVar(&cfg.services, "services", 1000, "services (one endpoint slice each)")
	flag.IntVar(&cfg.reps, "reps", 10, "repetitions of each action with kpng")
	flag.IntVar(&cfg.kubeProxyRs, "kube-proxy-reps", 10, "repetitions of each action with kube-proxy (an action not repaired within --limit is not repeated)")
	flag.DurationVar(&cfg.limit, "limit", 70*time.Second, "how long to wait for traffic after an action")
	flag.DurationVar(&cfg.interval, "interval", 10*time.Millisecond, "the time between connection attempts, and each one's timeout")
	flag.StringVar(&proxiers, "proxiers", "kpng-nft,kube-proxy-nftables,kpng-iptables-nft,kube-proxy-iptables-nft,kpng-iptables-legacy,kube-proxy-iptables-legacy", "the proxiers, in order")
	flag.StringVar(&cfg.logDir, "log-dir", filepath.Join(os.TempDir(), "kpng-outage"), "where the proxiers' logs go")
	flag.Parse()
	cfg.proxiers = strings.Split(proxiers, ",")
	if cfg.kubeProxy == "" || cfg.kpng == "" {
		fmt.Fprintln(os.Stderr, "usage: kpng-outage --kube-proxy=PATH --kpng=PATH [flags]")
		os.Exit(2)
	}
	if err := run(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "kpng-outage:", err)
		os.Exit(1)
	}
}

// logf prints progress on stderr.
func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

// action is one change made behind a proxier's back: script returns the
// commands (each an argv) for the proxier's rules in the namespace.
type action struct {
	name   string
	script func(p proxier, n *node) ([][]string, error)
}

// proxier is one of the proxiers measured.
type proxier struct {
	name    string
	kpng    bool
	mode    string // nftables or iptables
	variant string // iptables mode: legacy or nft
}

func parseProxier(s string) (proxier, error) {
	p := proxier{name: s}
	switch {
	case s == "kpng-nft":
		p.kpng, p.mode = true, "nftables"
	case s == "kube-proxy-nftables":
		p.mode = "nftables"
	case strings.HasPrefix(s, "kpng-iptables-"):
		p.kpng, p.mode, p.variant = true, "iptables", strings.TrimPrefix(s, "kpng-iptables-")
	case strings.HasPrefix(s, "kube-proxy-iptables-"):
		p.mode, p.variant = "iptables", strings.TrimPrefix(s, "kube-proxy-iptables-")
	default:
		return p, fmt.Errorf("unknown proxier %q", s)
	}
	if p.mode == "iptables" && p.variant != "legacy" && p.variant != "nft" {
		return p, fmt.Errorf("proxier %q: variant %q: want legacy or nft", s, p.variant)
	}
	return p, nil
}

// iptables returns the name of the variant's iptables binary.
func (p proxier) iptables(tool string) string { return "iptables-" + p.variant + tool }

// nftTable returns the proxier's nftables table of IPv4, the probed
// service's family (nftables mode).
func (p proxier) nftTable() string {
	if p.kpng {
		return "ip kpng" // kpng without --service-proxy-name: TableName("")
	}
	return "ip kube-proxy"
}

// outputJump returns the argv deleting the proxier's jump from nat
// OUTPUT (iptables mode), read from the listing.
func outputJump(p proxier, n *node) ([]string, error) {
	out, err := n.exec(p.iptables(""), "-t", "nat", "-S", "OUTPUT")
	if err != nil {
		return nil, err
	}
	for line := range strings.SplitSeq(out, "\n") {
		if strings.HasPrefix(line, "-A OUTPUT ") && (strings.Contains(line, "KPNG-") || strings.Contains(line, "KUBE-SERVICES")) {
			args, err := splitRule(strings.TrimPrefix(line, "-A OUTPUT "))
			if err != nil {
				return nil, err
			}
			return append([]string{p.iptables(""), "-t", "nat", "-D", "OUTPUT"}, args...), nil
		}
	}
	return nil, fmt.Errorf("no jump from nat OUTPUT in:\n%s", out)
}

// splitRule splits an iptables -S rule into arguments, quotes removed.
func splitRule(s string) ([]string, error) {
	var out []string
	var cur strings.Builder
	quoted, any := false, false
	for _, r := range s {
		switch {
		case r == '"':
			quoted, any = !quoted, true
		case r == ' ' && !quoted:
			if any {
				out = append(out, cur.String())
				cur.Reset()
				any = false
			}
		default:
			cur.WriteRune(r)
			any = true
		}
	}
	if quoted {
		return nil, fmt.Errorf("unbalanced quotes in %q", s)
	}
	if any {
		out = append(out, cur.String())
	}
	return out, nil
}

// actions are the changes measured, each for the modes it applies to.
var actions = []action{
	{"nft flush ruleset", func(p proxier, _ *node) ([][]string, error) {
		if p.mode == "iptables" && p.variant == "legacy" {
			return nil, nil // the legacy tables are not nftables'
		}
		return [][]string{{"nft", "flush", "ruleset"}}, nil
	}},
	{"iptables -t nat -F", func(p proxier, _ *node) ([][]string, error) {
		if p.mode != "iptables" {
			return nil, nil
		}
		return [][]string{{p.iptables(""), "-t", "nat", "-F"}}, nil
	}},
	{"table deleted", func(p proxier, _ *node) ([][]string, error) {
		switch {
		case p.mode == "nftables":
			return [][]string{{"nft", "delete", "table", strings.Fields(p.nftTable())[0], strings.Fields(p.nftTable())[1]}}, nil
		case p.variant == "nft":
			return [][]string{{"nft", "delete", "table", "ip", "nat"}}, nil
		}
		// iptables-legacy cannot delete a table: replaced by an empty one.
		return [][]string{{"sh", "-c", "printf '*nat\\nCOMMIT\\n' | " + p.iptables("-restore")}}, nil
	}},
	{"base chain or jump removed", func(p proxier, n *node) ([][]string, error) {
		if p.mode == "nftables" {
			t := strings.Fields(p.nftTable())
			return [][]string{{"sh", "-c", fmt.Sprintf("printf 'flush chain %s %s nat-output\\ndelete chain %s %s nat-output\\n' | nft -f -", t[0], t[1], t[0], t[1])}}, nil
		}
		argv, err := outputJump(p, n)
		if err != nil {
			return nil, err
		}
		return [][]string{argv}, nil
	}},
}

// run starts the control plane, loads the services, and measures each
// proxier in turn.
func run(cfg config) error {
	dir := os.Getenv("KPNG_CONTROLPLANE_DIR")
	if dir == "" {
		return errors.New("KPNG_CONTROLPLANE_DIR is not set (hack/repair-outage.sh sets it)")
	}
	var ps []proxier
	for _, s := range cfg.proxiers {
		p, err := parseProxier(s)
		if err != nil {
			return err
		}
		ps = append(ps, p)
	}
	logf("starting the control plane")
	cp, err := controlplane.Start(controlplane.WithBinaryDir(dir))
	if err != nil {
		return fmt.Errorf("control plane: %w", err)
	}
	defer cp.Stop()
	rc := cp.RESTConfig()
	rc.QPS, rc.Burst = 5000, 10000
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	probe, err := load(c, cfg.services)
	if err != nil {
		return err
	}
	logf("%d services loaded; probing %s", cfg.services, probe)
	results := map[string]map[string][]time.Duration{}
	for _, p := range ps {
		r, err := measure(cfg, cp, p, probe)
		if err != nil {
			return fmt.Errorf("%s: %w", p.name, err)
		}
		results[p.name] = r
	}
	printTable(cfg, ps, results)
	return nil
}

// load creates the namespace, the node and the services; it returns the
// cluster IP of the first service, whose endpoints are the node's own
// addresses.
func load(c kubernetes.Interface, services int) (netip.Addr, error) {
	ctx := context.Background()
	if _, err := c.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		return netip.Addr{}, fmt.Errorf("create namespace %s: %w", namespace, err)
	}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, Labels: map[string]string{"kubernetes.io/hostname": nodeName}}}
	node, err := c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return netip.Addr{}, fmt.Errorf("create node %s: %w", nodeName, err)
	}
	node.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: nodeIP.String()}}
	if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		return netip.Addr{}, fmt.Errorf("node %s status: %w", nodeName, err)
	}
	var probe netip.Addr
	for i := range services {
		name := fmt.Sprintf("s%05d", i)
		svc := &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
			Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP,
				Ports: []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}},
		}
		created, err := c.CoreV1().Services(namespace).Create(ctx, svc, metav1.CreateOptions{})
		if err != nil {
			return netip.Addr{}, fmt.Errorf("service %s: %w", name, err)
		}
		if i == 0 {
			if probe, err = netip.ParseAddr(created.Spec.ClusterIP); err != nil {
				return netip.Addr{}, fmt.Errorf("service %s: cluster IP: %w", name, err)
			}
		}
		slice := &discovery.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: name + "-1", Namespace: namespace, Labels: map[string]string{
				discovery.LabelServiceName: name, discovery.LabelManagedBy: "kpng-outage"}},
			AddressType: discovery.AddressTypeIPv4,
			Ports:       []discovery.EndpointPort{{Name: ptr("http"), Protocol: ptr(v1.ProtocolTCP), Port: ptr(int32(8080))}},
		}
		for e := range endpoints {
			slice.Endpoints = append(slice.Endpoints, discovery.Endpoint{
				Addresses:  []string{endpointIP(i, e).String()},
				Conditions: discovery.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)},
				NodeName:   ptr(fmt.Sprintf("node-%d", e)),
			})
		}
		if _, err := c.DiscoveryV1().EndpointSlices(namespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
			return netip.Addr{}, fmt.Errorf("slice of %s: %w", name, err)
		}
	}
	return probe, nil
}

func ptr[T any](v T) *T { return &v }

// endpointIP is the address of endpoint e of service i.
func endpointIP(i, e int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(1 + i/250), byte(i % 250), byte(1 + e)})
}

// node is a network namespace a proxier programs (benchnode: the
// endpoints of the probe service are its own addresses, served on 8080),
// with a forwarder to the API server.
type node struct {
	*benchnode.Node
	apiFwd net.Listener
}

// newNode makes the namespace.
func newNode(label, apiHost string) (*node, error) {
	var eps []netip.Addr
	for e := range endpoints {
		eps = append(eps, endpointIP(0, e))
	}
	bn, err := benchnode.Make("kpngout-"+label, eps)
	if err != nil {
		return nil, err
	}
	n := &node{Node: bn}
	// The API server, at the kubeconfig's 127.0.0.1:port, from inside.
	if n.apiFwd, err = netns.RunIn(n.Path, func() (net.Listener, error) { return net.Listen("tcp", apiHost) }); err != nil {
		n.close()
		return nil, err
	}
	go netns.Forward(n.apiFwd, apiHost)
	return n, nil
}

// exec runs a command in the namespace and returns its output.
func (n *node) exec(name string, args ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"netns", "exec", n.Name, name}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// close removes the namespace.
func (n *node) close() {
	if n.apiFwd != nil {
		n.apiFwd.Close()
	}
	n.Node.Close()
}

// measure runs the proxier p in a namespace of its own and each action
// that applies to it, returning the outages by action.
func measure(cfg config, cp *controlplane.ControlPlane, p proxier, probe netip.Addr) (map[string][]time.Duration, error) {
	n, err := newNode(p.name, strings.TrimPrefix(cp.Host(), "https://"))
	if err != nil {
		return nil, err
	}
	defer n.close()
	if err := os.MkdirAll(cfg.logDir, 0o755); err != nil {
		return nil, err
	}
	logFile, err := os.Create(filepath.Join(cfg.logDir, p.name+".log"))
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	var cmd *exec.Cmd
	stop := func() {
		if cmd != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			cmd = nil
		}
	}
	defer stop()
	launch := func() error {
		stop()
		cmd, err = proxierCommand(cfg, cp, p, n)
		if err != nil {
			return err
		}
		cmd.Stdout, cmd.Stderr = logFile, logFile
		if err := cmd.Start(); err != nil {
			cmd = nil
			return fmt.Errorf("start: %w", err)
		}
		return nil
	}
	if err := launch(); err != nil {
		return nil, err
	}
	logf("%s: started, waiting for traffic to %s", p.name, probe)
	if _, err := untilServed(n, probe, 5*time.Minute, cfg.interval); err != nil {
		return nil, fmt.Errorf("first sync: %w", err)
	}
	out := map[string][]time.Duration{}
	reps := cfg.reps
	if !p.kpng {
		reps = cfg.kubeProxyRs
	}
	for _, a := range actions {
		for rep := range reps {
			script, err := a.script(p, n)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", a.name, err)
			}
			if script == nil {
				break
			}
			// Settled: served, and the proxier done with its last repair.
			if _, err := untilServed(n, probe, 5*time.Minute, cfg.interval); err != nil {
				return nil, fmt.Errorf("before %s: %w", a.name, err)
			}
			time.Sleep(2 * time.Second)
			for _, argv := range script {
				if _, err := n.exec(argv[0], argv[1:]...); err != nil {
					return nil, fmt.Errorf("%s: %w", a.name, err)
				}
			}
			// The change was committed just before its command ended.
			start := time.Now()
			_, err = untilServed(n, probe, cfg.limit, cfg.interval)
			d := time.Since(start)
			if err != nil {
				logf("%s: %s #%d: not served again within %v", p.name, a.name, rep+1, cfg.limit)
				out[a.name] = append(out[a.name], -1)
				// Not repaired: started again, as an operator would.
				if err := launch(); err != nil {
					return nil, err
				}
				if _, err := untilServed(n, probe, 5*time.Minute, cfg.interval); err != nil {
					return nil, fmt.Errorf("after %s and a restart: %w", a.name, err)
				}
				break
			}
			logf("%s: %s #%d: served again after %v", p.name, a.name, rep+1, d.Round(time.Millisecond))
			out[a.name] = append(out[a.name], d)
		}
	}
	return out, nil
}

// proxierCommand returns the command running p for the namespace n.
func proxierCommand(cfg config, cp *controlplane.ControlPlane, p proxier, n *node) (*exec.Cmd, error) {
	switch {
	case p.kpng && p.mode == "nftables":
		return exec.Command(cfg.kpng, "-v=1", "kube", "--kubeconfig="+cp.KubeconfigPath(), "--node-name="+nodeName, "to-local", "to-nft", "--netns="+n.Path), nil
	case p.kpng:
		return exec.Command(cfg.kpng, "-v=1", "kube", "--kubeconfig="+cp.KubeconfigPath(), "--node-name="+nodeName, "to-local", "to-iptables", "--iptables="+p.variant, "--netns="+n.Path), nil
	}
	cmd := exec.Command("ip", "netns", "exec", n.Name, cfg.kubeProxy, "--kubeconfig="+cp.KubeconfigPath(),
		"--hostname-override="+nodeName, "--proxy-mode="+p.mode, "-v=2",
		"--metrics-bind-address=127.0.0.1:10249", "--healthz-bind-address=127.0.0.1:10256",
		"--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0")
	if p.mode == "iptables" {
		// kube-proxy runs "iptables": the variant's, first in PATH.
		bin := filepath.Join(cfg.logDir, "bin-"+p.variant)
		if err := os.MkdirAll(bin, 0o755); err != nil {
			return nil, err
		}
		for _, fam := range []string{"iptables", "ip6tables"} {
			for _, tool := range []string{"", "-save", "-restore"} {
				_ = os.Symlink("/usr/sbin/"+fam+"-"+p.variant+tool, filepath.Join(bin, fam+tool))
			}
		}
		cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"))
	}
	return cmd, nil
}

// untilServed connects to the probe's port 80 from the namespace every
// interval until the endpoint answers, and returns how long it took; an
// error after limit.
func untilServed(n *node, probe netip.Addr, limit, interval time.Duration) (time.Duration, error) {
	return netns.RunIn(n.Path, func() (time.Duration, error) {
		start := time.Now()
		dst := netip.AddrPortFrom(probe, 80).String()
		for time.Since(start) < limit {
			tried := time.Now()
			conn, err := net.DialTimeout("tcp", dst, interval)
			if err == nil {
				conn.Close()
				return time.Since(start), nil
			}
			time.Sleep(interval - min(interval, time.Since(tried)))
		}
		return 0, fmt.Errorf("%s not served within %v", dst, limit)
	})
}

// printTable prints the markdown table of docs/reliability.md: median and
// worst outage per proxier and action.
func printTable(cfg config, ps []proxier, results map[string]map[string][]time.Duration) {
	fmt.Printf("%d services; outage from the end of the action's command to the first connection served (tried every %v); median / worst (tries)\n\n", cfg.services, cfg.interval)
	fmt.Print("| proxier |")
	for _, a := range actions {
		fmt.Printf(" %s |", a.name)
	}
	fmt.Print("\n|---|")
	for range actions {
		fmt.Print("---|")
	}
	fmt.Println()
	for _, p := range ps {
		fmt.Printf("| %s |", p.name)
		for _, a := range actions {
			fmt.Printf(" %s |", summary(results[p.name][a.name], cfg.limit))
		}
		fmt.Println()
	}
}

// summary is "median / worst (n)", "> limit" for a try not served within
// the limit, "n/a" for none.
func summary(ds []time.Duration, limit time.Duration) string {
	if len(ds) == 0 {
		return "n/a"
	}
	if slices.Contains(ds, -1) {
		return fmt.Sprintf("> %v (%d of %d tries)", limit, count(ds, -1), len(ds))
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return fmt.Sprintf("%s / %s (%d)", ms(s[len(s)/2]), ms(s[len(s)-1]), len(s))
}

func count(ds []time.Duration, v time.Duration) int {
	n := 0
	for _, d := range ds {
		if d == v {
			n++
		}
	}
	return n
}

func ms(d time.Duration) string {
	if d >= 10*time.Second {
		return fmt.Sprintf("%.1f s", d.Seconds())
	}
	return fmt.Sprintf("%d ms", d.Milliseconds())
}
