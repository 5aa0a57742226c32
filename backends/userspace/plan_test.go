package userspace

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"sigs.k8s.io/kpng/model"
	"sigs.k8s.io/kpng/model/endpoints"
)

func ipset(addrs ...string) model.IPSet {
	s, _ := model.NewIPSet(addrs...)
	return s
}

func ep(addr string, local bool) *model.Endpoint {
	return &model.Endpoint{IPs: ipset(addr), Ready: true, Serving: true, Local: local}
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

var testNode = node{
	ips:           []netip.Addr{netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("fd00::2")},
	nodePortAddrs: []netip.Addr{netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("fd00::2")},
}

// summary is what a test compares of a frontend's route.
type summary struct {
	Kind     kind
	Verdict  endpoints.Verdict
	Targets  []netip.AddrPort
	Short    bool
	Cluster  []netip.AddrPort
	Affinity time.Duration
	Ranges   []netip.Prefix
	HoldNode bool
}

func summarize(m map[frontendKey]*route) map[string]summary {
	out := map[string]summary{}
	for k, r := range m {
		out[k.String()] = summary{r.kind, r.verdict, r.targets, r.shortCircuit, r.clusterTargets, r.affinity, r.sourceRanges, r.rangesHoldNode}
	}
	return out
}

func TestPlan(t *testing.T) {
	web := func(mod func(*model.Service)) *model.Service {
		s := &model.Service{
			Namespace: "default", Name: "web", Type: "ClusterIP",
			IPs: model.ServiceIPs{ClusterIPs: ipset("10.96.0.10", "fd00:10:96::10")},
			Ports: []*model.PortMapping{
				{Name: "http", Protocol: model.TCP, Port: 80, TargetPort: 8080},
				{Name: "dns", Protocol: model.UDP, Port: 53, TargetPort: 5353},
			},
		}
		if mod != nil {
			mod(s)
		}
		return s
	}
	eps := []*model.Endpoint{ep("11.0.1.2", false), ep("11.0.2.2", true), ep("1100::202", true)}
	for _, tc := range []struct {
		name     string
		svc      *model.Service
		eps      []*model.Endpoint
		want     map[string]summary
		problems []string
	}{{
		name: "cluster IPs, both families and protocols, endpoints of the family",
		svc:  web(nil), eps: eps,
		want: map[string]summary{
			"TCP 10.96.0.10:80":       {Kind: clusterIP, Targets: []netip.AddrPort{ap("11.0.1.2:8080"), ap("11.0.2.2:8080")}},
			"UDP 10.96.0.10:53":       {Kind: clusterIP, Targets: []netip.AddrPort{ap("11.0.1.2:5353"), ap("11.0.2.2:5353")}},
			"TCP [fd00:10:96::10]:80": {Kind: clusterIP, Targets: []netip.AddrPort{ap("[1100::202]:8080")}},
			"UDP [fd00:10:96::10]:53": {Kind: clusterIP, Targets: []netip.AddrPort{ap("[1100::202]:5353")}},
		},
	}, {
		name: "no endpoints rejects; a family without endpoints rejects alone",
		svc:  web(func(s *model.Service) { s.Ports = s.Ports[:1] }), eps: eps[:2],
		want: map[string]summary{
			"TCP 10.96.0.10:80":       {Kind: clusterIP, Targets: []netip.AddrPort{ap("11.0.1.2:8080"), ap("11.0.2.2:8080")}},
			"TCP [fd00:10:96::10]:80": {Kind: clusterIP, Verdict: endpoints.Reject, Targets: []netip.AddrPort{}},
		},
	}, {
		name: "node ports, external and load-balancer IPs with the Local policy, affinity, source ranges",
		svc: web(func(s *model.Service) {
			s.Type = "LoadBalancer"
			s.Ports = s.Ports[:1]
			s.Ports[0].NodePort = 30080
			s.IPs.ClusterIPs = ipset("10.96.0.10")
			s.IPs.ExternalIPs = ipset("10.0.0.55")
			s.IPs.LoadBalancerIPs = ipset("192.0.2.10")
			s.ExternalTrafficToLocal = true
			s.ClientIPAffinity = &model.ClientIPAffinity{TimeoutSeconds: 60}
			s.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("10.0.0.1/24"), {}, netip.MustParsePrefix("2001:db8::/32")}
		}),
		eps: eps,
		want: map[string]summary{
			"TCP 10.96.0.10:80": {Kind: clusterIP, Targets: []netip.AddrPort{ap("11.0.1.2:8080"), ap("11.0.2.2:8080")}, Affinity: time.Minute},
			"TCP 10.0.0.55:80": {Kind: externalIP, Targets: []netip.AddrPort{ap("11.0.2.2:8080")}, Short: true,
				Cluster: []netip.AddrPort{ap("11.0.1.2:8080"), ap("11.0.2.2:8080")}, Affinity: time.Minute},
			"TCP 192.0.2.10:80": {Kind: loadBalancerIP, Targets: []netip.AddrPort{ap("11.0.2.2:8080")}, Short: true,
				Cluster: []netip.AddrPort{ap("11.0.1.2:8080"), ap("11.0.2.2:8080")}, Affinity: time.Minute,
				Ranges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}, HoldNode: true},
			"TCP 10.0.0.2:30080": {Kind: nodePort, Targets: []netip.AddrPort{ap("11.0.2.2:8080")}, Short: true,
				Cluster: []netip.AddrPort{ap("11.0.1.2:8080"), ap("11.0.2.2:8080")}, Affinity: time.Minute},
		},
		problems: []string{`service default/web: loadBalancerSourceRanges: an invalid (zero) prefix`},
	}, {
		name: "Local policy without a local endpoint drops; headless keeps its external IPs",
		svc: web(func(s *model.Service) {
			s.Ports = s.Ports[:1]
			s.IPs = model.ServiceIPs{Headless: true, ExternalIPs: ipset("10.0.0.55")}
			s.ExternalTrafficToLocal = true
		}),
		eps: eps[:1],
		want: map[string]summary{
			"TCP 10.0.0.55:80": {Kind: externalIP, Verdict: endpoints.Drop, Targets: []netip.AddrPort{}, Short: true, Cluster: []netip.AddrPort{ap("11.0.1.2:8080")}},
		},
	}, {
		name: "short-circuits use the cluster endpoints, whatever internalTrafficPolicy",
		svc: web(func(s *model.Service) {
			s.Ports = s.Ports[:1]
			s.IPs.ClusterIPs = ipset("10.96.0.10")
			s.IPs.ExternalIPs = ipset("10.0.0.55")
			s.ExternalTrafficToLocal, s.InternalTrafficToLocal = true, true
		}),
		eps: eps[:1],
		want: map[string]summary{
			"TCP 10.96.0.10:80": {Kind: clusterIP, Verdict: endpoints.Drop, Targets: []netip.AddrPort{}},
			"TCP 10.0.0.55:80":  {Kind: externalIP, Verdict: endpoints.Drop, Targets: []netip.AddrPort{}, Short: true, Cluster: []netip.AddrPort{ap("11.0.1.2:8080")}},
		},
	}, {
		name: "bad ports are problems, the rest is served",
		svc: web(func(s *model.Service) {
			s.IPs.ClusterIPs = ipset("10.96.0.10")
			s.Ports = []*model.PortMapping{
				{Name: "a", Protocol: model.TCP, Port: 80, TargetPort: 8080},
				{Name: "dup", Protocol: model.TCP, Port: 80, TargetPort: 9090},
				{Name: "sctp", Protocol: model.SCTP, Port: 81, TargetPort: 81},
				{Name: "big", Protocol: model.TCP, Port: 70000, TargetPort: 81},
				nil,
			}
		}),
		eps: eps[:1],
		want: map[string]summary{
			"TCP 10.96.0.10:80": {Kind: clusterIP, Targets: []netip.AddrPort{ap("11.0.1.2:8080")}},
		},
		problems: []string{`port "dup": protocol and port TCP/80 already used by port "a"`, `port "sctp": protocol 3 (SCTP) not supported`, `port "big": port 70000 out of range`},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got, problems := plan(&model.ServiceEndpoints{Service: tc.svc, Endpoints: tc.eps}, testNode)
			if diff := cmp.Diff(tc.want, summarize(got), cmpopts.EquateComparable(netip.AddrPort{}, netip.Prefix{}), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("frontends (-want +got):\n%s", diff)
			}
			if len(problems) != len(tc.problems) {
				t.Errorf("problems %v, want %d", problems, len(tc.problems))
			}
			for i, p := range problems {
				if i < len(tc.problems) && !strings.Contains(p.Error(), tc.problems[i]) {
					t.Errorf("problem %d = %q, want it to contain %q", i, p, tc.problems[i])
				}
			}
		})
	}
}

func TestPlanNamedTargetPorts(t *testing.T) {
	svc := &model.Service{Namespace: "default", Name: "web", IPs: model.ServiceIPs{ClusterIPs: ipset("10.96.0.10")},
		Ports: []*model.PortMapping{{Name: "http", Protocol: model.TCP, Port: 80, TargetPortName: "web"}}}
	a, b, c := ep("11.0.0.1", false), ep("11.0.0.2", false), ep("11.0.0.3", false)
	a.PortOverrides = map[string]int32{"http": 8080}
	b.PortOverrides = map[string]int32{"http": 9090}
	c.PortOverrides = map[string]int32{"http": 0} // does not serve it
	got, _ := plan(&model.ServiceEndpoints{Service: svc, Endpoints: []*model.Endpoint{a, b, c}}, testNode)
	r := got[frontendKey{model.TCP, ap("10.96.0.10:80")}]
	if r == nil {
		t.Fatalf("no frontend: %v", got)
	}
	if want := []netip.AddrPort{ap("11.0.0.1:8080"), ap("11.0.0.2:9090")}; !cmp.Equal(r.targets, want, cmpopts.EquateComparable(netip.AddrPort{})) {
		t.Errorf("targets %v, want %v", r.targets, want)
	}
}

func TestRouteListens(t *testing.T) {
	for _, tc := range []struct {
		r    route
		want bool
	}{
		{route{verdict: endpoints.Forward}, true},
		{route{verdict: endpoints.Drop}, true},
		{route{verdict: endpoints.Reject}, false},
		{route{verdict: endpoints.Reject, shortCircuit: true, clusterVerdict: endpoints.Reject}, false},
		{route{verdict: endpoints.Drop, shortCircuit: true, clusterVerdict: endpoints.Forward}, true},
	} {
		if got := tc.r.listens(); got != tc.want {
			t.Errorf("%+v listens() = %v, want %v", tc.r, got, tc.want)
		}
	}
}

func TestInterfaceName(t *testing.T) {
	if got := InterfaceName("web"); got != "kpng-web" {
		t.Errorf("InterfaceName(web) = %q", got)
	}
	long := InterfaceName("a-rather-long-proxy-name")
	if len(long) > maxInterfaceName || !strings.HasPrefix(long, "kpng-") || long == InterfaceName("a-rather-long-proxy-namf") {
		t.Errorf("InterfaceName(long) = %q: want kpng- and a hash, at most 15 bytes, different for another name", long)
	}
	if got := InterfaceName(""); len(got) > maxInterfaceName {
		t.Errorf("InterfaceName(\"\") = %q", got)
	}
}

func TestNodePortAddress(t *testing.T) {
	v4, v6 := netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("fd00::2")
	for _, tc := range []struct {
		prefixes []string
		v4, v6   bool
	}{
		{nil, true, true},
		{[]string{"10.0.0.0/24"}, true, true}, // no IPv6 prefix: IPv6 unrestricted, as kube-proxy
		{[]string{"10.0.0.0/24", "fd00:1::/64"}, true, false},
		{[]string{"192.168.0.0/16", "::/0"}, false, true},
	} {
		var ps []netip.Prefix
		for _, p := range tc.prefixes {
			ps = append(ps, netip.MustParsePrefix(p))
		}
		if got := nodePortAddress(ps, v4); got != tc.v4 {
			t.Errorf("%v: %s = %v, want %v", tc.prefixes, v4, got, tc.v4)
		}
		if got := nodePortAddress(ps, v6); got != tc.v6 {
			t.Errorf("%v: %s = %v, want %v", tc.prefixes, v6, got, tc.v6)
		}
	}
}
