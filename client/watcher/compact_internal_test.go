package watcher

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"sigs.k8s.io/kpng/model"
)

// TestCompactKeepsWhatTheWatcherReads: the informers' transform drops
// the fields the watcher does not read and shares repeated values, and
// the model built from compacted objects is the one built from the
// objects as the API server sent them.
func TestCompactKeepsWhatTheWatcherReads(t *testing.T) {
	ptr := func(s string) *string { return &s }
	flag := func(b bool) *bool { return &b }
	owner := []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: "web", UID: "u1"}}
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", Labels: map[string]string{"app": "web"},
			Annotations: map[string]string{"a": "b"}, OwnerReferences: owner,
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Selector: map[string]string{"app": "web"},
			Ports:    []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}},
		Status: v1.ServiceStatus{Conditions: []metav1.Condition{{Type: "x", Status: metav1.ConditionTrue}}},
	}
	slice := func(name, ip string, hint bool) *discovery.EndpointSlice {
		s := &discovery.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, OwnerReferences: owner,
				Labels:      map[string]string{discovery.LabelServiceName: "web"},
				Annotations: map[string]string{v1.EndpointsLastChangeTriggerTime: "2026-01-01T00:00:00Z", "other": "x"}},
			AddressType: discovery.AddressTypeIPv4,
			Ports:       []discovery.EndpointPort{{Name: ptr("http"), Protocol: new(v1.ProtocolTCP), Port: new(int32(8080))}},
			Endpoints: []discovery.Endpoint{{
				Addresses:  []string{ip},
				Conditions: discovery.EndpointConditions{Ready: flag(true), Serving: flag(true), Terminating: flag(false)},
				Hostname:   ptr("pod-1"), NodeName: ptr("node-a"), Zone: ptr("zone-a"),
				TargetRef:          &v1.ObjectReference{Kind: "Pod", Namespace: "default", Name: "pod-1", UID: "u2"},
				DeprecatedTopology: map[string]string{"kubernetes.io/hostname": "node-a"},
			}, {
				Addresses:  []string{ip + "0"},
				Conditions: discovery.EndpointConditions{Ready: flag(false), Serving: flag(true), Terminating: flag(true)},
				NodeName:   ptr("node-b"), Zone: ptr("zone-a"),
			}},
		}
		if hint {
			s.Endpoints[0].Hints = &discovery.EndpointHints{ForZones: []discovery.ForZone{{Name: "zone-a"}}}
		}
		return s
	}
	node := model.Node{Name: "node-a", Zone: "zone-a"}
	build := func(svc *v1.Service, slices ...*discovery.EndpointSlice) *model.ServiceEndpoints {
		m := convertService(svc)
		return &model.ServiceEndpoints{Service: m, Endpoints: buildEndpoints(m, slices, node)}
	}
	s1, s2 := slice("web-1", "10.1.0.1", true), slice("web-2", "10.1.0.2", false)
	want := build(svc.DeepCopy(), s1.DeepCopy(), s2.DeepCopy())

	var c compactor
	for _, obj := range []any{svc, s1, s2} {
		if _, err := c.compact(obj); err != nil {
			t.Fatal(err)
		}
	}
	if diff := cmp.Diff(want, build(svc, s1, s2)); diff != "" {
		t.Errorf("model from compacted objects (-original +compacted):\n%s", diff)
	}
	if svc.ManagedFields != nil || svc.OwnerReferences != nil || svc.Annotations != nil || svc.Spec.Selector != nil || svc.Status.Conditions != nil {
		t.Errorf("service kept what the watcher does not read: %+v", svc)
	}
	if s1.OwnerReferences != nil || !cmp.Equal(s1.Annotations, map[string]string{v1.EndpointsLastChangeTriggerTime: "2026-01-01T00:00:00Z"}) {
		t.Errorf("slice metadata: owners %v, annotations %v; want none, and only the trigger time", s1.OwnerReferences, s1.Annotations)
	}
	e := s1.Endpoints[0]
	if e.TargetRef != nil || e.Hostname != nil || e.DeprecatedTopology != nil {
		t.Errorf("endpoint kept what the watcher does not read: %+v", e)
	}
	if s1.Endpoints[0].Zone != s2.Endpoints[1].Zone || s1.Endpoints[0].NodeName != s2.Endpoints[0].NodeName ||
		s1.Endpoints[0].Conditions.Ready != s2.Endpoints[0].Conditions.Serving || s1.Endpoints[1].Conditions.Ready != s2.Endpoints[0].Conditions.Terminating {
		t.Error("equal node names, zones and conditions are not shared")
	}
}
