//go:build linux

package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"time"

	"sigs.k8s.io/kpng/internal/benchnode"
	"sigs.k8s.io/kpng/internal/netns"
)

// replayCmd times the first packet through rulesets saved from real
// proxiers (kpng-sidebyside --swap-rules writes them: `nft list ruleset`
// of each proxier's namespace), in kpng-sidebyside's topology: each
// ruleset in a namespace of its own holding the probed services' endpoint
// addresses on its loopback and a server on port 8080 that accepts and
// closes, the connections made from that namespace (output, postrouting,
// then input through the loopback), interleaved (A B A B …). The probed
// services and their endpoints are read from a kube-proxy listing
// (--targets-from): its service-ips elements and its service chains'
// numgen maps.
func replayCmd(args []string) error {
	fs := flag.NewFlagSet("replay", flag.ExitOnError)
	targetsFrom := fs.String("targets-from", "", "a kube-proxy nftables listing to read the probed services from")
	services := fs.Int("probe-services", 20, "services probed, spread over those of the listing")
	probes := fs.Int("probes", 1000, "connections timed per ruleset")
	warmup := fs.Int("warmup", 50, "connections per ruleset before the timed ones, not counted")
	copies := fs.Int("copies", 1, "namespaces per ruleset, probed in turn with the others and pooled: a namespace's own speed differs from another's with the same rules by up to 2% here, which copies average out")
	lock := fs.String("lock", "", "a file to hold an exclusive flock(2) on while timing")
	_ = fs.Parse(args)
	if *targetsFrom == "" || fs.NArg() == 0 || *probes < 1 || *services < 1 || *copies < 1 {
		return errors.New("replay: want --targets-from=LISTING, --probes ≥ 1, --probe-services ≥ 1, --copies ≥ 1 and NAME=FILE arguments")
	}
	all, err := readTargets(*targetsFrom)
	if err != nil {
		return err
	}
	if len(all) == 0 {
		return fmt.Errorf("replay: no service with endpoints in %s", *targetsFrom)
	}
	n := min(*services, len(all))
	targets := make([]target, n)
	for j := range targets {
		targets[j] = all[j*len(all)/n]
	}
	var nodes []*localNode // copies of the first ruleset, then of the second…
	var names []string
	defer func() {
		for _, l := range nodes {
			l.close()
		}
	}()
	for i, a := range fs.Args() {
		name, file, ok := strings.Cut(a, "=")
		if !ok {
			return fmt.Errorf("replay: argument %q: want NAME=FILE", a)
		}
		names = append(names, name)
		for c := range *copies {
			l := &localNode{name: name, ns: fmt.Sprintf("kpngfp-%d-%d-%d-replay", os.Getpid(), i, c)}
			nodes = append(nodes, l)
			if err := l.setup(targets, file); err != nil {
				return fmt.Errorf("ruleset %s: %w", name, err)
			}
		}
	}
	unlock, err := lockIf(*lock)
	if err != nil {
		return err
	}
	defer unlock()
	times := make([][]time.Duration, len(names))
	for k := range *warmup + *probes {
		t := targets[k%len(targets)]
		for j := range nodes {
			i := (j + k) % len(nodes)
			d, err := netns.RunIn("/run/netns/"+nodes[i].ns, func() (time.Duration, error) {
				start := time.Now()
				c, err := net.DialTimeout("tcp", netip.AddrPortFrom(t.clusterIP, t.port).String(), 2*time.Second)
				if err != nil {
					return 0, err
				}
				d := time.Since(start)
				c.Close()
				return d, nil
			})
			if err != nil {
				return fmt.Errorf("ruleset %s: connect to %s: %w", nodes[i].name, t.clusterIP, err)
			}
			if k >= *warmup {
				times[i / *copies] = append(times[i / *copies], d)
			}
		}
	}
	ref := median(times[0])
	fmt.Printf("| ruleset | connect: median | p10 | p90 | ratio to %s |\n|---|---|---|---|---|\n", names[0])
	for i, name := range names {
		m := median(times[i])
		fmt.Printf("| %s | %.1f µs | %.1f µs | %.1f µs | %.3f |\n", name, us(m), us(quantile(times[i], 0.1)), us(quantile(times[i], 0.9)), float64(m)/float64(ref))
	}
	return nil
}

// target is one probed service port of a listing.
type target struct {
	clusterIP netip.Addr
	port      uint16
	endpoints []netip.Addr
}

var (
	// serviceElem matches a service-ips element of kube-proxy's listing:
	// cluster IP, port, service chain.
	serviceElem = regexp.MustCompile(`(\d+\.\d+\.\d+\.\d+) \. tcp \. (\d+)(?: comment "[^"]*")? : goto (service-\S+?)[,}\s]`)
	// chainHead and endpointElem read a service chain's numgen map.
	chainHead    = regexp.MustCompile(`^\tchain (service-\S+) \{$`)
	endpointElem = regexp.MustCompile(`\d+ : (\d+\.\d+\.\d+\.\d+) \. \d+`)
)

// readTargets reads the TCP service ports of a kube-proxy listing with
// their endpoints, in the order of the service-ips elements.
func readTargets(file string) ([]target, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	endpoints := map[string][]netip.Addr{}
	type elem struct {
		ip    netip.Addr
		port  uint16
		chain string
	}
	var elems []elem
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	chain := ""
	for sc.Scan() {
		line := sc.Text()
		if m := chainHead.FindStringSubmatch(line); m != nil {
			chain = m[1]
			continue
		}
		if chain != "" {
			if line == "\t}" {
				chain = ""
				continue
			}
			for _, m := range endpointElem.FindAllStringSubmatch(line, -1) {
				endpoints[chain] = append(endpoints[chain], netip.MustParseAddr(m[1]))
			}
			continue
		}
		for _, m := range serviceElem.FindAllStringSubmatch(line+" ", -1) {
			var port int
			fmt.Sscan(m[2], &port)
			elems = append(elems, elem{netip.MustParseAddr(m[1]), uint16(port), m[3]})
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	var out []target
	for _, e := range elems {
		if eps := endpoints[e.chain]; len(eps) > 0 {
			out = append(out, target{clusterIP: e.ip, port: e.port, endpoints: eps})
		}
	}
	return out, nil
}

// localNode is a namespace of the replay: a ruleset, the endpoints on its
// loopback.
type localNode struct {
	name, ns string
	node     *benchnode.Node
}

// setup makes the namespace as kpng-sidebyside's node (benchnode) and loads
// the ruleset in file with nft -f.
func (l *localNode) setup(targets []target, file string) error {
	var eps []netip.Addr
	for _, t := range targets {
		eps = append(eps, t.endpoints...)
	}
	var err error
	if l.node, err = benchnode.Make(l.ns, eps); err != nil {
		return err
	}
	cmd := exec.Command("ip", "netns", "exec", l.ns, "nft", "-f", file)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft -f %s: %w: %s", file, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// close removes the namespace.
func (l *localNode) close() {
	if l.node != nil {
		l.node.Close()
	}
}
