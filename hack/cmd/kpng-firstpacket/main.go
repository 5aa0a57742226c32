//go:build linux

// Command kpng-firstpacket times the first packet of new TCP connections
// to cluster IPs through several nftables rulesets side by side, and
// writes the rulesets it compares (hack/first-packet-nft.sh runs it; the
// results are in docs/benchmarks.md, "nft layout: where the first packet
// goes, and what a service add costs").
//
// The rulesets are those of kpng-genstate's synthetic services: service i
// has the cluster IP 10.96.(1+i/250%256).(1+i%250) (TCP 80 → 8080) and E
// endpoints, 10.128.0.0 + i·E + k.
//
//	kpng-firstpacket kube-proxy --services=N --endpoints=E --cluster-cidr=10.0.0.0/16 >kp.nft
//	kpng-firstpacket variant --in=kpng.nft --endpoints=E --change=pick-map,no-hairpin >v.nft
//	kpng-firstpacket probe --services=N --endpoints=E --probes=1000 kpng=kpng.nft kube-proxy=kp.nft …
//	kpng-firstpacket load --netns=NAME FILE
//	kpng-firstpacket replay --targets-from=kube-proxy.nft --probes=1000 kube-proxy=kube-proxy.nft kpng=kpng.nft …
//	kpng-firstpacket shard-rules --in=kpng.nft --kind=filled --count=63 --shard=10 >v.nft
//
// kube-proxy writes the table of kube-proxy v1.36.3's nftables mode for
// those services (its base chains and rules, and per service a chain with
// one DNAT through an anonymous numgen map; no session affinity), written
// from reading its proxier, not copied from it. --endpoint-chains writes
// the layout of earlier kube-proxy versions instead: a numgen verdict map
// to one chain per endpoint (the hairpin mark and the DNAT).
//
// replay probes rulesets saved from real proxiers by kpng-sidebyside
// --swap-rules, in kpng-sidebyside's topology (replay.go).
//
// shard-rules rewrites a listing of kpng's tables with rules that a packet
// to shard --shard crosses before its own (shardrules.go): what each shard
// of a family costs the packets that cross its rule.
//
// load loads a ruleset file as probe does: the table in one transaction,
// then each of its `add element` lines in one (nft 1.0.6 fails with
// ENOBUFS on 10,000 elements of a concatenated interval map in one).
//
// variant rewrites a listing of kpng's tables (`nft list table ip
// kpng-x` then `nft list table ip6 kpng-x`, or an earlier kpng's one
// `table inet kpng-x`) with one or more changes (--change,
// comma-separated; see changes below), or into one of the candidate
// layouts without a chain per service or without goto elements added per
// service (--layout; see layouts in layout.go). The layouts and the
// changes of service chains are IPv4's: they go in the table holding IPv4
// (ip, or inet); the changes of the fixed chains apply in every table, and
// no-v6 leaves the table ip6 out.
//
// probe makes, for each ruleset, a "node" namespace holding it (loaded
// with nft -f), a "pod" namespace behind it (10.0.0.2, routed through the
// node) and an "endpoint" namespace (the probe services' endpoint
// addresses on its veth, a server on port 8080 answering one line per
// connection), then, --probes times, for each ruleset in turn (A B A B…),
// opens a TCP connection from the pod (or, --from=node, from the node) to
// the next probe service's cluster IP, sends a line and reads the answer,
// timing the whole exchange. It prints the median and the ratio to the
// first ruleset's median, for each ruleset. The namespaces are named
// kpngfp-<pid>-… and removed at the end.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"sigs.k8s.io/kpng/internal/netns"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "kube-proxy":
		err = kubeProxyCmd(os.Args[2:])
	case "variant":
		err = variantCmd(os.Args[2:])
	case "probe":
		err = probeCmd(os.Args[2:])
	case "load":
		err = loadCmd(os.Args[2:])
	case "replay":
		err = replayCmd(os.Args[2:])
	case "shard-rules":
		err = shardRulesCmd(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kpng-firstpacket:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: kpng-firstpacket kube-proxy|variant|probe|load|replay|shard-rules [flags] (see the package comment)")
	os.Exit(2)
}

// clusterIP returns the cluster IP of kpng-genstate's service i.
func clusterIP(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(96 + i/(250*256)), byte(1 + i/250%256), byte(1 + i%250)})
}

// endpointIP returns the address of endpoint k of kpng-genstate's service
// i with e endpoints per service.
func endpointIP(i, k, e int) netip.Addr {
	v := uint32(10<<24|128<<16) + uint32(i*e+k)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// kubeProxyCmd writes kube-proxy's table for the synthetic services.
func kubeProxyCmd(args []string) error {
	fs := flag.NewFlagSet("kube-proxy", flag.ExitOnError)
	services := fs.Int("services", 100, "number of services")
	endpoints := fs.Int("endpoints", 10, "endpoints per service")
	clusterCIDR := fs.String("cluster-cidr", "10.0.0.0/16", "the pods' CIDR (traffic from elsewhere to a cluster IP is masqueraded)")
	epChains := fs.Bool("endpoint-chains", false, "a numgen verdict map to per-endpoint chains (earlier kube-proxy) instead of the DNAT through an anonymous numgen map")
	local := fs.Bool("local", false, "the endpoints run on this node: their addresses in the hairpin set (kube-proxy holds only local endpoints there; kpng-genstate's run on other nodes unless --nodes=0)")
	_ = fs.Parse(args)
	w := bufio.NewWriterSize(os.Stdout, 1<<20)
	writeKubeProxy(w, *services, *endpoints, *clusterCIDR, *epChains, *local)
	return w.Flush()
}

// writeKubeProxy writes the table `ip kube-proxy` as kube-proxy v1.36.3
// programs it for n services of e endpoints (ClusterIP, no node ports, no
// session affinity, --nodeport-addresses unset, a local detector on
// clusterCIDR); the endpoints' addresses go in the hairpin set when they
// are local.
func writeKubeProxy(w io.Writer, n, e int, clusterCIDR string, epChains, local bool) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format+"\n", a...) }
	p("table ip kube-proxy {")
	p("\tset cluster-ips { type ipv4_addr; }")
	p("\tset hairpin-connections { type ipv4_addr . ipv4_addr . inet_proto . inet_service; }")
	p("\tmap firewall-ips { type ipv4_addr . inet_proto . inet_service : verdict; }")
	p("\tmap no-endpoint-nodeports { type inet_proto . inet_service : verdict; }")
	p("\tmap no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict; }")
	p("\tmap service-ips { type ipv4_addr . inet_proto . inet_service : verdict; }")
	p("\tmap service-nodeports { type inet_proto . inet_service : verdict; }")
	p("\tchain cluster-ips-check { ip daddr @cluster-ips reject; ip daddr { 10.96.0.0/12 } drop; }")
	p("\tchain filter-prerouting-pre-dnat { type filter hook prerouting priority -110; ct state new jump firewall-check; }")
	p("\tchain filter-output-pre-dnat { type filter hook output priority -110; ct state new jump firewall-check; }")
	p("\tchain filter-forward { type filter hook forward priority 0; ct state new jump service-endpoints-check; ct state new jump cluster-ips-check; }")
	p("\tchain filter-input { type filter hook input priority 0; ct state new jump nodeport-endpoints-check; ct state new jump service-endpoints-check; }")
	p("\tchain filter-output { type filter hook output priority 0; ct state new jump service-endpoints-check; ct state new jump cluster-ips-check; }")
	p("\tchain firewall-check { ip daddr . meta l4proto . th dport vmap @firewall-ips; }")
	p("\tchain masquerading {")
	p("\t\tmeta mark & 0x4000 != 0 meta mark set meta mark ^ 0x4000 masquerade fully-random")
	p("\t\tct status dnat ip saddr . ip daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random")
	p("\t}")
	p("\tchain nat-output { type nat hook output priority -100; jump services; }")
	p("\tchain nat-postrouting { type nat hook postrouting priority 100; jump masquerading; }")
	p("\tchain nat-prerouting { type nat hook prerouting priority -100; jump services; }")
	p("\tchain nodeport-endpoints-check { ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @no-endpoint-nodeports; }")
	p("\tchain reject-chain { reject; }")
	p("\tchain service-endpoints-check { ip daddr . meta l4proto . th dport vmap @no-endpoint-services; }")
	p("\tchain services {")
	p("\t\tip daddr @cluster-ips ip saddr != %s meta mark set meta mark | 0x4000", clusterCIDR)
	p("\t\tip daddr . meta l4proto . th dport vmap @service-ips")
	p("\t\tfib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports")
	p("\t}")
	for i := range n {
		svc := fmt.Sprintf("service-%08d-bench/svc-%05d/tcp/p80", i, i)
		var elems []string
		if epChains {
			for k := range e {
				ep := endpointIP(i, k, e)
				epc := fmt.Sprintf("endpoint-%08d-bench/svc-%05d/tcp/p80__%s/8080", i*e+k, i, ep)
				p("\tchain %s { ip saddr %s meta mark set meta mark | 0x4000; meta l4proto tcp dnat to %s:8080; }", epc, ep, ep)
				elems = append(elems, fmt.Sprintf("%d : goto %s", k, epc))
			}
			p("\tchain %s { numgen random mod %d vmap { %s }; }", svc, e, strings.Join(elems, ", "))
		} else {
			for k := range e {
				elems = append(elems, fmt.Sprintf("%d : %s . 8080", k, endpointIP(i, k, e)))
			}
			p("\tchain %s { meta l4proto tcp dnat ip addr . port to numgen random mod %d map { %s }; }", svc, e, strings.Join(elems, ", "))
		}
	}
	p("}")
	// The elements, as kube-proxy adds them, in batches.
	for lo := 0; lo < n; lo += 1000 {
		hi := min(lo+1000, n)
		var cips, sips, hp []string
		for i := lo; i < hi; i++ {
			cip := clusterIP(i)
			cips = append(cips, cip.String())
			sips = append(sips, fmt.Sprintf("%s . tcp . 80 : goto service-%08d-bench/svc-%05d/tcp/p80", cip, i, i))
			for k := range e {
				if local {
					ep := endpointIP(i, k, e)
					hp = append(hp, fmt.Sprintf("%s . %s . tcp . 8080", ep, ep))
				}
			}
		}
		p("add element ip kube-proxy cluster-ips { %s }", strings.Join(cips, ", "))
		p("add element ip kube-proxy service-ips { %s }", strings.Join(sips, ", "))
		if len(hp) > 0 {
			p("add element ip kube-proxy hairpin-connections { %s }", strings.Join(hp, ", "))
		}
	}
}

// changes are the rewrites variant applies to a listing of kpng's tables.
var changes = map[string]string{
	"pick-map":        "the endpoint drawn with a DNAT through an anonymous numgen map (no intervals, no shared map), as kube-proxy v1.36",
	"pick-vmap":       "the endpoint drawn through a numgen verdict map to one chain per endpoint (DNAT there), as earlier kube-proxy",
	"no-nodeport-fib": "without the `fib daddr type local` node-port rules (services, nodeport-reject/-drop: node ports without endpoints are then not rejected; no-endpoint-services before ace8996)",
	"no-filter":       "without the filter chains' jumps to no-endpoint-services, cluster-ips-check and firewall-check (not nodeport-endpoints-check)",
	"no-noendpoints":  "without the jumps to no-endpoint-services",
	"no-clusterips":   "without the jumps to cluster-ips-check",
	"no-firewall":     "without the jumps to firewall-check",
	"filter-every":    "the filter chains' jumps to no-endpoint-services and firewall-check for every packet (kpng's layout before 58127a8), not for new connections only (`ct state new jump …`, as kube-proxy and kpng since)",
	"no-hairpin":      "without the masquerading chain's hairpin set lookups",
	"no-masq-jump":    "without the service chains' `ip daddr … ip saddr != CIDR jump mark-for-masquerade` rule",
	"no-v6":           "without IPv6: the table ip6 left out (a v4-only node; in an inet listing, the IPv6 rules of the fixed chains)",
}

// svcChain matches the header of a kpng service chain of a synthetic
// service, with its index.
var svcChain = regexp.MustCompile(`^\tchain (svc4-[A-Z0-9]+-bench/svc-(\d+)/tcp/80) \{$`)

// tableHead matches the first line of a table in a listing, with its
// family and name: kpng's listing holds `table ip X {…}` (IPv4) and
// `table ip6 X {…}` (IPv6); an earlier kpng's, one `table inet X {…}`.
// A table ends at the listing's line "}".
var tableHead = regexp.MustCompile(`^table (inet|ip|ip6) (\S+) \{$`)

// variantCmd rewrites a listing of kpng's tables.
func variantCmd(args []string) error {
	fs := flag.NewFlagSet("variant", flag.ExitOnError)
	in := fs.String("in", "", "the listing of kpng's tables (nft list table ip kpng-x; nft list table ip6 kpng-x), or of an earlier kpng's table inet kpng-x")
	endpoints := fs.Int("endpoints", 10, "endpoints per service (as given to kpng-genstate)")
	change := fs.String("change", "", "comma-separated changes: "+strings.Join(slices.Sorted(maps.Keys(changes)), ", "))
	layout := fs.String("layout", "", "instead of --change, a candidate layout: "+strings.Join(slices.Sorted(maps.Keys(layouts)), ", "))
	spare := fs.Int("spare", 16, "with --layout=pool, the spare pool chains")
	_ = fs.Parse(args)
	data, err := os.ReadFile(*in)
	if err != nil {
		return err
	}
	if *layout != "" {
		w := bufio.NewWriterSize(os.Stdout, 1<<20)
		if err := relayout(w, strings.Split(strings.TrimRight(string(data), "\n"), "\n"), *layout, *endpoints, *spare); err != nil {
			return err
		}
		return w.Flush()
	}
	on := map[string]bool{}
	for _, c := range strings.Split(*change, ",") {
		if c == "" {
			continue
		}
		if _, ok := changes[c]; !ok {
			return fmt.Errorf("--change=%s: unknown change %q", *change, c)
		}
		on[c] = true
	}
	w := bufio.NewWriterSize(os.Stdout, 1<<20)
	if err := variant(w, strings.Split(strings.TrimRight(string(data), "\n"), "\n"), on, *endpoints); err != nil {
		return fmt.Errorf("--change=%s: %w", *change, err)
	}
	return w.Flush()
}

// variant writes to w the listing lines of kpng's tables with the changes
// on made, e endpoints a service; a change that finds no line to change
// is an error.
func variant(w *bufio.Writer, lines []string, on map[string]bool, e int) error {
	matched := map[string]bool{} // the changes that found their lines
	var extra []string           // chains added before the IPv4 table's end
	svc := -1                    // the service whose chain is being read
	family := ""                 // the family of the table being read
	for _, line := range lines {
		if m := tableHead.FindStringSubmatch(line); m != nil {
			family = m[1]
		}
		if on["no-v6"] && family == "ip6" {
			matched["no-v6"] = true
			if line == "}" {
				family = ""
			}
			continue
		}
		if m := svcChain.FindStringSubmatch(line); m != nil {
			svc, _ = strconv.Atoi(m[2])
		} else if line == "\t}" {
			svc = -1
		}
		t := strings.TrimSpace(line)
		// A base chain's jump, for every packet or (kpng since 58127a8)
		// for new connections only.
		jump := strings.TrimPrefix(t, "ct state new ")
		drop := ""
		switch {
		case on["no-nodeport-fib"] && strings.HasPrefix(t, "fib daddr type local"):
			drop = "no-nodeport-fib"
		case (on["no-filter"] || on["no-noendpoints"]) && jump == "jump no-endpoint-services":
			drop = "no-noendpoints"
		case (on["no-filter"] || on["no-clusterips"]) && jump == "jump cluster-ips-check":
			drop = "no-clusterips"
		case (on["no-filter"] || on["no-firewall"]) && jump == "jump firewall-check":
			drop = "no-firewall"
		case on["no-hairpin"] && strings.HasPrefix(t, "ct status dnat ip") && strings.Contains(t, "@hairpin-"):
			drop = "no-hairpin"
		case on["no-masq-jump"] && svc >= 0 && strings.HasSuffix(t, "jump mark-for-masquerade"):
			drop = "no-masq-jump"
		case on["no-v6"] && svc < 0 && (strings.HasPrefix(t, "ip6 ") || strings.Contains(t, " ip6 ")) && !strings.Contains(t, "{"):
			drop = "no-v6"
		}
		if drop != "" {
			matched[drop] = true
			if on["no-filter"] && (drop == "no-noendpoints" || drop == "no-clusterips" || drop == "no-firewall") {
				matched["no-filter"] = true
			}
			continue
		}
		if on["filter-every"] && t != jump && (jump == "jump no-endpoint-services" || jump == "jump firewall-check") {
			line = strings.Replace(line, "ct state new jump", "jump", 1)
			matched["filter-every"] = true
		}
		if svc >= 0 && strings.HasPrefix(t, "meta l4proto tcp dnat ip to numgen") {
			var elems []string
			switch {
			case on["pick-map"]:
				matched["pick-map"] = true
				for k := range e {
					elems = append(elems, fmt.Sprintf("%d : %s . 8080", k, endpointIP(svc, k, e)))
				}
				line = fmt.Sprintf("\t\tmeta l4proto tcp dnat ip addr . port to numgen random mod %d map { %s }", e, strings.Join(elems, ", "))
			case on["pick-vmap"]:
				matched["pick-vmap"] = true
				for k := range e {
					ep := endpointIP(svc, k, e)
					name := fmt.Sprintf("ep4-%08d-bench/svc-%05d/tcp/80__%s/8080", svc*e+k, svc, ep)
					extra = append(extra, fmt.Sprintf("\tchain %s {\n\t\tip saddr %s jump mark-for-masquerade\n\t\tmeta l4proto tcp dnat ip to %s:8080\n\t}", name, ep, ep))
					elems = append(elems, fmt.Sprintf("%d : goto %s", k, name))
				}
				line = fmt.Sprintf("\t\tnumgen random mod %d vmap { %s }", e, strings.Join(elems, ", "))
			}
		}
		if line == "}" {
			if family != "ip6" {
				for _, c := range extra {
					fmt.Fprintln(w, c)
				}
				extra = nil
			}
			family = ""
		}
		fmt.Fprintln(w, line)
	}
	for c := range on {
		if !matched[c] {
			return fmt.Errorf("%s found no line of the listing to change (a layout that changed since the tool was written?)", c)
		}
	}
	return nil
}

// probeConfig is what probe was asked.
type probeConfig struct {
	services, endpoints, probes, probeServices, warmup int
	from                                               string
}

// rig is the namespaces of one ruleset.
type rig struct {
	name, file      string
	node, pod, ep   string // namespace names
	src             string // the namespace the probes start from
	listener        net.Listener
	times, connects []time.Duration
}

// probeCmd times the first packet through each ruleset.
func probeCmd(args []string) error {
	fs := flag.NewFlagSet("probe", flag.ExitOnError)
	var cfg probeConfig
	fs.IntVar(&cfg.services, "services", 100, "number of services in the rulesets")
	fs.IntVar(&cfg.endpoints, "endpoints", 10, "endpoints per service")
	fs.IntVar(&cfg.probes, "probes", 1000, "connections timed per ruleset")
	fs.IntVar(&cfg.probeServices, "probe-services", 20, "services probed, spread over all of them (their endpoints are served)")
	fs.IntVar(&cfg.warmup, "warmup", 50, "connections per ruleset before the timed ones, not counted")
	fs.StringVar(&cfg.from, "from", "pod", "where connections start: pod (prerouting, forward, postrouting) or node (output, postrouting)")
	lock := fs.String("lock", "", "a file to hold an exclusive flock(2) on while timing (not while loading the rulesets): the machine's measurement lock")
	_ = fs.Parse(args)
	if fs.NArg() == 0 || cfg.probes < 1 || cfg.probeServices < 1 || (cfg.from != "pod" && cfg.from != "node") {
		return errors.New("probe: want NAME=FILE arguments, --probes ≥ 1, --probe-services ≥ 1, --from=pod|node")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var rigs []*rig
	defer func() {
		for _, r := range rigs {
			r.close()
		}
	}()
	for i, a := range fs.Args() {
		name, file, ok := strings.Cut(a, "=")
		if !ok {
			return fmt.Errorf("probe: argument %q: want NAME=FILE", a)
		}
		r := &rig{name: name, file: file}
		rigs = append(rigs, r)
		if err := r.setup(cfg, i); err != nil {
			return fmt.Errorf("ruleset %s: %w", name, err)
		}
	}
	unlock, err := lockIf(*lock)
	if err != nil {
		return err
	}
	defer unlock()
	svcs := probeServices(cfg)
	round := func(k int, record bool) error {
		// Rotate who goes first, so that no ruleset always follows the same one.
		for j := range rigs {
			r := rigs[(j+k)%len(rigs)]
			d, c, err := r.probe(netip.AddrPortFrom(clusterIP(svcs[k%len(svcs)]), 80))
			if err != nil {
				return fmt.Errorf("ruleset %s: %w", r.name, err)
			}
			if record {
				r.times = append(r.times, d)
				r.connects = append(r.connects, c)
			}
		}
		return nil
	}
	for k := range cfg.warmup {
		if err := round(k, false); err != nil {
			return err
		}
	}
	for k := range cfg.probes {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := round(k, true); err != nil {
			return err
		}
	}
	ref, refc := median(rigs[0].times), median(rigs[0].connects)
	fmt.Printf("| ruleset | exchange: median | p10 | p90 | ratio to %s | connect: median | ratio |\n|---|---|---|---|---|---|---|\n", rigs[0].name)
	for _, r := range rigs {
		m, c := median(r.times), median(r.connects)
		fmt.Printf("| %s | %.1f µs | %.1f µs | %.1f µs | %.2f | %.1f µs | %.2f |\n", r.name, us(m), us(quantile(r.times, 0.1)), us(quantile(r.times, 0.9)),
			float64(m)/float64(ref), us(c), float64(c)/float64(refc))
	}
	return nil
}

// lockIf takes the measurement lock at path (flockFile) when path is
// set; the function returned releases it.
func lockIf(path string) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	return flockFile(path)
}

// flockFile waits for an exclusive flock(2) on path (as flock(1) takes
// it) and returns the function releasing it.
func flockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() { f.Close() }, nil
}

// probeServices returns the indexes of the probed services, spread
// evenly over all of them.
func probeServices(cfg probeConfig) []int {
	n := min(cfg.probeServices, cfg.services)
	out := make([]int, n)
	for j := range out {
		out[j] = j * cfg.services / n
	}
	return out
}

// setup makes the namespaces of the i-th ruleset and loads it: pod
// (10.0.0.2/24) — node (10.0.0.1/24, 10.0.1.1/24) — endpoint (10.0.1.2/24
// and the probe services' endpoint addresses).
func (r *rig) setup(cfg probeConfig, i int) error {
	base := fmt.Sprintf("kpngfp-%d-%d-", os.Getpid(), i)
	r.node, r.pod, r.ep = base+"node", base+"pod", base+"ep"
	run := func(c ...string) error {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %w: %s", strings.Join(c, " "), err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	cmds := [][]string{
		{"ip", "netns", "add", r.node}, {"ip", "netns", "add", r.pod}, {"ip", "netns", "add", r.ep},
		{"ip", "-n", r.node, "link", "set", "lo", "up"},
		{"ip", "-n", r.pod, "link", "set", "lo", "up"},
		{"ip", "-n", r.ep, "link", "set", "lo", "up"},
		{"ip", "netns", "exec", r.node, "sysctl", "-qw", "net.ipv4.ip_forward=1"},
		{"ip", "-n", r.node, "link", "add", "pod0", "type", "veth", "peer", "name", "eth0", "netns", r.pod},
		{"ip", "-n", r.node, "link", "add", "ep0", "type", "veth", "peer", "name", "eth0", "netns", r.ep},
		{"ip", "-n", r.node, "addr", "add", "10.0.0.1/24", "dev", "pod0"},
		{"ip", "-n", r.node, "addr", "add", "10.0.1.1/24", "dev", "ep0"},
		{"ip", "-n", r.pod, "addr", "add", "10.0.0.2/24", "dev", "eth0"},
		{"ip", "-n", r.ep, "addr", "add", "10.0.1.2/24", "dev", "eth0"},
		{"ip", "-n", r.node, "link", "set", "pod0", "up"},
		{"ip", "-n", r.node, "link", "set", "ep0", "up"},
		{"ip", "-n", r.pod, "link", "set", "eth0", "up"},
		{"ip", "-n", r.ep, "link", "set", "eth0", "up"},
		{"ip", "-n", r.pod, "route", "add", "default", "via", "10.0.0.1"},
		{"ip", "-n", r.ep, "route", "add", "default", "via", "10.0.1.1"},
		{"ip", "-n", r.node, "route", "add", "10.128.0.0/9", "via", "10.0.1.2"},
		// A route for the cluster IPs, without which the node's own
		// connections fail before its NAT output hook.
		{"ip", "-n", r.node, "route", "add", "10.96.0.0/12", "via", "10.0.1.2"},
	}
	for _, s := range probeServices(cfg) {
		for k := range cfg.endpoints {
			cmds = append(cmds, []string{"ip", "-n", r.ep, "addr", "add", endpointIP(s, k, cfg.endpoints).String() + "/32", "dev", "eth0"})
		}
	}
	for _, c := range cmds {
		if err := run(c...); err != nil {
			return err
		}
	}
	if err := load(r.node, r.file); err != nil {
		return err
	}
	r.src = r.pod
	if cfg.from == "node" {
		r.src = r.node
	}
	var err error
	if r.listener, err = netns.RunIn("/run/netns/"+r.ep, func() (net.Listener, error) { return net.Listen("tcp", ":8080") }); err != nil {
		return err
	}
	go serve(r.listener)
	return nil
}

// loadCmd loads a ruleset file into a named network namespace as load
// does.
func loadCmd(args []string) error {
	fs := flag.NewFlagSet("load", flag.ExitOnError)
	ns := fs.String("netns", "", "the network namespace's name (ip netns)")
	_ = fs.Parse(args)
	if *ns == "" || fs.NArg() != 1 {
		return errors.New("load: want --netns=NAME FILE")
	}
	return load(*ns, fs.Arg(0))
}

// elementLinesPerLoad is how many `add element` lines (200 or 1,000
// services' elements each) one nft transaction carries: nft 1.0.6 fails
// with ENOBUFS on a file adding 10,000 elements or more to a
// concatenated interval map in one transaction.
const elementLinesPerLoad = 1

// load loads the ruleset in file into the namespace ns with nft -f: what
// comes before its first `add element` line in one transaction, then its
// `add element` lines a few at a time.
func load(ns, file string) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	lines := strings.SplitAfter(string(data), "\n")
	first := len(lines)
	for i, l := range lines {
		if strings.HasPrefix(l, "add element ") {
			first = i
			break
		}
	}
	nft := func(part []string) error {
		cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
		cmd.Stdin = strings.NewReader(strings.Join(part, ""))
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("nft -f %s (in %s): %w: %s", file, ns, err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	if err := nft(lines[:first]); err != nil {
		return err
	}
	for lo := first; lo < len(lines); lo += elementLinesPerLoad {
		if err := nft(lines[lo:min(lo+elementLinesPerLoad, len(lines))]); err != nil {
			return err
		}
	}
	return nil
}

// serve answers each connection's first line with one line, then closes
// it.
func serve(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
				return
			}
			_, _ = c.Write([]byte("answer\n"))
		}()
	}
}

// probe times one exchange (connect, a line each way) to dst from the
// rig's source namespace, and its connect (the first packet's round
// trip: SYN through the rules, SYN-ACK back).
func (r *rig) probe(dst netip.AddrPort) (exchange, connect time.Duration, err error) {
	ds, err := netns.RunIn("/run/netns/"+r.src, func() ([2]time.Duration, error) {
		var ds [2]time.Duration
		start := time.Now()
		c, err := net.DialTimeout("tcp", dst.String(), 2*time.Second)
		if err != nil {
			return ds, fmt.Errorf("connect to %s: %w", dst, err)
		}
		ds[1] = time.Since(start)
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write([]byte("hello\n")); err != nil {
			return ds, fmt.Errorf("write to %s: %w", dst, err)
		}
		if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
			return ds, fmt.Errorf("read from %s: %w", dst, err)
		}
		ds[0] = time.Since(start)
		return ds, nil
	})
	return ds[0], ds[1], err
}

// close removes the rig's namespaces.
func (r *rig) close() {
	if r.listener != nil {
		r.listener.Close()
	}
	for _, n := range []string{r.pod, r.ep, r.node} {
		if n != "" {
			_ = exec.Command("ip", "netns", "del", n).Run()
		}
	}
}

func median(ds []time.Duration) time.Duration { return quantile(ds, 0.5) }

// quantile returns the q-quantile of ds (0 for none).
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))]
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
