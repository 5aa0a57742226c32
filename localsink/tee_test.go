package localsink

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"sigs.k8s.io/kpng/client/model"
)

// TestTee checks that every call reaches every sink, in order.
func TestTee(t *testing.T) {
	var got [][]*model.ServiceEndpoints
	record := func(items []*model.ServiceEndpoints) { got = append(got, items) }
	s := Tee(NewFullState(record), NewFullState(record))
	svc := &model.Service{Namespace: "ns", Name: "a"}
	ep := &model.Endpoint{IPs: model.IPSet{V4: []string{"10.1.0.1"}}, Ready: true}
	s.Reset()
	s.SetService(svc)
	s.SetEndpoint(svc.Key(), "10.1.0.1", ep)
	s.Sync()
	s.DeleteEndpoint(svc.Key(), "10.1.0.1")
	s.DeleteService(svc.Key())
	s.Sync()
	want := [][]*model.ServiceEndpoints{
		{{Service: svc, Endpoints: []*model.Endpoint{ep}}},
		{{Service: svc, Endpoints: []*model.Endpoint{ep}}},
		{}, {},
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(x, y []*model.ServiceEndpoints) bool { return len(x) == len(y) && (len(x) == 0 || cmp.Equal(x, y)) })); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
}
