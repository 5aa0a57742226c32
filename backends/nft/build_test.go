package nft

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

// cidrs parses source ranges as the model holds them (model.ParseCIDRs).
func cidrs(texts ...string) []netip.Prefix {
	ps, bad := model.ParseCIDRs(texts...)
	if len(bad) > 0 {
		panic(fmt.Sprintf("bad test CIDRs %v", bad))
	}
	return ps
}

func ep(addr string, local bool) *model.Endpoint {
	return &model.Endpoint{IPs: ipset(addr), Ready: true, Serving: true, Local: local}
}

func svc(ns, name string, cluster model.IPSet, ports ...*model.PortMapping) *model.Service {
	return &model.Service{Namespace: ns, Name: name, Type: "ClusterIP", IPs: model.ServiceIPs{ClusterIPs: cluster}, Ports: ports}
}

func tcp(port, target int32) *model.PortMapping {
	return &model.PortMapping{Protocol: model.TCP, Port: port, TargetPort: target}
}

func udp(port, target int32) *model.PortMapping {
	return &model.PortMapping{Protocol: model.UDP, Port: port, TargetPort: target}
}

// goldenCases are the states whose rulesets are in testdata/<name>.golden.
func goldenCases() map[string][]*model.ServiceEndpoints {
	named := &model.PortMapping{Name: "http", Protocol: model.TCP, Port: 80, TargetPortName: "web"}
	withOverride := func(addr string, port int32) *model.Endpoint {
		e := ep(addr, false)
		e.PortOverrides = map[string]int32{"http": port}
		return e
	}
	external := svc("default", "kpng-example", model.IPSet{})
	external.IPs.Headless = true
	external.IPs.ExternalIPs = ipset("10.0.0.55", "1000::55")
	external.Ports = []*model.PortMapping{tcp(6000, 6000)}
	extLocal := svc("default", "ext-local", ipset("10.96.0.20"), tcp(80, 8080))
	extLocal.IPs.ExternalIPs = ipset("192.0.2.20")
	extLocal.ExternalTrafficToLocal = true
	intLocal := svc("default", "int-local", ipset("10.96.0.30"), tcp(80, 8080))
	intLocal.InternalTrafficToLocal = true
	notReady := ep("10.1.0.9", false)
	notReady.Ready, notReady.Serving = false, false

	return map[string][]*model.ServiceEndpoints{
		"clusterip-dualstack": {{
			Service:   svc("default", "web", ipset("10.96.0.10", "fd00:10:96::10"), tcp(80, 8080), udp(53, 5353)),
			Endpoints: []*model.Endpoint{ep("10.1.0.2", false), ep("10.1.0.3", true), ep("fd00:1::2", false)},
		}},
		"external-ips": {
			{Service: external, Endpoints: []*model.Endpoint{ep("11.0.1.2", false), ep("11.0.2.2", true), ep("1100::102", false), ep("1100::202", true)}},
			{Service: extLocal, Endpoints: []*model.Endpoint{ep("10.1.0.2", false), ep("10.1.0.3", true)}},
		},
		"no-endpoints": {
			{Service: svc("default", "empty", ipset("10.96.0.40", "fd00:10:96::40"), tcp(80, 8080), udp(53, 53))},
			{Service: svc("default", "not-ready", ipset("10.96.0.41"), tcp(80, 8080)), Endpoints: []*model.Endpoint{notReady}},
			// Endpoints of one family only: the other family rejects.
			{Service: svc("default", "v4-only-endpoints", ipset("10.96.0.42", "fd00:10:96::42"), tcp(80, 8080)), Endpoints: []*model.Endpoint{ep("10.1.0.2", false)}},
			{Service: intLocal, Endpoints: []*model.Endpoint{ep("10.1.0.2", false)}},
		},
		// Three shards of IPv4 (1, 2 and 3 endpoints): their rules behind
		// the services chain's cluster-IP check, in shards-v4; one of
		// IPv6, its rule in the services chain.
		"three-shards": {
			{Service: svc("default", "one", ipset("10.96.0.61", "fd00:10:96::61"), tcp(80, 8080)), Endpoints: []*model.Endpoint{ep("10.1.0.2", false), ep("fd00:1::2", false)}},
			{Service: svc("default", "two", ipset("10.96.0.62"), tcp(80, 8080)), Endpoints: []*model.Endpoint{ep("10.1.0.2", false), ep("10.1.0.3", false)}},
			{Service: svc("default", "three", ipset("10.96.0.63"), udp(53, 5353)), Endpoints: []*model.Endpoint{ep("10.1.0.2", false), ep("10.1.0.3", false), ep("10.1.0.4", false)}},
		},
		"named-ports": {{
			Service: svc("default", "named", ipset("10.96.0.50"), named),
			Endpoints: []*model.Endpoint{
				withOverride("10.1.0.2", 8080), withOverride("10.1.0.3", 9090),
				withOverride("10.1.0.4", 0), // does not serve "http"
			},
		}},
		"two-services": {
			{Service: svc("app", "a", ipset("10.96.1.1"), tcp(443, 8443)), Endpoints: []*model.Endpoint{ep("10.1.1.1", false)}},
			{Service: svc("other", "b", ipset("fd00:10:96::2:1"), &model.PortMapping{Protocol: model.SCTP, Port: 3868, TargetPort: 3868}), Endpoints: []*model.Endpoint{ep("fd00:1::1:1", false), ep("fd00:1::1:2", false)}},
		},
		"nodeport-lb-firewall": {{
			Service: func() *model.Service {
				s := svc("default", "lb", ipset("10.96.0.60", "fd00:10:96::60"),
					&model.PortMapping{Protocol: model.TCP, Port: 80, TargetPort: 8080, NodePort: 30080})
				s.Type = "LoadBalancer"
				s.IPs.LoadBalancerIPs = ipset("192.0.2.60", "2001:db8::60")
				s.LoadBalancerSourceRanges = cidrs("198.51.100.0/24", "203.0.113.7/32", "::ffff:192.0.2.0/120")
				return s
			}(),
			Endpoints: []*model.Endpoint{ep("10.1.0.2", true), ep("fd00:1::2", false)},
		}},
		"affinity-local-policy": {{
			Service: func() *model.Service {
				s := svc("default", "sticky", ipset("10.96.0.70"), &model.PortMapping{Protocol: model.UDP, Port: 53, TargetPort: 53, NodePort: 30053})
				s.Type = "NodePort"
				s.ClientIPAffinity = &model.ClientIPAffinity{TimeoutSeconds: 600}
				s.ExternalTrafficToLocal = true
				return s
			}(),
			Endpoints: []*model.Endpoint{ep("10.1.0.2", false), ep("10.1.0.3", true)},
		}},
		"local-policy-no-local-endpoint": {{
			Service: func() *model.Service {
				s := svc("default", "remote-only", ipset("10.96.0.80", "fd00:10:96::80"), &model.PortMapping{Protocol: model.TCP, Port: 80, TargetPort: 8080, NodePort: 30080})
				s.Type = "LoadBalancer"
				s.IPs.LoadBalancerIPs = ipset("192.0.2.80")
				s.ExternalTrafficToLocal = true
				s.InternalTrafficToLocal = true
				return s
			}(),
			// Both on other nodes; IPv6 has none at all (reject).
			Endpoints: []*model.Endpoint{ep("10.1.0.2", false), ep("10.1.0.3", false)},
		}},
		// Every rule kind in both families (TestKernelListingMatchesText
		// checks that some case covers each): session affinity with a
		// Local policy and local endpoints (affinity check and update,
		// balance map and single goto, DNAT, source rules), source
		// ranges containing a node IP (allow, drop), cluster CIDRs
		// (masquerade marks with exceptions), and services without
		// endpoints (reject) or without local ones (drop).
		"every-rule-kind": everyRuleKind(),
		"problems": {
			{Service: svc("default", "bad", ipset("10.96.2.1"), &model.PortMapping{Protocol: 9, Port: 80, TargetPort: 80}, tcp(70000, 80), tcp(81, 81))},
			// Same cluster IP and port as default/bad: the first one keeps it.
			{Service: svc("default", "dup", ipset("10.96.2.1"), tcp(81, 82)), Endpoints: []*model.Endpoint{ep("10.1.0.2", false)}},
		},
	}
}

// everyRuleKind is the state of the golden case "every-rule-kind".
func everyRuleKind() []*model.ServiceEndpoints {
	sticky := svc("default", "sticky", ipset("10.96.3.1", "fd00:10:96::3:1"), &model.PortMapping{Protocol: model.TCP, Port: 80, TargetPort: 8080, NodePort: 30081})
	sticky.Type = "LoadBalancer"
	sticky.IPs.LoadBalancerIPs = ipset("192.0.2.91", "2001:db8::91")
	sticky.LoadBalancerSourceRanges = cidrs("198.51.100.0/24", "203.0.113.7/32", "2001:db8:1::/64", "2001:db8:2::7/128")
	sticky.ClientIPAffinity = &model.ClientIPAffinity{TimeoutSeconds: 90}
	sticky.ExternalTrafficToLocal = true
	plain := svc("default", "plain", ipset("10.96.3.2", "fd00:10:96::3:2"), udp(53, 5353))
	plain.IPs.ExternalIPs = ipset("192.0.2.92", "2001:db8::92")
	remote := svc("default", "remote-only", ipset("10.96.3.3", "fd00:10:96::3:3"), &model.PortMapping{Protocol: model.TCP, Port: 80, TargetPort: 8080, NodePort: 30083})
	remote.Type = "NodePort"
	remote.ExternalTrafficToLocal = true
	// External IPs of both families, Local policy, no local endpoint:
	// drop elements in the no-endpoint-services maps (those of its node
	// port go to the nodeport-drop chains).
	remote.IPs.ExternalIPs = ipset("192.0.2.93", "2001:db8::93")
	return []*model.ServiceEndpoints{
		{Service: sticky, Endpoints: []*model.Endpoint{ep("10.1.0.2", true), ep("10.1.0.3", false), ep("fd00:1::2", true), ep("fd00:1::3", false)}},
		{Service: plain, Endpoints: []*model.Endpoint{ep("10.1.0.4", false), ep("fd00:1::4", false)}},
		{Service: remote, Endpoints: []*model.Endpoint{ep("10.1.0.5", false), ep("fd00:1::5", false)}},
		{Service: svc("default", "empty", ipset("10.96.3.4", "fd00:10:96::3:4"), tcp(80, 8080))},
	}
}

// goldenOptions are the options of the golden cases that do not use the
// defaults.
var goldenOptions = map[string]Options{
	"affinity-local-policy": {
		ClusterCIDRs:      []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("10.2.0.0/16")},
		MasqueradeBit:     8,
		NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("192.168.1.0/24"), netip.MustParsePrefix("fd00:1::/64")},
	},
	// The node's IPv4 address is inside a source range: the load-balancer
	// IP is allowed as a source too.
	"nodeport-lb-firewall":           {MasqueradeAll: true, NodeIPs: []netip.Addr{netip.MustParseAddr("198.51.100.9"), netip.MustParseAddr("fd00::9")}},
	"local-policy-no-local-endpoint": {ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}},
	"every-rule-kind": {
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("10.2.0.0/16"),
			netip.MustParsePrefix("fd00:1::/64"), netip.MustParsePrefix("fd00:2::/64")},
		NodeIPs: []netip.Addr{netip.MustParseAddr("198.51.100.9"), netip.MustParseAddr("2001:db8:1::9")},
	},
}

// goldenClusters are the cluster-level facts of the golden cases that
// have some: service CIDRs merged where they overlap or touch, one range
// that is not a prefix, one up to the family's last address.
var goldenClusters = map[string]*model.Cluster{
	"every-rule-kind": {ServiceCIDRs: []netip.Prefix{
		netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("10.96.1.0/24"),
		netip.MustParsePrefix("10.97.0.0/24"), netip.MustParsePrefix("10.97.1.0/24"),
		netip.MustParsePrefix("10.98.0.0/24"), netip.MustParsePrefix("10.98.1.0/25"),
		netip.MustParsePrefix("fd00:10:96::/108"), netip.MustParsePrefix("ffff:ffff::/32"),
	}},
}

// goldenText is the ruleset of items built with opts and the cluster
// facts c, followed by its problems.
func goldenText(opts Options, c *model.Cluster, items []*model.ServiceEndpoints) string {
	rs, problems := buildRulesetCluster(TableName("test"), opts, c, items)
	var b strings.Builder
	b.WriteString(rs.Text())
	for _, p := range problems {
		fmt.Fprintf(&b, "# problem: %v\n", p)
	}
	return b.String()
}

// TestGolden compares the ruleset of each state with testdata/<name>.golden
// (go test -run TestGolden -update rewrites them).
func TestGolden(t *testing.T) {
	for name, items := range goldenCases() {
		t.Run(name, func(t *testing.T) {
			got := goldenText(goldenOptions[name], goldenClusters[name], items)
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
				t.Errorf("ruleset of %s (-golden +got):\n%s", name, diff)
			}
		})
	}
}

// TestBuildOddInput checks that odd states are built without panicking,
// with their problems reported.
func TestBuildOddInput(t *testing.T) {
	weird := svc("default", "weird", ipset("10.96.9.1"), nil, &model.PortMapping{Protocol: model.UDP, Port: 53, TargetPort: 53, NodePort: 70000},
		&model.PortMapping{Protocol: model.TCP, Port: 80, TargetPortName: "missing"})
	weird.ClientIPAffinity = &model.ClientIPAffinity{}
	weird.IPs.LoadBalancerIPs = model.IPSet{V4: []string{"not-an-ip"}, V6: []string{"10.0.0.1"}}
	weird.LoadBalancerSourceRanges = []netip.Prefix{{}}
	items := []*model.ServiceEndpoints{
		nil,
		{Service: nil},
		{Service: weird, Endpoints: []*model.Endpoint{nil, {}, ep("10.1.0.2", true), {IPs: model.IPSet{V4: []string{"fd00::1"}}, Ready: true}}},
	}
	rs, problems := buildRuleset("t", Options{}, items)
	if len(problems) == 0 {
		t.Errorf("no problems reported for %s", rs.Text())
	}
	for _, want := range []string{"node port 70000", "loadBalancer ingress IPs: bad ipv4 address \"not-an-ip\"", "is not an ipv4 address", "loadBalancerSourceRanges"} {
		found := false
		for _, p := range problems {
			found = found || strings.Contains(p.Error(), want)
		}
		if !found {
			t.Errorf("no problem mentions %q: %v", want, problems)
		}
	}
}

// TestHairpinOnlyLocalEndpoints checks that the hairpin sets hold the
// addresses of the endpoints that may run on this node: local ones and
// those whose node is not known, not another node's (as kube-proxy), and
// that an endpoint moving to this node brings its address in.
func TestHairpinOnlyLocalEndpoints(t *testing.T) {
	remote := ep("10.1.0.3", false)
	remote.NodeName = "node-b"
	unknown := ep("10.1.0.4", false)
	local := ep("10.1.0.2", true)
	local.NodeName = "node-a"
	remote6 := ep("fd00:1::3", false)
	remote6.NodeName = "node-b"
	web := svc("default", "web", ipset("10.96.0.1", "fd00:10:96::1"), tcp(80, 8080))
	items := []*model.ServiceEndpoints{{Service: web, Endpoints: []*model.Endpoint{local, remote, unknown, remote6}}}
	rs, problems := buildRuleset("t", Options{}, items)
	if len(problems) != 0 {
		t.Fatalf("problems: %v", problems)
	}
	want := []netip.Addr{netip.MustParseAddr("10.1.0.2"), netip.MustParseAddr("10.1.0.4")}
	if diff := cmp.Diff(want, rs.Hairpin, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("hairpin addresses (-want +got):\n%s", diff)
	}
	if n := len(rs.endpoints()); n != 4 {
		t.Errorf("%d endpoint elements, want 4 (a remote endpoint is still balanced to)", n)
	}
	moved := *remote
	moved.Local, moved.NodeName = true, "node-a"
	items[0].Endpoints[1] = &moved
	rs, _ = buildRuleset("t", Options{}, items)
	if !slices.Contains(rs.Hairpin, netip.MustParseAddr("10.1.0.3")) {
		t.Errorf("hairpin addresses %v: the endpoint now local is missing", rs.Hairpin)
	}
}
