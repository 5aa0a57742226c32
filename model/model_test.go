package model

import (
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestServiceKeyCompare(t *testing.T) {
	keys := []ServiceKey{{"b", "a"}, {"a", "b"}, {"a-b", "a"}, {"a", "a"}}
	slices.SortFunc(keys, ServiceKey.Compare)
	want := []ServiceKey{{"a", "a"}, {"a", "b"}, {"a-b", "a"}, {"b", "a"}}
	if diff := cmp.Diff(want, keys); diff != "" {
		t.Errorf("sorted keys (-want +got):\n%s", diff)
	}
	if got := (ServiceKey{"ns", "web"}).String(); got != "ns/web" {
		t.Errorf("String() = %q", got)
	}
	if (&Service{Namespace: "ns", Name: "web"}).Key() != (ServiceKey{"ns", "web"}) {
		t.Errorf("Service.Key")
	}
}

func TestNewIPSet(t *testing.T) {
	tests := []struct {
		in   []string
		want IPSet
		bad  []string
	}{
		{nil, IPSet{}, nil},
		{[]string{"10.0.0.2", "10.0.0.10", "10.0.0.2"}, IPSet{V4: []string{"10.0.0.2", "10.0.0.10"}}, nil},
		{[]string{"FD00::0001", "::ffff:10.1.2.3", "10.0.0.1"}, IPSet{V4: []string{"10.0.0.1", "10.1.2.3"}, V6: []string{"fd00::1"}}, nil},
		{[]string{"10.0.0.1", "nope", "10.0.0.0/8"}, IPSet{V4: []string{"10.0.0.1"}}, []string{"nope", "10.0.0.0/8"}},
	}
	for _, tc := range tests {
		got, bad := NewIPSet(tc.in...)
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("NewIPSet(%q) (-want +got):\n%s", tc.in, diff)
		}
		if diff := cmp.Diff(tc.bad, bad); diff != "" {
			t.Errorf("NewIPSet(%q) bad (-want +got):\n%s", tc.in, diff)
		}
	}
	s := IPSet{V4: []string{"10.0.0.1"}, V6: []string{"fd00::1"}}
	all := s.All()
	if diff := cmp.Diff([]string{"10.0.0.1", "fd00::1"}, all); diff != "" {
		t.Errorf("All (-want +got):\n%s", diff)
	}
	all[0] = "changed"
	if s.V4[0] != "10.0.0.1" {
		t.Errorf("modifying All's result changed the set")
	}
	if !(IPSet{}).IsEmpty() || s.IsEmpty() {
		t.Errorf("IsEmpty")
	}
}

// TestParseCIDRs checks how source ranges are parsed, once, for every
// input (the watcher, the wire, state files): as kube-proxy reads them
// (spaces ignored, host bits cleared), IPv4-mapped prefixes as IPv4, sorted,
// each once, and the strings that are not CIDRs reported.
func TestParseCIDRs(t *testing.T) {
	pfx := func(ss ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range ss {
			out = append(out, netip.MustParsePrefix(s))
		}
		return out
	}
	tests := []struct {
		name string
		in   []string
		want []netip.Prefix
		bad  []string
	}{
		{name: "none"},
		{name: "canonical", in: []string{"198.51.100.0/24", "2001:db8::/32"}, want: pfx("198.51.100.0/24", "2001:db8::/32")},
		{name: "host bits cleared, as kube-proxy", in: []string{"10.0.0.1/8", "2001:db8::1/32"}, want: pfx("10.0.0.0/8", "2001:db8::/32")},
		{name: "spaces around", in: []string{" 10.0.0.0/8 "}, want: pfx("10.0.0.0/8")},
		{name: "sorted, IPv4 first, each once", in: []string{"fd00::/64", "10.1.0.0/16", "10.0.0.0/16", "10.0.0.0/8", "10.0.0.1/8"},
			want: pfx("10.0.0.0/8", "10.0.0.0/16", "10.1.0.0/16", "fd00::/64")},
		{name: "single addresses", in: []string{"203.0.113.7/32", "2001:db8::7/128"}, want: pfx("203.0.113.7/32", "2001:db8::7/128")},
		{name: "IPv4-mapped is IPv4", in: []string{"::ffff:192.0.2.0/120", "::ffff:192.0.2.1/128"}, want: pfx("192.0.2.0/24", "192.0.2.1/32")},
		{name: "IPv4-mapped shorter than /96", in: []string{"::ffff:0.0.0.0/90", "10.0.0.0/8"}, want: pfx("10.0.0.0/8"), bad: []string{"::ffff:0.0.0.0/90"}},
		{name: "not CIDRs", in: []string{"bogus", "", "10.0.0.1", "10.0.0.0/33", "fe80::1%eth0/64", "192.0.2.0/24"},
			want: pfx("192.0.2.0/24"), bad: []string{"bogus", "", "10.0.0.1", "10.0.0.0/33", "fe80::1%eth0/64"}},
		{name: "only bad ones", in: []string{"bogus"}, bad: []string{"bogus"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, bad := ParseCIDRs(tc.in...)
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateComparable(netip.Prefix{})); diff != "" {
				t.Errorf("ParseCIDRs(%q) (-want +got):\n%s", tc.in, diff)
			}
			if diff := cmp.Diff(tc.bad, bad); diff != "" {
				t.Errorf("ParseCIDRs(%q) bad (-want +got):\n%s", tc.in, diff)
			}
		})
	}
	// Prefixes made in Go (or decoded from JSON) are put in the same form.
	got, bad := CanonicalCIDRs([]netip.Prefix{netip.MustParsePrefix("10.0.0.1/8"), {}, netip.MustParsePrefix("::ffff:10.0.0.0/104")})
	if diff := cmp.Diff(pfx("10.0.0.0/8"), got, cmpopts.EquateComparable(netip.Prefix{})); diff != "" {
		t.Errorf("CanonicalCIDRs (-want +got):\n%s", diff)
	}
	if len(bad) != 1 || bad[0].IsValid() {
		t.Errorf("CanonicalCIDRs bad = %v, want the zero Prefix", bad)
	}
}

// TestSourceRangesJSON checks that source ranges keep their JSON form, a
// list of strings (part of the model's JSON contract), and that an absent
// list stays absent.
func TestSourceRangesJSON(t *testing.T) {
	svc := &Service{Namespace: "ns", Name: "lb", LoadBalancerSourceRanges: []netip.Prefix{
		netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("2001:db8::/32")}}
	b, err := json.Marshal(svc)
	if err != nil {
		t.Fatal(err)
	}
	if want := `"LoadBalancerSourceRanges":["198.51.100.0/24","2001:db8::/32"]`; !strings.Contains(string(b), want) {
		t.Errorf("JSON %s, want it to contain %s", b, want)
	}
	var back Service
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(svc, &back, cmpopts.EquateComparable(netip.Prefix{})); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	b, err = json.Marshal(&Service{Namespace: "ns", Name: "lb"})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "LoadBalancerSourceRanges") {
		t.Errorf("JSON %s names LoadBalancerSourceRanges without any", b)
	}
}

func TestEndpointKeyAndOrder(t *testing.T) {
	ep := func(v4, v6 string) *Endpoint {
		e := &Endpoint{}
		if v4 != "" {
			e.IPs.V4 = []string{v4}
		}
		if v6 != "" {
			e.IPs.V6 = []string{v6}
		}
		return e
	}
	if k := ep("10.0.0.1", "fd00::1").Key(); k != "10.0.0.1" {
		t.Errorf("dual-stack key %q, want the IPv4 address", k)
	}
	if k := ep("", "fd00::1").Key(); k != "fd00::1" {
		t.Errorf("IPv6 key %q", k)
	}
	if k := (&Endpoint{}).Key(); k != "" {
		t.Errorf("empty key %q", k)
	}
	eps := []*Endpoint{ep("", "fd00::1"), ep("10.0.0.10", ""), ep("", "::1"), ep("9.0.0.1", ""), ep("10.0.0.9", "")}
	slices.SortFunc(eps, CompareEndpoints)
	var got []string
	for _, e := range eps {
		got = append(got, e.Key())
	}
	if diff := cmp.Diff([]string{"9.0.0.1", "10.0.0.9", "10.0.0.10", "::1", "fd00::1"}, got); diff != "" {
		t.Errorf("order: numeric, IPv4 first (-want +got):\n%s", diff)
	}
}

func TestPortFor(t *testing.T) {
	numeric := &PortMapping{Name: "http", Port: 80, TargetPort: 8080}
	named := &PortMapping{Name: "web", Port: 80, TargetPortName: "web"}
	tests := []struct {
		name string
		ep   *Endpoint
		p    *PortMapping
		port int32
		ok   bool
	}{
		{"numeric target", &Endpoint{}, numeric, 8080, true},
		{"override", &Endpoint{PortOverrides: map[string]int32{"http": 9090}}, numeric, 9090, true},
		{"named, resolved for this pod", &Endpoint{PortOverrides: map[string]int32{"web": 7000}}, named, 7000, true},
		{"named, not served by this pod", &Endpoint{}, named, 0, false},
		{"served nowhere (override 0)", &Endpoint{PortOverrides: map[string]int32{"http": 0}}, numeric, 0, false},
	}
	for _, tc := range tests {
		port, ok := tc.ep.PortFor(tc.p)
		if port != tc.port || ok != tc.ok {
			t.Errorf("%s: PortFor = %d, %v; want %d, %v", tc.name, port, ok, tc.port, tc.ok)
		}
	}
}

func TestNodeView(t *testing.T) {
	ep := &Endpoint{IPs: IPSet{V4: []string{"10.0.0.1"}}, NodeName: "a", Hints: &Hints{Zones: []string{"z1"}, Nodes: []string{"b"}}}
	v := Node{Name: "a", Zone: "z1"}.View(ep)
	if v == ep || !v.Local || !v.Hints.SameZone || v.Hints.SameNode {
		t.Errorf("view from a/z1: %+v %+v, want a local copy with SameZone only", v, v.Hints)
	}
	if ep.Local || ep.Hints.SameZone {
		t.Errorf("View modified its input")
	}
	if again := (Node{Name: "a", Zone: "z1"}).View(v); again != v {
		t.Errorf("a view already right is not returned as is")
	}
	if v := (Node{Name: "b"}).View(ep); v.Local || !v.Hints.SameNode || v.Hints.SameZone {
		t.Errorf("view from b: %+v %+v", v, v.Hints)
	}
	if v := (Node{}).View(ep); v != ep {
		t.Errorf("no node: nothing local, nothing matches: want ep itself")
	}

	other := &Endpoint{IPs: IPSet{V4: []string{"10.0.0.2"}}, NodeName: "c"}
	se := &ServiceEndpoints{Service: &Service{Name: "s"}, Endpoints: []*Endpoint{other, ep}}
	if got := (Node{Name: "x"}).ViewService(se); got != se {
		t.Errorf("ViewService with no change: want se itself")
	}
	got := Node{Name: "a"}.ViewService(se)
	if got == se || got.Service != se.Service || got.Endpoints[0] != other || !got.Endpoints[1].Local || se.Endpoints[1].Local {
		t.Errorf("ViewService from a: want a new value sharing the service and the unchanged endpoint, input untouched")
	}
}

// TestJSONShape checks the public JSON contract of the blog's fields.
func TestJSONShape(t *testing.T) {
	se := &ServiceEndpoints{
		Service: &Service{
			Namespace: "default", Name: "kpng-example", Type: "ClusterIP",
			IPs:   ServiceIPs{ExternalIPs: IPSet{V4: []string{"10.0.0.55"}, V6: []string{"1000::55"}}, Headless: true},
			Ports: []*PortMapping{{Protocol: TCP, Port: 6000, TargetPort: 6000}},
		},
		Endpoints: []*Endpoint{{IPs: IPSet{V6: []string{"1100::202"}}, Local: true}},
	}
	b, err := json.Marshal(se)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	svc := got["Service"].(map[string]any)
	ips := svc["IPs"].(map[string]any)
	port := svc["Ports"].([]any)[0].(map[string]any)
	ep := got["Endpoints"].([]any)[0].(map[string]any)
	checks := []struct {
		what      string
		got, want any
	}{
		{"Service.Namespace", svc["Namespace"], "default"},
		{"Service.IPs.ExternalIPs.V6[0]", ips["ExternalIPs"].(map[string]any)["V6"].([]any)[0], "1000::55"},
		{"Service.IPs.Headless", ips["Headless"], true},
		{"Service.Ports[0].Protocol (a number)", port["Protocol"], float64(1)},
		{"Service.Ports[0].TargetPort", port["TargetPort"], float64(6000)},
		{"Endpoints[0].IPs.V6[0]", ep["IPs"].(map[string]any)["V6"].([]any)[0], "1100::202"},
		{"Endpoints[0].Local", ep["Local"], true},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v (%T), want %v", c.what, c.got, c.got, c.want)
		}
	}
	for _, p := range []Protocol{TCP, UDP, SCTP} {
		if p.String() == "" || p.String() == ProtocolUnknown.String() {
			t.Errorf("Protocol(%d).String() = %q", p, p.String())
		}
	}
}

func TestClusterEqual(t *testing.T) {
	a := &Cluster{ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}}
	b := &Cluster{ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}}
	c := &Cluster{ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.97.0.0/16")}}
	for _, tc := range []struct {
		x, y *Cluster
		want bool
	}{
		{nil, nil, true}, {nil, &Cluster{}, true}, {a, b, true}, {a, c, false}, {a, nil, false}, {&Cluster{}, a, false},
	} {
		if got := tc.x.Equal(tc.y); got != tc.want {
			t.Errorf("%+v.Equal(%+v) = %v, want %v", tc.x, tc.y, got, tc.want)
		}
	}
}
