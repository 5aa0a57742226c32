package iptables

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"sigs.k8s.io/kpng/model"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func ipset(addrs ...string) model.IPSet {
	s, bad := model.NewIPSet(addrs...)
	if len(bad) > 0 {
		panic(fmt.Sprintf("bad test addresses %v", bad))
	}
	return s
}

func ep(addr string, local bool) *model.Endpoint {
	return &model.Endpoint{IPs: ipset(addr), Ready: true, Serving: true, Local: local}
}

func svc(name string, cluster model.IPSet, ports ...*model.PortMapping) *model.Service {
	return &model.Service{Namespace: "default", Name: name, Type: "ClusterIP", IPs: model.ServiceIPs{ClusterIPs: cluster}, Ports: ports}
}

func port(proto model.Protocol, port, target int32) *model.PortMapping {
	return &model.PortMapping{Protocol: proto, Port: port, TargetPort: target}
}

// testOptions are the options of the golden cases but where a case sets
// its own.
var testOptions = Options{
	ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("fd00:1::/64")},
	NodeIPs:      []netip.Addr{netip.MustParseAddr("192.168.0.2")},
}

// goldenCase is a state and the options it is planned with.
type goldenCase struct {
	opts        Options
	randomFully bool
	services    []*model.ServiceEndpoints
}

// goldenCases are the states whose restore input is in
// testdata/<name>.golden.
func goldenCases() map[string]goldenCase {
	headless := svc("blog", model.IPSet{}, port(model.TCP, 6000, 6000))
	headless.IPs.Headless = true
	headless.IPs.ExternalIPs = ipset("10.0.0.55", "1000::55")

	lb := svc("lb", ipset("10.96.0.40", "fd00:10:96::40"), port(model.TCP, 80, 8080))
	lb.Type = "LoadBalancer"
	lb.Ports[0].NodePort = 30080
	lb.IPs.LoadBalancerIPs = ipset("192.0.2.40", "2001:db8::40")
	lb.LoadBalancerSourceRanges, _ = model.ParseCIDRs("192.168.0.0/24")

	extLocal := svc("ext-local", ipset("10.96.0.20", "fd00:10:96::20"), port(model.TCP, 80, 8080))
	extLocal.Type = "NodePort"
	extLocal.Ports[0].NodePort = 30020
	extLocal.IPs.ExternalIPs = ipset("192.0.2.20")
	extLocal.ExternalTrafficToLocal = true
	extLocalNone := *extLocal
	extLocalNone.Name = "ext-local-none"
	extLocalNone.IPs = model.ServiceIPs{ClusterIPs: ipset("10.96.0.21"), ExternalIPs: ipset("192.0.2.21")}
	extLocalNone.Ports = []*model.PortMapping{{Protocol: model.TCP, Port: 80, TargetPort: 8080, NodePort: 30021}}
	intLocal := svc("int-local", ipset("10.96.0.30"), port(model.UDP, 53, 5353))
	intLocal.InternalTrafficToLocal = true

	affinity := svc("sticky", ipset("10.96.0.50"), port(model.TCP, 80, 8080))
	affinity.ClientIPAffinity = &model.ClientIPAffinity{TimeoutSeconds: 60}

	named := &model.PortMapping{Name: "http", Protocol: model.TCP, Port: 80, TargetPortName: "web"}
	override := ep("10.1.0.7", false)
	override.PortOverrides = map[string]int32{"http": 8081}
	notServing := ep("10.1.0.8", false)

	bad := svc("bad", ipset("10.96.0.99"), port(model.ProtocolUnknown, 1, 1), port(model.TCP, 70000, 1), port(model.TCP, 80, 8080), port(model.TCP, 80, 9090))

	return map[string]goldenCase{
		"clusterip-dualstack": {opts: testOptions, randomFully: true, services: []*model.ServiceEndpoints{{
			Service:   svc("web", ipset("10.96.0.10", "fd00:10:96::10"), port(model.TCP, 80, 8080), port(model.UDP, 53, 5353)),
			Endpoints: []*model.Endpoint{ep("10.1.0.2", false), ep("10.1.0.3", true), ep("10.1.0.4", true), ep("fd00:1::2", false)},
		}}},
		"headless-external-ips-masquerade-all": {opts: Options{MasqueradeAll: true, MasqueradeBit: 3}, services: []*model.ServiceEndpoints{
			{Service: headless, Endpoints: []*model.Endpoint{ep("11.0.1.2", false), ep("1100::102", false)}},
			{Service: svc("web", ipset("10.96.0.10"), port(model.TCP, 80, 8080)), Endpoints: []*model.Endpoint{ep("10.1.0.2", false)}},
		}},
		"loadbalancer-source-ranges-nodeport-addresses": {
			opts:     Options{ClusterCIDRs: testOptions.ClusterCIDRs, NodeIPs: testOptions.NodeIPs, NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("192.168.0.0/24")}},
			services: []*model.ServiceEndpoints{{Service: lb, Endpoints: []*model.Endpoint{ep("10.1.0.2", false), ep("fd00:1::2", true)}}},
		},
		"local-policies": {opts: testOptions, services: []*model.ServiceEndpoints{
			{Service: extLocal, Endpoints: []*model.Endpoint{ep("10.1.0.2", false), ep("10.1.0.3", true), ep("fd00:1::3", false)}},
			{Service: &extLocalNone, Endpoints: []*model.Endpoint{ep("10.1.0.2", false)}},
			{Service: intLocal, Endpoints: []*model.Endpoint{ep("10.1.0.2", false), ep("10.1.0.3", true)}},
		}},
		"affinity-named-ports": {opts: testOptions, services: []*model.ServiceEndpoints{
			{Service: affinity, Endpoints: []*model.Endpoint{ep("10.1.0.2", false), ep("10.1.0.3", false)}},
			{Service: svc("named", ipset("10.96.0.60"), named), Endpoints: []*model.Endpoint{override, notServing}},
		}},
		"no-endpoints": {opts: testOptions, services: []*model.ServiceEndpoints{
			{Service: svc("empty", ipset("10.96.0.70", "fd00:10:96::70"), port(model.TCP, 80, 8080), port(model.UDP, 53, 53), port(model.SCTP, 9, 9))},
		}},
		"problems": {opts: testOptions, services: []*model.ServiceEndpoints{
			{Service: bad, Endpoints: []*model.Endpoint{ep("10.1.0.2", false)}},
		}},
		"conflicts": {opts: testOptions, services: conflicts()},
	}
}

// conflicts are services claiming the same destinations: the first in
// key order keeps each (a: the external IP and the node port; b has no
// endpoints, and its cluster IP is b's only); c keeps nothing but its
// cluster IP.
func conflicts() []*model.ServiceEndpoints {
	mk := func(name, cluster string, eps ...*model.Endpoint) *model.ServiceEndpoints {
		s := svc(name, ipset(cluster), port(model.TCP, 80, 8080))
		s.Type = "NodePort"
		s.Ports[0].NodePort = 30080
		s.IPs.ExternalIPs = ipset("192.0.2.1")
		return &model.ServiceEndpoints{Service: s, Endpoints: eps}
	}
	return []*model.ServiceEndpoints{
		mk("a", "10.96.0.1", ep("10.1.0.2", false)),
		mk("b", "10.96.0.2"),
		mk("c", "10.96.0.1", ep("10.1.0.3", false)),
	}
}

// render is the text of a golden file: each family's restore input for
// both tables (with the stale chains given), the UDP destinations' reach,
// and the problems.
func render(p *plan, problems []error) string {
	var b strings.Builder
	for _, f := range families {
		fp := &p.Families[f]
		fmt.Fprintf(&b, "# %s\n", f)
		for _, table := range tables {
			b.Write(restoreInput(table, fp.table(table), nil))
		}
		var reach []string
		for d, eps := range fp.Reach {
			addr := d.Addr.String()
			if !d.Addr.Addr().IsValid() {
				addr = fmt.Sprintf("*:%d", d.Addr.Port())
			}
			reach = append(reach, fmt.Sprintf("# reach udp %s -> %v", addr, eps))
		}
		slices.Sort(reach)
		for _, r := range reach {
			b.WriteString(r + "\n")
		}
	}
	for _, e := range problems {
		fmt.Fprintf(&b, "# problem: %v\n", e)
	}
	return b.String()
}

// TestGolden checks the restore input of each golden case against
// testdata/<name>.golden (go test -run TestGolden -update rewrites them).
func TestGolden(t *testing.T) {
	for name, tc := range goldenCases() {
		t.Run(name, func(t *testing.T) {
			pl := planner{prefix: ChainPrefix("golden"), opts: tc.opts, randomFully: tc.randomFully}
			p, problems := pl.build(tc.services)
			checkPlan(t, p)
			got := render(p, problems)
			path := filepath.Join("testdata", name+".golden")
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if diff := cmp.Diff(string(want), got); diff != "" {
				t.Errorf("%s differs (-want +got):\n%s", path, diff)
			}
		})
	}
}

// checkPlan checks what any plan must be: chain names within
// MaxChainName and unique, every -j target one of the table's chains or
// a built-in target, and no chain jumping to an empty chain.
func checkPlan(t *testing.T, p *plan) {
	t.Helper()
	builtin := map[string]bool{"RETURN": true, "DROP": true, "REJECT": true, "DNAT": true, "MARK": true, "MASQUERADE": true, "ACCEPT": true}
	for _, f := range families {
		for _, table := range tables {
			tp := p.Families[f].table(table)
			seen := map[string]bool{}
			for _, c := range tp.Chains {
				if len(c.Name) > MaxChainName {
					t.Errorf("%s %s: chain %s: %d characters, more than %d", f, table, c.Name, len(c.Name), MaxChainName)
				}
				if seen[c.Name] {
					t.Errorf("%s %s: chain %s declared twice", f, table, c.Name)
				}
				seen[c.Name] = true
				for _, r := range c.Rules {
					fields := strings.Fields(r)
					i := slices.Index(fields, "-j")
					if i < 0 || i+1 >= len(fields) {
						t.Errorf("%s %s: chain %s: rule %q has no target", f, table, c.Name, r)
						continue
					}
					target := fields[i+1]
					if builtin[target] {
						continue
					}
					tc, ok := tp.byName[target]
					if !ok {
						t.Errorf("%s %s: chain %s: rule %q jumps to %s, not a chain of the table", f, table, c.Name, r, target)
					} else if len(tc.Rules) == 0 && !strings.HasSuffix(target, chainNodePorts) {
						t.Errorf("%s %s: chain %s: rule %q jumps to the empty chain %s", f, table, c.Name, r, target)
					}
				}
			}
		}
	}
}

// TestChainNames checks the chain names: the prefix per proxier, the
// 28-character limit whatever the identity, and distinct names for
// distinct identities.
func TestChainNames(t *testing.T) {
	long := strings.Repeat("a", 63)
	for _, tc := range []struct {
		name       string
		proxy      string
		kind, id   string
		wantPrefix string
	}{
		{"short", "x", kindCluster, "IPv4/default/web/tcp/80", "KPNG-"},
		{"longest names", long, kindAffinity, "IPv6/" + long + "/" + long + "/sctp/65535/[fd00::1]:65535", "KPNG-"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := ChainPrefix(tc.proxy)
			if len(prefix) != 12 || !strings.HasPrefix(prefix, tc.wantPrefix) || !strings.HasSuffix(prefix, "-") {
				t.Errorf("ChainPrefix(%q) = %q, want KPNG-XXXXXX-", tc.proxy, prefix)
			}
			name := serviceChain(prefix, tc.kind, tc.id)
			if len(name) != MaxChainName {
				t.Errorf("chain %q: %d characters, want %d", name, len(name), MaxChainName)
			}
			if again := serviceChain(prefix, tc.kind, tc.id); again != name {
				t.Errorf("chain name not deterministic: %q then %q", name, again)
			}
			if other := serviceChain(prefix, tc.kind, tc.id+"x"); other == name {
				t.Errorf("identities %q and %q have the same chain %q", tc.id, tc.id+"x", name)
			}
			if fixed := prefix + chainMasqNonPod; len(fixed) > MaxChainName {
				t.Errorf("fixed chain %q: more than %d characters", fixed, MaxChainName)
			}
		})
	}
	if ChainPrefix("a") == ChainPrefix("b") {
		t.Errorf("proxiers a and b share the prefix %q", ChainPrefix("a"))
	}
	if got := ChainPrefix("kpng-example"); got != ChainPrefix("kpng-example") || strings.ContainsAny(got, "=/+") {
		t.Errorf("ChainPrefix(kpng-example) = %q: not stable or not a valid chain name", got)
	}
}

// TestHostileInput: values no Kubernetes API server lets through, but a
// state file or another controller may send, never reach the restore
// input: a zoned address is a problem, a name with a quote or a newline
// is written harmlessly.
func TestHostileInput(t *testing.T) {
	svc := &model.Service{Namespace: "evil\"\n-A INPUT -j DROP\n#", Name: "x", Type: "ClusterIP",
		IPs:   model.ServiceIPs{ClusterIPs: model.IPSet{V6: []string{"fd00::10"}}, ExternalIPs: model.IPSet{V6: []string{"fe80::1%eth0"}}},
		Ports: []*model.PortMapping{{Protocol: model.TCP, Port: 80, TargetPort: 8080}}}
	eps := []*model.Endpoint{{IPs: model.IPSet{V6: []string{"fe80::2%eth0"}}, Ready: true, Serving: true}, {IPs: model.IPSet{V6: []string{"1100::2"}}, Ready: true, Serving: true}}
	pl := planner{prefix: ChainPrefix("hostile")}
	p, problems := pl.build([]*model.ServiceEndpoints{{Service: svc, Endpoints: eps}})
	checkPlan(t, p)
	var input strings.Builder
	for _, f := range families {
		for _, table := range tables {
			input.Write(restoreInput(table, p.Families[f].table(table), nil))
		}
	}
	for _, line := range strings.Split(input.String(), "\n") {
		if strings.HasPrefix(line, "-A INPUT") || strings.Contains(line, "%eth0") || strings.Count(line, `"`)%2 != 0 {
			t.Errorf("hostile input reached the restore input: %q", line)
		}
	}
	if !strings.Contains(input.String(), "evil__-A_INPUT_-j_DROP__/x:80/tcp") {
		t.Errorf("the service's comment is not its name made safe:\n%s", input.String())
	}
	var zoned []string
	for _, e := range problems {
		if strings.Contains(e.Error(), "%eth0") {
			p := model.ProblemOf(svc.Key(), e)
			zoned = append(zoned, fmt.Sprintf("%s %s", p.Field, p.Reason))
		}
	}
	// Reported with the field and the reason (a *model.Problem each).
	if diff := cmp.Diff([]string{"spec.externalIPs BadField", "endpoints[].addresses BadField"}, zoned); diff != "" {
		t.Errorf("problems %v: want the zoned external IP and endpoint reported (-want +got):\n%s", problems, diff)
	}
}
