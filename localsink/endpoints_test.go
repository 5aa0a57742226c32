package localsink_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

func TestEndpointChanges(t *testing.T) {
	svc := testService("ns", "a")
	e1, e2, e3, e6 := testEndpoint("10.0.0.1"), testEndpoint("10.0.0.2"), testEndpoint("10.0.0.3"), testEndpoint("fd00::1")
	e2changed := testEndpoint("10.0.0.2")
	e2changed.Ready = false
	e3equal := testEndpoint("10.0.0.3")
	keys := func(eps []*model.Endpoint) []string {
		var out []string
		for _, e := range eps {
			out = append(out, e.Key())
		}
		return out
	}
	tests := []struct {
		name         string
		prev, cur    *model.ServiceEndpoints
		removed, set []string
	}{
		{"created", nil, svcEps(svc, e1, e6), nil, []string{"10.0.0.1", "fd00::1"}},
		{"deleted", svcEps(svc, e1, e6), nil, []string{"10.0.0.1", "fd00::1"}, nil},
		{"both nil", nil, nil, nil, nil},
		{"unchanged", svcEps(svc, e1, e2), svcEps(svc, e1, e2), nil, nil},
		{"equal copy is unchanged", svcEps(svc, e3), svcEps(svc, e3equal), nil, nil},
		{"added, removed, changed", svcEps(svc, e1, e2, e3), svcEps(svc, e2changed, e3, e6),
			[]string{"10.0.0.1"}, []string{"10.0.0.2", "fd00::1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			removed, set := localsink.EndpointChanges(tc.prev, tc.cur)
			if diff := cmp.Diff(tc.removed, keys(removed)); diff != "" {
				t.Errorf("removed (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.set, keys(set)); diff != "" {
				t.Errorf("set (-want +got):\n%s", diff)
			}
		})
	}
}
