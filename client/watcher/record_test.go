package watcher_test

import (
	"context"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sigs.k8s.io/kpng/client/watcher"
	"sigs.k8s.io/kpng/internal/kubetest"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

// rounds collects the records of the rounds a watcher delivers.
type rounds struct {
	mu  sync.Mutex
	all []localsink.Round
}

func (r *rounds) observe(rec localsink.Round) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.all = append(r.all, rec)
}

func (r *rounds) get() []localsink.Round {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]localsink.Round(nil), r.all...)
}

// TestWatcherTriggerTimes: the EndpointSlice controller's trigger time of
// a slice change reaches the record of the round that applies it, once;
// the time of a slice listed at start (before the watcher ran) is not
// measured, nor one repeated on an update that does not change it; the
// events behind each round are counted.
func TestWatcherTriggerTimes(t *testing.T) {
	cp.Require(t)
	kc := kubetest.Client{T: t, C: cp.Client()}
	ns := kubetest.Namespace(t, cp.Client())
	name := kubetest.UniqueName("trigger")
	svc := kc.CreateService(kubetest.Service(ns, "a", name))
	s := kubetest.Slice(svc, "a-1", kubetest.EP{IP: "10.9.0.1"})
	s.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: time.Now().Add(-time.Hour).Format(time.RFC3339Nano)}
	slice := kc.CreateSlice(s)

	var recs rounds
	r := startWatcher(t, watcher.Config{ServiceProxyName: name, Observe: recs.observe})
	r.waitFor(t, "the first state", hasEndpoints(ns, "a", "10.9.0.1"))

	trigger := time.Now().Truncate(time.Microsecond)
	slice.Endpoints[0].Addresses = []string{"10.9.0.2"}
	slice.Annotations[v1.EndpointsLastChangeTriggerTime] = trigger.Format(time.RFC3339Nano)
	slice = kc.UpdateSlice(slice)
	r.waitFor(t, "the change", hasEndpoints(ns, "a", "10.9.0.2"))
	// The same trigger time with another change (as a label update by
	// another controller would be): not measured twice.
	slice.Endpoints[0].Addresses = []string{"10.9.0.3"}
	kc.UpdateSlice(slice)
	r.waitFor(t, "the second change", hasEndpoints(ns, "a", "10.9.0.3"))

	key := model.ServiceKey{Namespace: ns, Name: "a"}
	var times []time.Time
	events := 0
	for _, rec := range recs.get() {
		times = append(times, rec.Triggers[key]...)
		events += rec.Events
	}
	if len(times) != 1 || !times[0].Equal(trigger) {
		t.Errorf("trigger times measured: %v, want only %v", times, trigger)
	}
	// The service and the slice listed, two slice updates.
	if events != 4 {
		t.Errorf("%d events counted, want 4", events)
	}
}

// TestWatcherNodeEligible: the node is eligible while it exists, is not
// being deleted and has no ToBeDeletedByClusterAutoscaler taint; a node
// that does not exist is not.
func TestWatcherNodeEligible(t *testing.T) {
	cp.Require(t)
	nodes := cp.Client().CoreV1().Nodes()
	ctx := context.Background()
	type report struct {
		mu  sync.Mutex
		got []bool
	}
	watch := func(node string) *report {
		rep := &report{}
		startWatcher(t, watcher.Config{ServiceProxyName: kubetest.UniqueName("elig"), NodeName: node, NodeEligible: func(e bool) {
			rep.mu.Lock()
			rep.got = append(rep.got, e)
			rep.mu.Unlock()
		}})
		return rep
	}
	waitLast := func(rep *report, what string, want bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			rep.mu.Lock()
			ok := len(rep.got) > 0 && rep.got[len(rep.got)-1] == want
			rep.mu.Unlock()
			if ok {
				return
			}
		}
		rep.mu.Lock()
		defer rep.mu.Unlock()
		t.Fatalf("%s: eligibility reports %v, want the last %v", what, rep.got, want)
	}

	missing := watch(kubetest.UniqueName("no-such-node"))
	waitLast(missing, "a node that does not exist", false)

	name := kubetest.UniqueName("node")
	if _, err := nodes.Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rep := watch(name)
	waitLast(rep, "a node", true)
	n, err := nodes.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Spec.Taints = []v1.Taint{{Key: watcher.ToBeDeletedTaint, Effect: v1.TaintEffectNoSchedule}}
	if n, err = nodes.Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitLast(rep, "a tainted node", false)
	n.Spec.Taints = nil
	if _, err = nodes.Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitLast(rep, "the taint removed", true)
	if err := nodes.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitLast(rep, "a deleted node", false)
	rep.mu.Lock()
	if len(rep.got) != 4 {
		t.Errorf("eligibility reported %v, want each change once: true false true false", rep.got)
	}
	rep.mu.Unlock()
}
