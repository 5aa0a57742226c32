package kpngv1

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/protobuf/proto"

	"sigs.k8s.io/kpng/model"
)

// FuzzModel: any bytes arriving on the wire as a Service, an Endpoint or
// cluster facts are converted to the model without a panic; what
// converts goes back to the wire (encoded and decoded) and returns the
// same model.
func FuzzModel(f *testing.F) {
	for _, m := range []proto.Message{
		FromService(&model.Service{Namespace: "default", Name: "web", Type: "ClusterIP",
			IPs:                      model.ServiceIPs{ClusterIPs: model.IPSet{V4: []string{"10.96.0.10"}}},
			LoadBalancerSourceRanges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
			Ports:                    []*model.PortMapping{{Name: "http", Protocol: model.TCP, Port: 80, TargetPort: 8080}},
			ClientIPAffinity:         &model.ClientIPAffinity{TimeoutSeconds: 10}}),
		FromEndpoint(&model.Endpoint{IPs: model.IPSet{V6: []string{"1100::202"}}, Local: true, Ready: true,
			Hints: &model.Hints{Zones: []string{"a"}}, PortOverrides: map[string]int32{"http": 8081}}),
		&Service{LoadBalancerSourceRanges: []string{"bogus", "::ffff:0.0.0.0/90"}, Ports: []*PortMapping{nil, {Port: -1}}},
		&Endpoint{Ips: &IPSet{V4: []string{"not an address"}}},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	opts := []cmp.Option{cmpopts.EquateComparable(netip.Prefix{}), cmpopts.EquateEmpty()}
	// overWire is m's wire form, encoded and decoded as a stream carries it.
	overWire := func(t *testing.T, m proto.Message, into proto.Message) {
		t.Helper()
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatalf("encode %T: %v", m, err)
		}
		if err := proto.Unmarshal(b, into); err != nil {
			t.Fatalf("decode %T: %v", m, err)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var e Endpoint
		if proto.Unmarshal(data, &e) == nil {
			m := e.Model()
			var wire Endpoint
			overWire(t, FromEndpoint(m), &wire)
			if diff := cmp.Diff(m, wire.Model(), opts...); diff != "" {
				t.Fatalf("endpoint: model → wire → model (-first +second):\n%s", diff)
			}
		}
		var c Cluster
		if proto.Unmarshal(data, &c) == nil {
			if m, err := c.Model(); err == nil {
				var wire Cluster
				overWire(t, FromCluster(m), &wire)
				again, err := wire.Model()
				if err != nil {
					t.Fatalf("converted cluster facts do not convert again: %v", err)
				}
				if diff := cmp.Diff(m, again, opts...); diff != "" {
					t.Fatalf("cluster: model → wire → model (-first +second):\n%s", diff)
				}
			}
		}
		var s Service
		if proto.Unmarshal(data, &s) != nil {
			return
		}
		m, err := s.Model()
		if err != nil {
			return
		}
		var wire Service
		overWire(t, FromService(m), &wire)
		again, err := wire.Model()
		if err != nil {
			t.Fatalf("a converted service does not convert again: %v", err)
		}
		if diff := cmp.Diff(m, again, opts...); diff != "" {
			t.Fatalf("model → wire → model (-first +second):\n%s", diff)
		}
	})
}
