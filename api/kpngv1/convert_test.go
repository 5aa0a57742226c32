package kpngv1

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/protobuf/proto"

	"sigs.k8s.io/kpng/model"
)

func TestConversionRoundTrip(t *testing.T) {
	services := []*model.Service{
		{Namespace: "default", Name: "kpng-example", Type: "ClusterIP",
			Labels: map[string]string{"service.kubernetes.io/service-proxy-name": "kpng-example"},
			IPs:    model.ServiceIPs{ExternalIPs: model.IPSet{V4: []string{"10.0.0.55"}, V6: []string{"1000::55"}}, Headless: true},
			Ports:  []*model.PortMapping{{Protocol: model.TCP, Port: 6000, TargetPort: 6000}}},
		{Namespace: "ns", Name: "lb", Type: "LoadBalancer",
			IPs: model.ServiceIPs{
				ClusterIPs:      model.IPSet{V4: []string{"10.96.0.10"}, V6: []string{"fd00:10:96::a"}},
				LoadBalancerIPs: model.IPSet{V4: []string{"192.0.2.1"}},
			},
			Ports: []*model.PortMapping{
				{Name: "dns", Protocol: model.UDP, Port: 53, NodePort: 30053, TargetPortName: "dns"},
				{Name: "sctp", Protocol: model.SCTP, Port: 9, TargetPort: 9999},
			},
			ClientIPAffinity:         &model.ClientIPAffinity{TimeoutSeconds: 10800},
			ExternalTrafficToLocal:   true,
			InternalTrafficToLocal:   true,
			HealthCheckNodePort:      31000,
			LoadBalancerSourceRanges: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("2001:db8::/32")},
			TrafficDistribution:      "PreferClose"},
		{Namespace: "ns", Name: "bare"},
	}
	for _, svc := range services {
		checkRoundTrip(t, svc, func(m *model.Service) proto.Message { return FromService(m) },
			func(b []byte) (*model.Service, error) {
				var p Service
				if err := proto.Unmarshal(b, &p); err != nil {
					return nil, err
				}
				return p.Model()
			})
	}
	endpoints := []*model.Endpoint{
		{IPs: model.IPSet{V6: []string{"1100::202"}}, Local: true, Ready: true, Serving: true, NodeName: "node-a"},
		{IPs: model.IPSet{V4: []string{"10.1.0.1"}}, Serving: true, Terminating: true, Zone: "z1",
			Hints:         &model.Hints{Zones: []string{"z1", "z2"}, Nodes: []string{"n1"}, SameZone: true, SameNode: true},
			PortOverrides: map[string]int32{"": 8080, "dns": 0}},
		{IPs: model.IPSet{V4: []string{"10.1.0.2"}}, Hints: &model.Hints{}},
	}
	for _, ep := range endpoints {
		checkRoundTrip(t, ep, func(m *model.Endpoint) proto.Message { return FromEndpoint(m) },
			func(b []byte) (*model.Endpoint, error) {
				var p Endpoint
				err := proto.Unmarshal(b, &p)
				return p.Model(), err
			})
	}
	for _, c := range []*model.Cluster{nil, {ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("fd00:10:96::/108")}}} {
		checkRoundTrip(t, c, func(m *model.Cluster) proto.Message { return FromCluster(m) },
			func(b []byte) (*model.Cluster, error) {
				var p Cluster
				if err := proto.Unmarshal(b, &p); err != nil {
					return nil, err
				}
				return p.Model()
			})
	}
	key := model.ServiceKey{Namespace: "a", Name: "b"}
	if got := FromServiceKey(key).Model(); got != key {
		t.Errorf("service key round trip: got %v, want %v", got, key)
	}
}

// TestServiceModelSourceRanges checks the source ranges of a service
// arriving over the wire, as strings: parsed as the model holds them, and
// one that is not a CIDR is an error naming the service and the field.
func TestServiceModelSourceRanges(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ranges  []string
		want    []netip.Prefix
		wantErr string
	}{
		{name: "none"},
		{name: "canonical", ranges: []string{"192.0.2.0/24", "2001:db8::/32"},
			want: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("2001:db8::/32")}},
		{name: "masked and sorted", ranges: []string{"2001:db8::1/32", "10.0.0.1/8"},
			want: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")}},
		{name: "not a CIDR", ranges: []string{"10.0.0.0/8", "bogus"}, wantErr: `service ns/lb: load_balancer_source_ranges: "bogus" is not a usable CIDR`},
		{name: "empty string", ranges: []string{""}, wantErr: `service ns/lb: load_balancer_source_ranges: "" is not a usable CIDR`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := (&Service{Namespace: "ns", Name: "lb", LoadBalancerSourceRanges: tc.ranges}).Model()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Model: %v, %v; want the error %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got.LoadBalancerSourceRanges, cmpopts.EquateComparable(netip.Prefix{})); diff != "" {
				t.Errorf("source ranges (-want +got):\n%s", diff)
			}
		})
	}
}

func checkRoundTrip[M any](t *testing.T, in M, to func(M) proto.Message, from func([]byte) (M, error)) {
	t.Helper()
	b, err := proto.Marshal(to(in))
	if err != nil {
		t.Fatalf("marshal %+v: %v", in, err)
	}
	out, err := from(b)
	if err != nil {
		t.Fatalf("unmarshal %+v: %v", in, err)
	}
	if diff := cmp.Diff(in, out, cmpopts.EquateComparable(netip.Prefix{})); diff != "" {
		t.Errorf("round trip changed the value (-in +out):\n%s", diff)
	}
}
