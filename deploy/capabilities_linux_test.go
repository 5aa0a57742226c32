package deploy_test

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"sigs.k8s.io/kpng/internal/netns"
)

// programmed says whether a backend's rules are in a namespace, given its
// variant's flags.
var programmed = map[string]func(ns *netns.NS, variant []string) bool{
	"to-nft": func(ns *netns.NS, _ []string) bool {
		out, _, err := ns.Exec(nil, "nft", "list", "tables")
		return err == nil && strings.Contains(out, "table ip kpng") && strings.Contains(out, "table ip6 kpng")
	},
	"to-iptables": func(ns *netns.NS, variant []string) bool {
		v := "nft"
		if slices.Contains(variant, "--iptables=legacy") {
			v = "legacy"
		}
		out, _, err := ns.Exec(nil, "iptables-"+v+"-save", "-t", "nat")
		return err == nil && strings.Contains(out, ":KPNG-")
	},
	// The service address on the proxier's interface (kpng-…), and a
	// connection to the service's port proxied to its endpoint.
	"to-userspace": func(ns *netns.NS, _ []string) bool {
		out, _, err := ns.Exec(nil, "ip", "-o", "addr", "show", "to", userspaceServiceIP.String()+"/32")
		if err != nil || !strings.Contains(out, " kpng-") {
			return false
		}
		a, err := ns.Ask("tcp", netip.AddrPortFrom(userspaceServiceIP, userspaceServicePort), netns.AskOptions{Timeout: 500 * time.Millisecond})
		return err == nil && a.Server == "endpoint" && a.Local == userspaceEndpoint
	},
}

// states gives the backends that need one a state of their own, and
// prepares the namespace for it; the others get the blog's state.
var states = map[string]func(t *testing.T, ns *netns.NS) string{
	"to-userspace": userspaceState,
}

// The userspace check's service: a cluster IP on port 80, below 1024, so
// that listening on it needs NET_BIND_SERVICE (a namespace's
// net.ipv4.ip_unprivileged_port_start is 1024), and its one endpoint, an
// identity server in the namespace.
var (
	userspaceServiceIP   = netip.MustParseAddr("10.96.0.80")
	userspaceServicePort = uint16(80)
	userspaceEndpoint    = netip.MustParseAddrPort("10.9.0.1:8080")
)

// userspaceState serves the userspace check's endpoint in ns and writes
// its service as a state file.
func userspaceState(t *testing.T, ns *netns.NS) string {
	t.Helper()
	ns.AddAddr("lo", userspaceEndpoint.Addr().String()+"/32")
	ns.Serve("endpoint", []netip.Addr{userspaceEndpoint.Addr()}, []uint16{userspaceEndpoint.Port()})
	state := fmt.Sprintf(`[{"Service": {"Namespace": "default", "Name": "web", "Type": "ClusterIP",
  "IPs": {"ClusterIPs": {"V4": [%q]}},
  "Ports": [{"Protocol": 1, "Port": %d, "TargetPort": %d}]},
 "Endpoints": [{"IPs": {"V4": [%q]}, "Local": true, "Ready": true, "Serving": true, "NodeName": "node-a"}]}]
`, userspaceServiceIP, userspaceServicePort, userspaceEndpoint.Port(), userspaceEndpoint.Addr())
	path := filepath.Join(t.TempDir(), "state.json")
	if err := os.WriteFile(path, []byte(state), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestCapabilities runs the backend of each DaemonSet, as the image's kpng
// with the blog's state (or its own, states) from a file, in a fresh
// network namespace, as root with exactly the capabilities the DaemonSet
// adds (what a container that drops ALL and adds them holds): the rules are
// programmed (for to-userspace: the service address held and a connection
// proxied). Without any one of them, they are not.
func TestCapabilities(t *testing.T) {
	netns.RequirePrivileged(t)
	netns.RequireCommands(t, "setpriv", "nft", "iptables-legacy-save", "iptables-nft-save")
	kpng := filepath.Join(buildImage(t).out, "kpng")
	blog, err := filepath.Abs(filepath.Join(root, "examples", "json", "testdata", "kpng-example.golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range daemonSets {
		p := decode(t, d.file)
		c := p.container(t)
		cmd := parseCommand(t, c, nil)
		backend := cmd.args[slices.Index(cmd.args, "to-local"):]
		caps := c.SecurityContext.Capabilities.Add
		check := programmed[d.backend]
		if check == nil {
			t.Fatalf("%s: no check of backend %s", d.file, d.backend)
		}
		state := func(*testing.T, *netns.NS) string { return blog }
		if s := states[d.backend]; s != nil {
			state = s
		}
		for _, variant := range d.variants {
			t.Run(fmt.Sprintf("%s%v/%v", d.backend, variant, caps), func(t *testing.T) {
				if ok, out := runWithCaps(t, kpng, state, append(slices.Clone(backend), variant...), caps, check, variant); !ok {
					t.Errorf("with %v, the rules were not programmed:\n%s", caps, out)
				}
			})
		}
		for _, drop := range caps {
			fewer := slices.DeleteFunc(slices.Clone(caps), func(c v1.Capability) bool { return c == drop })
			variant := d.variants[0]
			t.Run(fmt.Sprintf("%s%v/without-%s", d.backend, variant, drop), func(t *testing.T) {
				if ok, out := runWithCaps(t, kpng, state, append(slices.Clone(backend), variant...), fewer, check, variant); ok {
					t.Errorf("without %s, the rules were programmed: the capability is not needed\n%s", drop, out)
				}
			})
		}
	}
}

// runWithCaps runs `kpng file --input=<state> <backend…>` in a fresh network
// namespace (state prepares it and returns the state file) as root with
// only caps (setpriv's bounding set), until its
// rules are programmed (true) or it fails: it exits, or reports a round it
// could not apply (false). It returns kpng's output too.
func runWithCaps(t *testing.T, kpng string, state func(*testing.T, *netns.NS) string, backend []string, caps []v1.Capability, check func(*netns.NS, []string) bool, variant []string) (bool, string) {
	t.Helper()
	ns := netns.New(t, "caps")
	input := state(t, ns)
	bounding := "-all"
	for _, c := range caps {
		bounding += ",+" + strings.ToLower(string(c))
	}
	args := append([]string{"netns", "exec", ns.Name, "setpriv", "--bounding-set", bounding, "--inh-caps", "-all", "--",
		kpng, "file", "--input=" + input}, backend...)
	cmd := exec.Command("ip", args...)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() {
		_ = cmd.Process.Kill() // ip netns exec and setpriv exec kpng: this is kpng
		<-exited
	}
	deadline := time.After(30 * time.Second)
	for {
		if check(ns, variant) {
			stop()
			return true, out.String()
		}
		if strings.Contains(out.String(), "could not apply a round") {
			stop()
			return false, out.String()
		}
		select {
		case err := <-exited:
			if check(ns, variant) {
				return true, out.String()
			}
			return false, fmt.Sprintf("%s\n(exit: %v)", out.String(), err)
		case <-deadline:
			stop()
			t.Fatalf("after 30s, neither programmed nor failed:\n%s", out.String())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// syncBuffer is a bytes.Buffer that the process writes while the test
// reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
