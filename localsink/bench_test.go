package localsink_test

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"sigs.k8s.io/kpng/client/model"
	"sigs.k8s.io/kpng/localsink"
)

const (
	benchServices     = 10_000
	benchEndpointsPer = 10
)

// benchState returns a sorted full state of benchServices services with
// benchEndpointsPer endpoints each.
func benchState() []*model.ServiceEndpoints {
	items := make([]*model.ServiceEndpoints, 0, benchServices)
	for i := range benchServices {
		svc := testService(fmt.Sprintf("ns-%02d", i%100), fmt.Sprintf("svc-%05d", i))
		eps := make([]*model.Endpoint, 0, benchEndpointsPer)
		for j := range benchEndpointsPer {
			ip := netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), byte(j + 1)})
			eps = append(eps, &model.Endpoint{IPs: model.IPSet{V4: []string{ip.String()}}, Ready: true, Serving: true})
		}
		slices.SortFunc(eps, model.CompareEndpoints)
		items = append(items, &model.ServiceEndpoints{Service: svc, Endpoints: eps})
	}
	slices.SortFunc(items, func(a, b *model.ServiceEndpoints) int { return a.Service.Key().Compare(b.Service.Key()) })
	return items
}

// toggled returns a copy of ep with Ready flipped.
func toggled(ep *model.Endpoint) *model.Endpoint {
	c := *ep
	c.Ready = !c.Ready
	return &c
}

// BenchmarkFullStateOneChange10k measures a FullState holding 10,000
// services of 10 endpoints: each iteration changes one endpoint and Syncs.
func BenchmarkFullStateOneChange10k(b *testing.B) {
	items := benchState()
	calls, count := 0, 0
	fs := localsink.NewFullState(func(items []*model.ServiceEndpoints) {
		calls++
		count = 0
		for _, se := range items {
			if se != nil {
				count++
			}
		}
	})
	fs.Reset()
	for _, se := range items {
		fs.SetService(se.Service)
		for _, ep := range se.Endpoints {
			fs.SetEndpoint(se.Service.Key(), ep.Key(), ep)
		}
	}
	fs.Sync()
	if calls != 1 || count != benchServices {
		b.Fatalf("setup: %d handler calls with %d services, want 1 with %d", calls, count, benchServices)
	}
	// Two versions of endpoint 0 of each service, made beforehand.
	alt := make([][2]*model.Endpoint, len(items))
	for i, se := range items {
		alt[i] = [2]*model.Endpoint{toggled(se.Endpoints[0]), se.Endpoints[0]}
	}

	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		j := i % len(items)
		ep := alt[j][(i/len(items))%2]
		fs.SetEndpoint(items[j].Service.Key(), ep.Key(), ep)
		calls = 0
		fs.Sync()
		if calls != 1 || count != benchServices {
			b.Fatalf("iteration %d: %d handler calls with %d services, want 1 with %d", i, calls, count, benchServices)
		}
	}
}

// BenchmarkDifferSetAll10kOneChange measures SetAll of a full state of
// 10,000 services of 10 endpoints, one endpoint changed from the previous
// one, into a Differ over a counting no-op sink.
func BenchmarkDifferSetAll10kOneChange(b *testing.B) {
	items := benchState()
	sink := &countSink{}
	d := localsink.NewDiffer(sink)
	if n := d.SetAll(items); n != benchServices*(1+benchEndpointsPer) {
		b.Fatalf("setup: %d calls, want %d", n, benchServices*(1+benchEndpointsPer))
	}
	// Two versions of each service, endpoint 0 toggled, made beforehand.
	alt := make([][2]*model.ServiceEndpoints, len(items))
	for i, se := range items {
		eps := slices.Clone(se.Endpoints)
		eps[0] = toggled(eps[0])
		alt[i] = [2]*model.ServiceEndpoints{{Service: se.Service, Endpoints: eps}, se}
	}

	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		j := i % len(items)
		items[j] = alt[j][(i/len(items))%2]
		before := *sink
		n := d.SetAll(items)
		if n != 1 || sink.setEndpoints != before.setEndpoints+1 {
			b.Fatalf("iteration %d: SetAll returned %d with %d SetEndpoint, want exactly 1 SetEndpoint",
				i, n, sink.setEndpoints-before.setEndpoints)
		}
		sink.setEndpoints--
		if *sink != before {
			b.Fatalf("iteration %d: calls other than one SetEndpoint: before %+v, after %+v", i, before, *sink)
		}
	}
}
