package localsink_test

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
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
		fs.Update(se.Service.Key(), nil, se)
	}
	_ = fs.Sync()
	if calls != 1 || count != benchServices {
		b.Fatalf("setup: %d handler calls with %d services, want 1 with %d", calls, count, benchServices)
	}
	// Two versions of each service, endpoint 0 toggled, made beforehand.
	versions := make([][2]*model.ServiceEndpoints, len(items))
	for i, se := range items {
		eps := slices.Clone(se.Endpoints)
		eps[0] = toggled(eps[0])
		versions[i] = [2]*model.ServiceEndpoints{{Service: se.Service, Endpoints: eps}, se}
	}

	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		j := i % len(items)
		prev, cur := versions[j][(i/len(items)+1)%2], versions[j][(i/len(items))%2]
		fs.Update(items[j].Service.Key(), prev, cur)
		calls = 0
		_ = fs.Sync()
		if calls != 1 || count != benchServices {
			b.Fatalf("iteration %d: %d handler calls with %d services, want 1 with %d", i, calls, count, benchServices)
		}
	}
}

// BenchmarkFeederSetAll10kOneChange measures SetAll and Sync of a full
// state of 10,000 services of 10 endpoints, one endpoint changed from the
// previous one, into a Feeder over a counting no-op sink.
func BenchmarkFeederSetAll10kOneChange(b *testing.B) {
	items := benchState()
	sink := &countSink{}
	f := localsink.NewFeeder(sink, localsink.FeederOptions{NoRetry: true})
	defer f.Close()
	f.SetAll(items)
	if err := f.Sync(); err != nil || sink.updates != benchServices {
		b.Fatalf("setup: %d Updates (%v), want %d", sink.updates, err, benchServices)
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
		f.SetAll(items)
		_ = f.Sync()
		if sink.updates != before.updates+1 || sink.syncs != before.syncs+1 || sink.resets != before.resets {
			b.Fatalf("iteration %d: calls before %+v, after %+v; want one Update and one Sync", i, before, *sink)
		}
	}
}
