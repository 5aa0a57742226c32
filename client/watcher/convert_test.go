package watcher

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"sigs.k8s.io/kpng/model"
)

func convPtr[T any](v T) *T { return &v }

// convSvc returns a single-stack ClusterIP service ns/svc with one TCP port
// 80 → 8080 named http, changed by edit.
func convSvc(edit func(s *v1.Service)) *v1.Service {
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "svc"},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  "10.96.0.10",
			ClusterIPs: []string{"10.96.0.10"},
			Ports: []v1.ServicePort{{
				Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080),
			}},
		},
	}
	if edit != nil {
		edit(s)
	}
	return s
}

// convWant returns the model of convSvc(nil), changed by edit.
func convWant(edit func(m *model.Service)) *model.Service {
	m := &model.Service{
		Namespace: "ns",
		Name:      "svc",
		Type:      "ClusterIP",
		IPs:       model.ServiceIPs{ClusterIPs: model.IPSet{V4: []string{"10.96.0.10"}}},
		Ports:     []*model.PortMapping{{Name: "http", Protocol: model.TCP, Port: 80, TargetPort: 8080}},
	}
	if edit != nil {
		edit(m)
	}
	return m
}

func TestConvertService(t *testing.T) {
	tests := []struct {
		name string
		svc  *v1.Service
		want *model.Service
	}{
		{
			name: "base",
			svc:  convSvc(nil),
			want: convWant(nil),
		},
		{
			// The headless dual-stack service of the kpng blog post, as
			// written (no type: defaulted to ClusterIP).
			name: "headless dual-stack with external IPs",
			svc: &v1.Service{
				ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "kpng-example"},
				Spec: v1.ServiceSpec{
					ClusterIP:      v1.ClusterIPNone,
					ClusterIPs:     []string{v1.ClusterIPNone},
					IPFamilyPolicy: convPtr(v1.IPFamilyPolicyRequireDualStack),
					IPFamilies:     []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol},
					ExternalIPs:    []string{"10.0.0.55", "1000::55"},
					Selector:       map[string]string{"app": "kpng-example"},
					Ports:          []v1.ServicePort{{Protocol: v1.ProtocolTCP, Port: 6000, TargetPort: intstr.FromInt32(6000)}},
				},
			},
			want: &model.Service{
				Namespace: "default",
				Name:      "kpng-example",
				Type:      "ClusterIP",
				IPs: model.ServiceIPs{
					ExternalIPs: model.IPSet{V4: []string{"10.0.0.55"}, V6: []string{"1000::55"}},
					Headless:    true,
				},
				Ports: []*model.PortMapping{{Protocol: 1, Port: 6000, TargetPort: 6000}},
			},
		},
		{
			name: "headless from spec.clusterIP only",
			svc: convSvc(func(s *v1.Service) {
				s.Spec.ClusterIP = v1.ClusterIPNone
				s.Spec.ClusterIPs = nil
			}),
			want: convWant(func(m *model.Service) { m.IPs = model.ServiceIPs{Headless: true} }),
		},
		{
			name: "dual-stack cluster IPs, non-canonical and out of order",
			svc: convSvc(func(s *v1.Service) {
				s.Spec.ClusterIP = "FD00:0:0::0010"
				s.Spec.ClusterIPs = []string{"FD00:0:0::0010", "10.96.0.1"}
				s.Spec.ExternalIPs = []string{"2001:DB8::1", "::ffff:192.0.2.1", "192.0.2.1", "not-an-ip"}
			}),
			want: convWant(func(m *model.Service) {
				m.IPs.ClusterIPs = model.IPSet{V4: []string{"10.96.0.1"}, V6: []string{"fd00::10"}}
				m.IPs.ExternalIPs = model.IPSet{V4: []string{"192.0.2.1"}, V6: []string{"2001:db8::1"}}
			}),
		},
		{
			name: "cluster IP from spec.clusterIP when clusterIPs is empty",
			svc: convSvc(func(s *v1.Service) {
				s.Spec.ClusterIP = "10.96.0.7"
				s.Spec.ClusterIPs = nil
			}),
			want: convWant(func(m *model.Service) { m.IPs.ClusterIPs = model.IPSet{V4: []string{"10.96.0.7"}} }),
		},
		{
			name: "NodePort with externalTrafficPolicy Local",
			svc: convSvc(func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeNodePort
				s.Spec.Ports[0].NodePort = 30080
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			}),
			want: convWant(func(m *model.Service) {
				m.Type = "NodePort"
				m.Ports[0].NodePort = 30080
				m.ExternalTrafficToLocal = true
			}),
		},
		{
			name: "NodePort with externalTrafficPolicy Cluster",
			svc: convSvc(func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeNodePort
				s.Spec.Ports[0].NodePort = 30080
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyCluster
			}),
			want: convWant(func(m *model.Service) {
				m.Type = "NodePort"
				m.Ports[0].NodePort = 30080
			}),
		},
		{
			name: "ClusterIP with externalTrafficPolicy Local and no external IPs",
			svc: convSvc(func(s *v1.Service) {
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			}),
			want: convWant(nil),
		},
		{
			name: "ClusterIP with externalTrafficPolicy Local and external IPs",
			svc: convSvc(func(s *v1.Service) {
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
				s.Spec.ExternalIPs = []string{"192.0.2.5"}
			}),
			want: convWant(func(m *model.Service) {
				m.IPs.ExternalIPs = model.IPSet{V4: []string{"192.0.2.5"}}
				m.ExternalTrafficToLocal = true
			}),
		},
		{
			name: "LoadBalancer with ingress IPs and source ranges",
			svc: convSvc(func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeLoadBalancer
				s.Spec.Ports[0].NodePort = 30080
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
				s.Spec.HealthCheckNodePort = 32000
				s.Spec.LoadBalancerSourceRanges = []string{
					" 10.0.0.0/8 ", "192.168.1.5/24", "10.0.0.0/8", "not-a-cidr", "2001:db8::/32",
					"10.0.0.0/16", "10.1.0.0/16", "10.0.0.0/33", "::ffff:192.0.2.0/120", "::ffff:0.0.0.0/90",
				}
				s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{
					{IP: "2001:db8::10"},
					{IP: "192.0.2.12", IPMode: convPtr(v1.LoadBalancerIPModeVIP)},
					{IP: "192.0.2.11", IPMode: convPtr(v1.LoadBalancerIPModeProxy)},
					{IP: "192.0.2.10"},
					{Hostname: "lb.example.com"},
				}
			}),
			want: convWant(func(m *model.Service) {
				m.Type = "LoadBalancer"
				m.Ports[0].NodePort = 30080
				m.ExternalTrafficToLocal = true
				m.HealthCheckNodePort = 32000
				m.IPs.LoadBalancerIPs = model.IPSet{V4: []string{"192.0.2.10", "192.0.2.12"}, V6: []string{"2001:db8::10"}}
				m.LoadBalancerSourceRanges = []netip.Prefix{
					netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("10.0.0.0/16"), netip.MustParsePrefix("10.1.0.0/16"),
					netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("192.168.1.0/24"), netip.MustParsePrefix("2001:db8::/32"),
				}
			}),
		},
		{
			name: "LoadBalancer with only invalid source ranges: no restriction",
			svc: convSvc(func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeLoadBalancer
				s.Spec.LoadBalancerSourceRanges = []string{"bogus"}
			}),
			want: convWant(func(m *model.Service) { m.Type = "LoadBalancer" }),
		},
		{
			name: "load-balancer status and source ranges of a NodePort service are ignored",
			svc: convSvc(func(s *v1.Service) {
				s.Spec.Type = v1.ServiceTypeNodePort
				s.Spec.LoadBalancerSourceRanges = []string{"10.0.0.0/8"}
				s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "192.0.2.10"}}
			}),
			want: convWant(func(m *model.Service) { m.Type = "NodePort" }),
		},
		{
			name: "session affinity ClientIP with the default timeout",
			svc:  convSvc(func(s *v1.Service) { s.Spec.SessionAffinity = v1.ServiceAffinityClientIP }),
			want: convWant(func(m *model.Service) { m.ClientIPAffinity = &model.ClientIPAffinity{TimeoutSeconds: 10800} }),
		},
		{
			name: "session affinity ClientIP with a config lacking clientIP",
			svc: convSvc(func(s *v1.Service) {
				s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{}
			}),
			want: convWant(func(m *model.Service) { m.ClientIPAffinity = &model.ClientIPAffinity{TimeoutSeconds: 10800} }),
		},
		{
			name: "session affinity ClientIP with an explicit timeout",
			svc: convSvc(func(s *v1.Service) {
				s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
				s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: convPtr[int32](60)}}
			}),
			want: convWant(func(m *model.Service) { m.ClientIPAffinity = &model.ClientIPAffinity{TimeoutSeconds: 60} }),
		},
		{
			name: "session affinity None ignores its config",
			svc: convSvc(func(s *v1.Service) {
				s.Spec.SessionAffinity = v1.ServiceAffinityNone
				s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: convPtr[int32](60)}}
			}),
			want: convWant(nil),
		},
		{
			name: "internalTrafficPolicy Local",
			svc: convSvc(func(s *v1.Service) {
				s.Spec.InternalTrafficPolicy = convPtr(v1.ServiceInternalTrafficPolicyLocal)
			}),
			want: convWant(func(m *model.Service) { m.InternalTrafficToLocal = true }),
		},
		{
			name: "internalTrafficPolicy Cluster",
			svc: convSvc(func(s *v1.Service) {
				s.Spec.InternalTrafficPolicy = convPtr(v1.ServiceInternalTrafficPolicyCluster)
			}),
			want: convWant(nil),
		},
		{
			name: "named, numeric and missing target ports",
			svc: convSvc(func(s *v1.Service) {
				s.Spec.Ports = []v1.ServicePort{
					{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromString("web")},
					{Name: "https", Protocol: v1.ProtocolTCP, Port: 443, TargetPort: intstr.FromInt32(8443)},
					{Name: "metrics", Protocol: v1.ProtocolTCP, Port: 9100},
				}
			}),
			want: convWant(func(m *model.Service) {
				m.Ports = []*model.PortMapping{
					{Name: "http", Protocol: model.TCP, Port: 80, TargetPort: 0, TargetPortName: "web"},
					{Name: "https", Protocol: model.TCP, Port: 443, TargetPort: 8443},
					{Name: "metrics", Protocol: model.TCP, Port: 9100, TargetPort: 9100},
				}
			}),
		},
		{
			name: "protocols: UDP, SCTP, empty (TCP), unknown (skipped)",
			svc: convSvc(func(s *v1.Service) {
				s.Spec.Ports = []v1.ServicePort{
					{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(5353)},
					{Name: "sctp", Protocol: v1.ProtocolSCTP, Port: 9999, TargetPort: intstr.FromInt32(9999)},
					{Name: "bogus", Protocol: "FOO", Port: 1},
					{Name: "default", Port: 81, TargetPort: intstr.FromInt32(8081)},
				}
			}),
			want: convWant(func(m *model.Service) {
				m.Ports = []*model.PortMapping{
					{Name: "dns", Protocol: model.UDP, Port: 53, TargetPort: 5353},
					{Name: "sctp", Protocol: model.SCTP, Port: 9999, TargetPort: 9999},
					{Name: "default", Protocol: model.TCP, Port: 81, TargetPort: 8081},
				}
			}),
		},
		{
			name: "labels and trafficDistribution",
			svc: convSvc(func(s *v1.Service) {
				s.Labels = map[string]string{"app": "web", ServiceProxyNameLabel: "kpng"}
				s.Spec.TrafficDistribution = convPtr(v1.ServiceTrafficDistributionPreferClose)
			}),
			want: convWant(func(m *model.Service) {
				m.Labels = map[string]string{"app": "web", ServiceProxyNameLabel: "kpng"}
				m.TrafficDistribution = "PreferClose"
			}),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := convertService(tc.svc)
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateComparable(netip.Prefix{})); diff != "" {
				t.Errorf("convertService (-want +got):\n%s", diff)
			}
			if !proxied(tc.svc) {
				t.Errorf("proxied() = false, want true")
			}
			// The result must not share the service's labels map.
			if tc.svc.Labels != nil {
				tc.svc.Labels["added-later"] = "x"
				defer delete(tc.svc.Labels, "added-later")
				if _, ok := got.Labels["added-later"]; ok {
					t.Errorf("the model shares the Service's labels map")
				}
			}
		})
	}
}

func TestProxied(t *testing.T) {
	got := map[v1.ServiceType]bool{}
	for _, typ := range []v1.ServiceType{"", v1.ServiceTypeClusterIP, v1.ServiceTypeNodePort, v1.ServiceTypeLoadBalancer, v1.ServiceTypeExternalName} {
		got[typ] = proxied(convSvc(func(s *v1.Service) { s.Spec.Type = typ }))
	}
	want := map[v1.ServiceType]bool{
		"":                         true,
		v1.ServiceTypeClusterIP:    true,
		v1.ServiceTypeNodePort:     true,
		v1.ServiceTypeLoadBalancer: true,
		v1.ServiceTypeExternalName: false,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("proxied by type (-want +got):\n%s", diff)
	}
}

// ---- buildEndpoints ----

func convSlice(name string, at discovery.AddressType, ports []discovery.EndpointPort, eps ...discovery.Endpoint) *discovery.EndpointSlice {
	return &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{discovery.LabelServiceName: "svc"}},
		AddressType: at,
		Endpoints:   eps,
		Ports:       ports,
	}
}

func convPort(name string, port int32) discovery.EndpointPort {
	return discovery.EndpointPort{Name: convPtr(name), Port: convPtr(port), Protocol: convPtr(v1.ProtocolTCP)}
}

// httpPorts are the slice ports matching convWant(nil)'s port exactly.
var httpPorts = []discovery.EndpointPort{convPort("http", 8080)}

func convEndpoint(addr string, edit func(e *discovery.Endpoint)) discovery.Endpoint {
	e := discovery.Endpoint{Addresses: []string{addr}}
	if edit != nil {
		edit(&e)
	}
	return e
}

// convModelEp returns the model of a ready endpoint with address addr,
// changed by edit.
func convModelEp(addr string, edit func(e *model.Endpoint)) *model.Endpoint {
	set, _ := model.NewIPSet(addr)
	e := &model.Endpoint{IPs: set, Ready: true, Serving: true}
	if edit != nil {
		edit(e)
	}
	return e
}

func onNode(n string) func(e *discovery.Endpoint) {
	return func(e *discovery.Endpoint) { e.NodeName = convPtr(n) }
}

func TestBuildEndpoints(t *testing.T) {
	nodeA := model.Node{Name: "node-a", Zone: "zone-a"}
	tests := []struct {
		name   string
		svc    *model.Service
		slices []*discovery.EndpointSlice
		node   model.Node
		want   []*model.Endpoint
	}{
		{
			name: "no slices",
			svc:  convWant(nil),
			node: nodeA,
			want: []*model.Endpoint{},
		},
		{
			name: "condition defaults",
			svc:  convWant(nil),
			node: nodeA,
			slices: []*discovery.EndpointSlice{convSlice("s", discovery.AddressTypeIPv4, httpPorts,
				convEndpoint("10.0.0.1", nil),
				convEndpoint("10.0.0.2", func(e *discovery.Endpoint) {
					e.Conditions = discovery.EndpointConditions{Ready: convPtr(false), Serving: convPtr(true), Terminating: convPtr(true)}
				}),
				convEndpoint("10.0.0.3", func(e *discovery.Endpoint) {
					e.Conditions = discovery.EndpointConditions{Ready: convPtr(true), Serving: convPtr(false), Terminating: convPtr(false)}
				}),
				convEndpoint("10.0.0.4", func(e *discovery.Endpoint) {
					e.Conditions = discovery.EndpointConditions{Terminating: convPtr(true)}
				}),
			)},
			want: []*model.Endpoint{
				convModelEp("10.0.0.1", nil),
				convModelEp("10.0.0.2", func(e *model.Endpoint) { e.Ready, e.Terminating = false, true }),
				convModelEp("10.0.0.3", func(e *model.Endpoint) { e.Serving = false }),
				convModelEp("10.0.0.4", func(e *model.Endpoint) { e.Terminating = true }),
			},
		},
		{
			name: "Local only when nodeName is this node",
			svc:  convWant(nil),
			node: nodeA,
			slices: []*discovery.EndpointSlice{convSlice("s", discovery.AddressTypeIPv4, httpPorts,
				convEndpoint("10.0.0.1", onNode("node-a")),
				convEndpoint("10.0.0.2", onNode("node-b")),
				convEndpoint("10.0.0.3", nil),
				convEndpoint("10.0.0.4", func(e *discovery.Endpoint) { e.NodeName = convPtr("node-a"); e.Zone = convPtr("zone-b") }),
			)},
			want: []*model.Endpoint{
				convModelEp("10.0.0.1", func(e *model.Endpoint) { e.NodeName, e.Local = "node-a", true }),
				convModelEp("10.0.0.2", func(e *model.Endpoint) { e.NodeName = "node-b" }),
				convModelEp("10.0.0.3", nil),
				convModelEp("10.0.0.4", func(e *model.Endpoint) { e.NodeName, e.Zone, e.Local = "node-a", "zone-b", true }),
			},
		},
		{
			name: "no endpoint is local for a node without a name",
			svc:  convWant(nil),
			node: model.Node{},
			slices: []*discovery.EndpointSlice{convSlice("s", discovery.AddressTypeIPv4, httpPorts,
				convEndpoint("10.0.0.1", onNode("")),
				convEndpoint("10.0.0.2", onNode("node-a")),
			)},
			want: []*model.Endpoint{
				convModelEp("10.0.0.1", nil),
				convModelEp("10.0.0.2", func(e *model.Endpoint) { e.NodeName = "node-a" }),
			},
		},
		{
			name: "same address in two slices: first slice by name wins",
			svc:  convWant(nil),
			node: nodeA,
			slices: []*discovery.EndpointSlice{
				convSlice("s-b", discovery.AddressTypeIPv4, httpPorts, convEndpoint("10.0.0.1", func(e *discovery.Endpoint) {
					e.NodeName = convPtr("node-b")
					e.Conditions.Ready = convPtr(false)
				})),
				convSlice("s-a", discovery.AddressTypeIPv4, httpPorts, convEndpoint("10.0.0.1", onNode("node-c"))),
			},
			want: []*model.Endpoint{convModelEp("10.0.0.1", func(e *model.Endpoint) { e.NodeName = "node-c" })},
		},
		{
			// kube-proxy v1.36 keeps the copy that is not terminating
			// (a pod IP reused while the old pod terminates), whatever
			// the node; the node no longer decides.
			name: "same address in two slices: the copy not terminating wins",
			svc:  convWant(nil),
			node: nodeA,
			slices: []*discovery.EndpointSlice{
				convSlice("s-a", discovery.AddressTypeIPv4, httpPorts, convEndpoint("10.0.0.1", func(e *discovery.Endpoint) {
					e.NodeName = convPtr("node-a")
					e.Conditions = discovery.EndpointConditions{Ready: convPtr(false), Serving: convPtr(true), Terminating: convPtr(true)}
				})),
				convSlice("s-b", discovery.AddressTypeIPv4, httpPorts, convEndpoint("10.0.0.1", func(e *discovery.Endpoint) {
					e.NodeName = convPtr("node-b")
					e.Conditions.Ready = convPtr(false)
				})),
				convSlice("s-c", discovery.AddressTypeIPv4, httpPorts, convEndpoint("10.0.0.1", onNode("node-c"))),
			},
			want: []*model.Endpoint{convModelEp("10.0.0.1", func(e *model.Endpoint) { e.NodeName, e.Ready = "node-b", false })},
		},
		{
			name: "same address in two slices, both terminating: first slice by name wins",
			svc:  convWant(nil),
			node: nodeA,
			slices: []*discovery.EndpointSlice{
				convSlice("s-b", discovery.AddressTypeIPv4, httpPorts, convEndpoint("10.0.0.1", func(e *discovery.Endpoint) {
					e.NodeName = convPtr("node-a")
					e.Conditions.Terminating = convPtr(true)
				})),
				convSlice("s-a", discovery.AddressTypeIPv4, httpPorts, convEndpoint("10.0.0.1", func(e *discovery.Endpoint) {
					e.NodeName = convPtr("node-c")
					e.Conditions.Terminating = convPtr(true)
				})),
			},
			want: []*model.Endpoint{convModelEp("10.0.0.1", func(e *model.Endpoint) { e.NodeName, e.Terminating = "node-c", true })},
		},
		{
			name: "IPv4 and IPv6 slices merged, sorted by address, IPv4 first",
			svc:  convWant(nil),
			node: nodeA,
			slices: []*discovery.EndpointSlice{
				convSlice("s-a", discovery.AddressTypeIPv6, httpPorts,
					convEndpoint("fd00::2", nil), convEndpoint("FD00::1", nil)),
				convSlice("s-b", discovery.AddressTypeIPv4, httpPorts,
					convEndpoint("10.0.0.10", nil), convEndpoint("10.0.0.9", nil), convEndpoint("9.0.0.1", nil)),
			},
			want: []*model.Endpoint{
				convModelEp("9.0.0.1", nil),
				convModelEp("10.0.0.9", nil),
				convModelEp("10.0.0.10", nil),
				convModelEp("fd00::1", nil),
				convModelEp("fd00::2", nil),
			},
		},
		{
			name: "FQDN slices ignored; invalid, empty and extra addresses skipped",
			svc:  convWant(nil),
			node: nodeA,
			slices: []*discovery.EndpointSlice{
				convSlice("s-a", discovery.AddressTypeFQDN, httpPorts,
					convEndpoint("example.com", nil), convEndpoint("10.0.0.5", nil)),
				convSlice("s-b", discovery.AddressTypeIPv4, httpPorts,
					convEndpoint("not-an-ip", nil),
					discovery.Endpoint{},
					discovery.Endpoint{Addresses: []string{"10.0.0.1", "10.0.0.2"}}),
			},
			want: []*model.Endpoint{convModelEp("10.0.0.1", nil)},
		},
		{
			name: "hints: SameZone and SameNode only when they name this node",
			svc:  convWant(nil),
			node: nodeA,
			slices: []*discovery.EndpointSlice{convSlice("s", discovery.AddressTypeIPv4, httpPorts,
				convEndpoint("10.0.0.1", func(e *discovery.Endpoint) {
					e.Hints = &discovery.EndpointHints{
						ForZones: []discovery.ForZone{{Name: "zone-b"}, {Name: "zone-a"}},
						ForNodes: []discovery.ForNode{{Name: "node-b"}},
					}
				}),
				convEndpoint("10.0.0.2", func(e *discovery.Endpoint) {
					e.Hints = &discovery.EndpointHints{
						ForZones: []discovery.ForZone{{Name: "zone-b"}},
						ForNodes: []discovery.ForNode{{Name: "node-a"}},
					}
				}),
				convEndpoint("10.0.0.3", func(e *discovery.Endpoint) {
					e.Zone = convPtr("zone-a")
					e.Hints = &discovery.EndpointHints{} // empty: no hints
				}),
				convEndpoint("10.0.0.4", func(e *discovery.Endpoint) {
					e.Hints = &discovery.EndpointHints{ForZones: []discovery.ForZone{{Name: "zone-c"}}}
				}),
			)},
			want: []*model.Endpoint{
				convModelEp("10.0.0.1", func(e *model.Endpoint) {
					e.Hints = &model.Hints{Zones: []string{"zone-b", "zone-a"}, Nodes: []string{"node-b"}, SameZone: true}
				}),
				convModelEp("10.0.0.2", func(e *model.Endpoint) {
					e.Hints = &model.Hints{Zones: []string{"zone-b"}, Nodes: []string{"node-a"}, SameNode: true}
				}),
				convModelEp("10.0.0.3", func(e *model.Endpoint) { e.Zone = "zone-a" }),
				convModelEp("10.0.0.4", func(e *model.Endpoint) { e.Hints = &model.Hints{Zones: []string{"zone-c"}} }),
			},
		},
		{
			name: "hints: no zone match when the node's zone is unknown",
			svc:  convWant(nil),
			node: model.Node{Name: "node-a"},
			slices: []*discovery.EndpointSlice{convSlice("s", discovery.AddressTypeIPv4, httpPorts,
				convEndpoint("10.0.0.1", func(e *discovery.Endpoint) {
					e.Hints = &discovery.EndpointHints{ForZones: []discovery.ForZone{{Name: "zone-a"}, {Name: ""}}}
				}),
			)},
			want: []*model.Endpoint{convModelEp("10.0.0.1", func(e *model.Endpoint) {
				e.Hints = &model.Hints{Zones: []string{"zone-a", ""}}
			})},
		},
		{
			name: "named target port resolved per slice",
			svc: convWant(func(m *model.Service) {
				m.Ports = []*model.PortMapping{{Name: "http", Protocol: model.TCP, Port: 80, TargetPortName: "web"}}
			}),
			node: nodeA,
			slices: []*discovery.EndpointSlice{
				convSlice("s-a", discovery.AddressTypeIPv4, []discovery.EndpointPort{convPort("http", 8080)}, convEndpoint("10.0.0.1", nil)),
				convSlice("s-b", discovery.AddressTypeIPv4, []discovery.EndpointPort{convPort("http", 9090)}, convEndpoint("10.0.0.2", nil)),
				convSlice("s-c", discovery.AddressTypeIPv4, nil, convEndpoint("10.0.0.3", nil)),
			},
			want: []*model.Endpoint{
				convModelEp("10.0.0.1", func(e *model.Endpoint) { e.PortOverrides = map[string]int32{"http": 8080} }),
				convModelEp("10.0.0.2", func(e *model.Endpoint) { e.PortOverrides = map[string]int32{"http": 9090} }),
				convModelEp("10.0.0.3", nil), // not served: 0 is the target port already
			},
		},
		{
			name: "slice lacking a service port: override to 0",
			svc: convWant(func(m *model.Service) {
				m.Ports = append(m.Ports, &model.PortMapping{Name: "metrics", Protocol: model.TCP, Port: 9100, TargetPort: 9100})
			}),
			node: nodeA,
			slices: []*discovery.EndpointSlice{
				convSlice("s-a", discovery.AddressTypeIPv4, httpPorts, convEndpoint("10.0.0.1", nil)),
				convSlice("s-b", discovery.AddressTypeIPv4, []discovery.EndpointPort{
					convPort("http", 8080),
					{Name: convPtr("metrics")}, // no port number: ignored
				}, convEndpoint("10.0.0.2", nil)),
			},
			want: []*model.Endpoint{
				convModelEp("10.0.0.1", func(e *model.Endpoint) { e.PortOverrides = map[string]int32{"metrics": 0} }),
				convModelEp("10.0.0.2", func(e *model.Endpoint) { e.PortOverrides = map[string]int32{"metrics": 0} }),
			},
		},
		{
			name: "ports equal to the target ports: no overrides",
			svc: convWant(func(m *model.Service) {
				m.Ports = append(m.Ports, &model.PortMapping{Name: "metrics", Protocol: model.TCP, Port: 9100, TargetPort: 9100})
			}),
			node: nodeA,
			slices: []*discovery.EndpointSlice{
				convSlice("s", discovery.AddressTypeIPv4, []discovery.EndpointPort{convPort("metrics", 9100), convPort("http", 8080), convPort("other", 1)},
					convEndpoint("10.0.0.1", nil)),
			},
			want: []*model.Endpoint{convModelEp("10.0.0.1", nil)},
		},
		{
			name: "unnamed port",
			svc: convWant(func(m *model.Service) {
				m.Ports = []*model.PortMapping{{Protocol: model.TCP, Port: 80, TargetPort: 8080}}
			}),
			node: nodeA,
			slices: []*discovery.EndpointSlice{
				convSlice("s-a", discovery.AddressTypeIPv4, []discovery.EndpointPort{{Port: convPtr[int32](8080)}}, convEndpoint("10.0.0.1", nil)),
				convSlice("s-b", discovery.AddressTypeIPv4, []discovery.EndpointPort{{Port: convPtr[int32](8081)}}, convEndpoint("10.0.0.2", nil)),
			},
			want: []*model.Endpoint{
				convModelEp("10.0.0.1", nil),
				convModelEp("10.0.0.2", func(e *model.Endpoint) { e.PortOverrides = map[string]int32{"": 8081} }),
			},
		},
		{
			// Ports are merged across the slices listing an address, the
			// first slice by name winning for each port name.
			name: "same address in two slices: ports merged, first slice wins",
			svc: convWant(func(m *model.Service) {
				m.Ports = []*model.PortMapping{
					{Name: "http", Protocol: model.TCP, Port: 80, TargetPortName: "web"},
					{Name: "metrics", Protocol: model.TCP, Port: 9100, TargetPortName: "metrics"},
				}
			}),
			node: nodeA,
			slices: []*discovery.EndpointSlice{
				convSlice("s-b", discovery.AddressTypeIPv4, []discovery.EndpointPort{convPort("http", 9999), convPort("metrics", 9101)},
					convEndpoint("10.0.0.1", nil)),
				convSlice("s-a", discovery.AddressTypeIPv4, []discovery.EndpointPort{convPort("http", 8080)},
					convEndpoint("10.0.0.1", nil)),
			},
			want: []*model.Endpoint{convModelEp("10.0.0.1", func(e *model.Endpoint) {
				e.PortOverrides = map[string]int32{"http": 8080, "metrics": 9101}
			})},
		},
		{
			// The old pod (terminating, first by name) served http on
			// 8080, the new one on 9090: the kept copy's port wins, the
			// other's fill the names it lacks.
			name: "same address in two slices: the ports of the copy not terminating win",
			svc: convWant(func(m *model.Service) {
				m.Ports = []*model.PortMapping{
					{Name: "http", Protocol: model.TCP, Port: 80, TargetPortName: "web"},
					{Name: "metrics", Protocol: model.TCP, Port: 9100, TargetPortName: "metrics"},
				}
			}),
			node: nodeA,
			slices: []*discovery.EndpointSlice{
				convSlice("s-a", discovery.AddressTypeIPv4, []discovery.EndpointPort{convPort("http", 8080), convPort("metrics", 9101)},
					convEndpoint("10.0.0.1", func(e *discovery.Endpoint) {
						e.Conditions = discovery.EndpointConditions{Ready: convPtr(false), Serving: convPtr(true), Terminating: convPtr(true)}
					})),
				convSlice("s-b", discovery.AddressTypeIPv4, []discovery.EndpointPort{convPort("http", 9090)},
					convEndpoint("10.0.0.1", nil)),
			},
			want: []*model.Endpoint{convModelEp("10.0.0.1", func(e *model.Endpoint) {
				e.PortOverrides = map[string]int32{"http": 9090, "metrics": 9101}
			})},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := buildEndpoints(tc.svc, tc.slices, tc.node)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("buildEndpoints (-want +got):\n%s", diff)
			}
		})
	}
}

// TestBuildEndpointsPortFor checks the overrides through Endpoint.PortFor,
// the way proxiers read them.
func TestBuildEndpointsPortFor(t *testing.T) {
	svc := convWant(func(m *model.Service) {
		m.Ports = []*model.PortMapping{
			{Name: "http", Protocol: model.TCP, Port: 80, TargetPortName: "web"},
			{Name: "https", Protocol: model.TCP, Port: 443, TargetPort: 8443},
			{Name: "metrics", Protocol: model.TCP, Port: 9100, TargetPort: 9100},
		}
	})
	eps := buildEndpoints(svc, []*discovery.EndpointSlice{
		convSlice("s", discovery.AddressTypeIPv4, []discovery.EndpointPort{convPort("http", 8080), convPort("https", 8443)},
			convEndpoint("10.0.0.1", nil)),
	}, model.Node{})
	if len(eps) != 1 {
		t.Fatalf("got %d endpoints, want 1", len(eps))
	}
	type portFor struct {
		Port   int32
		Served bool
	}
	got := map[string]portFor{}
	for _, p := range svc.Ports {
		port, ok := eps[0].PortFor(p)
		got[p.Name] = portFor{port, ok}
	}
	want := map[string]portFor{"http": {8080, true}, "https": {8443, true}, "metrics": {0, false}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("PortFor (-want +got):\n%s", diff)
	}
}
