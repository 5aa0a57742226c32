package kpngv1

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"

	"sigs.k8s.io/kpng/client/model"
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
			LoadBalancerSourceRanges: []string{"192.0.2.0/24", "2001:db8::/32"},
			TrafficDistribution:      "PreferClose"},
		{Namespace: "ns", Name: "bare"},
	}
	for _, svc := range services {
		checkRoundTrip(t, svc, func(m *model.Service) proto.Message { return FromService(m) },
			func(b []byte) (*model.Service, error) {
				var p Service
				err := proto.Unmarshal(b, &p)
				return p.Model(), err
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
	key := model.ServiceKey{Namespace: "a", Name: "b"}
	if got := FromServiceKey(key).Model(); got != key {
		t.Errorf("service key round trip: got %v, want %v", got, key)
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
	if diff := cmp.Diff(in, out); diff != "" {
		t.Errorf("round trip changed the value (-in +out):\n%s", diff)
	}
}
