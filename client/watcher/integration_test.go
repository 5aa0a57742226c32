package watcher_test

import (
	"context"
	"fmt"
	"net/http"
	"path"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	networking "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"sigs.k8s.io/kpng/client/watcher"
	"sigs.k8s.io/kpng/internal/controlplane"
	"sigs.k8s.io/kpng/internal/kubetest"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/localsink/sinktest"
	"sigs.k8s.io/kpng/model"
)

var cp *controlplane.ControlPlane

func TestMain(m *testing.M) { controlplane.Main(m, &cp) }

// recorder is a contract Checker that records the calls it gets and,
// through a FullState adapter, every full state.
type recorder struct {
	*sinktest.Checker
	mu     sync.Mutex
	states [][]*model.ServiceEndpoints
	calls  []string // taken from the Checker, not yet from the test
}

func newRecorder() *recorder {
	r := &recorder{}
	r.Checker = sinktest.NewChecker(localsink.NewFullState(func(items []*model.ServiceEndpoints) {
		r.mu.Lock()
		r.states = append(r.states, items)
		r.mu.Unlock()
	}))
	return r
}

// takeCalls returns and forgets the calls recorded so far.
func (r *recorder) takeCalls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := append(r.calls, r.TakeCalls()...)
	r.calls = nil
	return c
}

func (r *recorder) allStates() [][]*model.ServiceEndpoints {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]*model.ServiceEndpoints(nil), r.states...)
}

// waitFor waits until the latest full state satisfies ok and returns it.
func (r *recorder) waitFor(t *testing.T, what string, ok func([]*model.ServiceEndpoints) bool) []*model.ServiceEndpoints {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r.mu.Lock()
		var last []*model.ServiceEndpoints
		have := len(r.states) > 0
		if have {
			last = r.states[len(r.states)-1]
		}
		r.mu.Unlock()
		if have && ok(last) {
			return last
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; last state:\n%s", what, describe(last))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitCalls waits until the recorded calls end with a Sync and contain want
// (in any order within the recorded rounds), then returns them.
func (r *recorder) waitCalls(t *testing.T, want ...string) []string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var got []string
	for time.Now().Before(deadline) {
		r.mu.Lock()
		r.calls = append(r.calls, r.TakeCalls()...)
		got = append([]string(nil), r.calls...)
		r.mu.Unlock()
		if len(got) > 0 && got[len(got)-1] == "Sync" && containsAll(got, want) {
			r.takeCalls()
			return got
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for calls %q; got %q", want, got)
	return nil
}

func containsAll(have, want []string) bool {
	set := map[string]bool{}
	for _, h := range have {
		set[h] = true
	}
	for _, w := range want {
		if !set[w] {
			return false
		}
	}
	return true
}

func describe(state []*model.ServiceEndpoints) string {
	var b strings.Builder
	for _, se := range state {
		fmt.Fprintf(&b, "  %s:", se.Service.Key())
		for _, ep := range se.Endpoints {
			fmt.Fprintf(&b, " %s", ep.Key())
		}
		b.WriteString("\n")
	}
	return b.String()
}

func find(state []*model.ServiceEndpoints, ns, name string) *model.ServiceEndpoints {
	for _, se := range state {
		if se.Service.Namespace == ns && se.Service.Name == name {
			return se
		}
	}
	return nil
}

func endpointKeys(se *model.ServiceEndpoints) []string {
	if se == nil {
		return nil
	}
	keys := []string{}
	for _, ep := range se.Endpoints {
		keys = append(keys, ep.Key())
	}
	return keys
}

// hasEndpoints is a waitFor condition: service ns/name exists with exactly
// the given endpoint keys, in order.
func hasEndpoints(ns, name string, keys ...string) func([]*model.ServiceEndpoints) bool {
	return func(s []*model.ServiceEndpoints) bool {
		se := find(s, ns, name)
		return se != nil && cmp.Equal(endpointKeys(se), append([]string{}, keys...))
	}
}

func absent(ns, name string) func([]*model.ServiceEndpoints) bool {
	return func(s []*model.ServiceEndpoints) bool { return find(s, ns, name) == nil }
}

// startWatcher runs a watcher until the test ends, and checks that it stops
// cleanly, leaving no goroutine behind.
func startWatcher(t *testing.T, cfg watcher.Config) *recorder {
	t.Helper()
	if cfg.Client == nil {
		cfg.Client = cp.Client()
	}
	w, err := watcher.New(cfg)
	if err != nil {
		t.Fatalf("watcher.New: %v", err)
	}
	if !leakChecked[t] {
		// Registered before any watcher's stop, so it runs after all of
		// them (cleanups run last-in first-out).
		leakChecked[t] = true
		t.Cleanup(func() { checkNoLeak(t) })
	}
	r := newRecorder()
	sinktest.RunSource(t, "watcher.Run", r.Checker, w.Run)
	return r
}

// leakChecked records the tests that check for leaks; tests are not parallel.
var leakChecked = map[*testing.T]bool{}

// checkNoLeak fails when goroutines of the watcher or of client-go's
// informers are still running.
func checkNoLeak(t *testing.T) {
	t.Helper()
	var stacks string
	for range 100 {
		buf := make([]byte, 1<<20)
		stacks = string(buf[:runtime.Stack(buf, true)])
		leaked := false
		for _, g := range strings.Split(stacks, "\n\n") {
			if strings.Contains(g, "kpng/client/watcher.(*Watcher)") || strings.Contains(g, "client-go/tools/cache.") {
				leaked = true
			}
		}
		if !leaked {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Errorf("goroutines left behind after the watcher stopped:\n%s", stacks)
}

func TestSelectionByServiceProxyName(t *testing.T) {
	cp.Require(t)
	kc := kubetest.Client{T: t, C: cp.Client()}
	ns := kubetest.Namespace(t, cp.Client())
	mine, other := kubetest.UniqueName("mine"), kubetest.UniqueName("other")
	for _, s := range []struct{ name, proxy, ip string }{
		{"a", mine, "10.1.0.1"}, {"b", other, "10.1.0.2"}, {"c", "", "10.1.0.3"},
	} {
		svc := kc.CreateService(kubetest.Service(ns, s.name, s.proxy))
		kc.CreateSlice(kubetest.Slice(svc, s.name+"-1", kubetest.EP{IP: s.ip}))
	}

	named := startWatcher(t, watcher.Config{ServiceProxyName: mine})
	unnamed := startWatcher(t, watcher.Config{})

	got := named.waitFor(t, "service a", hasEndpoints(ns, "a", "10.1.0.1"))
	if len(got) != 1 {
		t.Errorf("watcher for %q sees %d services, want only %s/a:\n%s", mine, len(got), ns, describe(got))
	}
	all := unnamed.waitFor(t, "service c", hasEndpoints(ns, "c", "10.1.0.3"))
	for _, name := range []string{"a", "b"} {
		if find(all, ns, name) != nil {
			t.Errorf("watcher without a name sees labelled service %s/%s", ns, name)
		}
	}

	// Relabelling moves a service (and, as the controller would, its
	// slice) from one proxier to the other.
	svc, err := cp.Client().CoreV1().Services(ns).Get(context.Background(), "c", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Labels = map[string]string{kubetest.ProxyNameLabel: mine}
	kc.UpdateService(svc)
	sl, err := cp.Client().DiscoveryV1().EndpointSlices(ns).Get(context.Background(), "c-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sl.Labels == nil {
		sl.Labels = map[string]string{}
	}
	sl.Labels[kubetest.ProxyNameLabel] = mine
	kc.UpdateSlice(sl)
	named.waitFor(t, "service c under the proxy name", hasEndpoints(ns, "c", "10.1.0.3"))
	unnamed.waitFor(t, "service c gone from the unlabelled view", absent(ns, "c"))
}

// TestHeadlessLabelledSlicesAreLeftOut: an EndpointSlice labelled
// service.kubernetes.io/headless is not programmed for a Service with a
// cluster IP, as kube-proxy leaves it out (Kubernetes' e2e test "Services
// should implement service.kubernetes.io/headless" found kpng serving
// it); the label removed, its endpoints come back. A headless Service's
// labelled slices (the EndpointSlice controller labels them all) are kept:
// specialized proxiers program them.
func TestHeadlessLabelledSlicesAreLeftOut(t *testing.T) {
	cp.Require(t)
	kc := kubetest.Client{T: t, C: cp.Client()}
	ns := kubetest.Namespace(t, cp.Client())
	name := kubetest.UniqueName("headless")
	svc := kc.CreateService(kubetest.Service(ns, "web", name))
	sl := kc.CreateSlice(kubetest.Slice(svc, "web-1", kubetest.EP{IP: "10.4.0.1"}))
	r := startWatcher(t, watcher.Config{ServiceProxyName: name})
	r.waitFor(t, "the slice's endpoint", hasEndpoints(ns, "web", "10.4.0.1"))

	sl.Labels[watcher.HeadlessLabel] = ""
	sl = kc.UpdateSlice(sl)
	r.waitFor(t, "no endpoints once the slice is labelled headless", func(s []*model.ServiceEndpoints) bool {
		se := find(s, ns, "web")
		return se != nil && len(se.Endpoints) == 0
	})

	delete(sl.Labels, watcher.HeadlessLabel)
	kc.UpdateSlice(sl)
	r.waitFor(t, "the endpoint back once the label is gone", hasEndpoints(ns, "web", "10.4.0.1"))

	headless := kc.CreateService(kubetest.Service(ns, "hl", name, func(s *v1.Service) { s.Spec.ClusterIP = v1.ClusterIPNone }))
	hsl := kubetest.Slice(headless, "hl-1", kubetest.EP{IP: "10.4.0.2"})
	hsl.Labels[watcher.HeadlessLabel] = ""
	kc.CreateSlice(hsl)
	r.waitFor(t, "a headless service's labelled slice kept", hasEndpoints(ns, "hl", "10.4.0.2"))
}

func TestUpdatesAndDeletionsPropagate(t *testing.T) {
	cp.Require(t)
	kc := kubetest.Client{T: t, C: cp.Client()}
	ns := kubetest.Namespace(t, cp.Client())
	name := kubetest.UniqueName("upd")
	r := startWatcher(t, watcher.Config{ServiceProxyName: name, NodeName: "node-a"})
	r.waitCalls(t, "Reset")

	svc := kc.CreateService(kubetest.Service(ns, "web", name))
	sl := kc.CreateSlice(kubetest.Slice(svc, "web-1", kubetest.EP{IP: "10.2.0.1", Node: "node-a"}, kubetest.EP{IP: "10.2.0.2", Node: "node-b"}))
	key := ns + "/web"
	r.waitFor(t, "two endpoints", hasEndpoints(ns, "web", "10.2.0.1", "10.2.0.2"))
	// The service and its slice may come in one round or two: the state
	// says they came; forget the calls that brought them.
	r.waitCalls(t, "Sync")

	// One endpoint changes: exactly that endpoint is set again.
	sl.Endpoints[1].Conditions.Ready = ptr(false)
	sl = kc.UpdateSlice(sl)
	st := r.waitFor(t, "endpoint not ready", func(s []*model.ServiceEndpoints) bool {
		se := find(s, ns, "web")
		return se != nil && len(se.Endpoints) == 2 && !se.Endpoints[1].Ready
	})
	if diff := cmp.Diff([]string{"Update " + key + " +10.2.0.2", "Sync"}, r.takeCalls()); diff != "" {
		t.Errorf("calls for one endpoint change (-want +got):\n%s", diff)
	}
	if ep := find(st, ns, "web").Endpoints[0]; !ep.Local || ep.NodeName != "node-a" {
		t.Errorf("endpoint on node-a: Local=%v NodeName=%q, want local", ep.Local, ep.NodeName)
	}

	// A service change without endpoint change: only the service.
	svc.Spec.Ports[0].Port = 81
	kc.UpdateService(svc)
	r.waitFor(t, "port 81", func(s []*model.ServiceEndpoints) bool {
		se := find(s, ns, "web")
		return se != nil && se.Service.Ports[0].Port == 81
	})
	if diff := cmp.Diff([]string{"Update " + key + " service", "Sync"}, r.takeCalls()); diff != "" {
		t.Errorf("calls for a port change (-want +got):\n%s", diff)
	}

	// An endpoint removed.
	sl.Endpoints = sl.Endpoints[:1]
	kc.UpdateSlice(sl)
	r.waitFor(t, "one endpoint", hasEndpoints(ns, "web", "10.2.0.1"))
	if diff := cmp.Diff([]string{"Update " + key + " -10.2.0.2", "Sync"}, r.takeCalls()); diff != "" {
		t.Errorf("calls for an endpoint removal (-want +got):\n%s", diff)
	}

	// The service deleted (its slice stays, as it would until the
	// garbage collector runs): it goes with its endpoints.
	kc.DeleteService(ns, "web")
	r.waitFor(t, "service gone", absent(ns, "web"))
	if diff := cmp.Diff([]string{"Update " + key + " deleted", "Sync"}, r.takeCalls()); diff != "" {
		t.Errorf("calls for a service deletion (-want +got):\n%s", diff)
	}
}

func ptr[T any](v T) *T { return &v }

func TestConditionsDualStackAndMultipleSlices(t *testing.T) {
	cp.Require(t)
	kc := kubetest.Client{T: t, C: cp.Client()}
	ns := kubetest.Namespace(t, cp.Client())
	name := kubetest.UniqueName("cond")
	r := startWatcher(t, watcher.Config{ServiceProxyName: name, NodeName: "node-a"})

	svc := kc.CreateService(kubetest.Service(ns, "ds", name, func(s *v1.Service) {
		p := v1.IPFamilyPolicyRequireDualStack
		s.Spec.IPFamilyPolicy = &p
	}))
	kc.CreateSlice(kubetest.Slice(svc, "ds-v4-a",
		kubetest.EP{IP: "10.3.0.1", Node: "node-a"},
		kubetest.EP{IP: "10.3.0.2", Node: "node-b", NotReady: true, Terminating: true},
		kubetest.EP{IP: "10.3.0.3", Node: "node-b", NotReady: true, NotServing: true}))
	// A second IPv4 slice holding an address that is also in the first
	// (a slice transition): it must appear once.
	kc.CreateSlice(kubetest.Slice(svc, "ds-v4-b", kubetest.EP{IP: "10.3.0.4"}, kubetest.EP{IP: "10.3.0.1", Node: "node-a"}))
	kc.CreateSlice(kubetest.Slice(svc, "ds-v6", kubetest.EP{IP: "fd00::1", Node: "node-a"}))

	st := r.waitFor(t, "all endpoints", hasEndpoints(ns, "ds", "10.3.0.1", "10.3.0.2", "10.3.0.3", "10.3.0.4", "fd00::1"))
	se := find(st, ns, "ds")
	if got := se.Service.IPs.ClusterIPs; len(got.V4) != 1 || len(got.V6) != 1 || se.Service.IPs.Headless {
		t.Errorf("dual-stack cluster IPs = %+v (headless %v), want one of each family", got, se.Service.IPs.Headless)
	}
	type cond struct{ Local, Ready, Serving, Terminating bool }
	want := map[string]cond{
		"10.3.0.1": {Local: true, Ready: true, Serving: true},
		"10.3.0.2": {Serving: true, Terminating: true},
		"10.3.0.3": {},
		"10.3.0.4": {Ready: true, Serving: true},
		"fd00::1":  {Local: true, Ready: true, Serving: true},
	}
	got := map[string]cond{}
	for _, ep := range se.Endpoints {
		got[ep.Key()] = cond{ep.Local, ep.Ready, ep.Serving, ep.Terminating}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("endpoint conditions (-want +got):\n%s", diff)
	}

	// Removing the first slice keeps the shared address (still in the
	// second slice) and drops the others.
	kc.DeleteSlice(ns, "ds-v4-a")
	r.waitFor(t, "first slice gone", hasEndpoints(ns, "ds", "10.3.0.1", "10.3.0.4", "fd00::1"))
}

// TestReusedAddressPrefersNotTerminating: a pod IP reused while the old
// pod terminates is in two slices; the copy that is not terminating is
// kept, with its port, as kube-proxy v1.36 does (the terminating copy's
// slice comes first by name).
func TestReusedAddressPrefersNotTerminating(t *testing.T) {
	cp.Require(t)
	kc := kubetest.Client{T: t, C: cp.Client()}
	ns := kubetest.Namespace(t, cp.Client())
	name := kubetest.UniqueName("reuse")
	r := startWatcher(t, watcher.Config{ServiceProxyName: name, NodeName: "node-a"})

	svc := kc.CreateService(kubetest.Service(ns, "web", name, func(s *v1.Service) {
		s.Spec.Ports[0].TargetPort = intstr.FromString("web")
	}))
	old := kubetest.Slice(svc, "web-a", kubetest.EP{IP: "10.4.0.1", Node: "node-a", NotReady: true, Terminating: true})
	old.Ports[0].Port = ptr[int32](8080)
	kc.CreateSlice(old)
	cur := kubetest.Slice(svc, "web-b", kubetest.EP{IP: "10.4.0.1", Node: "node-b"})
	cur.Ports[0].Port = ptr[int32](9090)
	kc.CreateSlice(cur)

	st := r.waitFor(t, "the reused address", func(s []*model.ServiceEndpoints) bool {
		se := find(s, ns, "web")
		return se != nil && len(se.Endpoints) == 1 && se.Endpoints[0].NodeName == "node-b"
	})
	se := find(st, ns, "web")
	ep := se.Endpoints[0]
	port, ok := ep.PortFor(se.Service.Ports[0])
	if !ep.Ready || ep.Terminating || ep.Local || port != 9090 || !ok {
		t.Errorf("endpoint %s: ready %v terminating %v local %v port %d (%v), want the new pod's copy: ready, not terminating, on node-b, port 9090",
			ep.Key(), ep.Ready, ep.Terminating, ep.Local, port, ok)
	}
}

// TestServiceCIDRsOnlyForTheDefaultProxier: the watcher without a
// service-proxy-name gives the ServiceCIDR objects' ranges as cluster
// facts (the API server's default one, "kubernetes", from its
// --service-cluster-ip-range, and one added and removed); the watcher of
// a proxy name never gives any.
func TestServiceCIDRsOnlyForTheDefaultProxier(t *testing.T) {
	cp.Require(t)
	ctx := context.Background()
	named := startWatcher(t, watcher.Config{ServiceProxyName: kubetest.UniqueName("cidrs")})
	unnamed := startWatcher(t, watcher.Config{})
	cidrs := func(r *recorder) string {
		var out []string
		if c := r.Cluster(); c != nil {
			for _, p := range c.ServiceCIDRs {
				out = append(out, p.String())
			}
		}
		return strings.Join(out, ",")
	}
	waitCIDRs := func(want string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for cidrs(unnamed) != want {
			if time.Now().After(deadline) {
				t.Fatalf("service CIDRs %q, want %q", cidrs(unnamed), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitCIDRs("10.96.0.0/16,fd00:10:96::/108")

	name := kubetest.UniqueName("extra")
	api := cp.Client().NetworkingV1().ServiceCIDRs()
	if _, err := api.Create(ctx, &networking.ServiceCIDR{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       networking.ServiceCIDRSpec{CIDRs: []string{"10.97.0.0/24"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// There is no controller-manager to remove the finalizer the API
	// server adds: the test does, so that the object goes.
	remove := func() {
		_ = api.Delete(ctx, name, metav1.DeleteOptions{})
		if c, err := api.Get(ctx, name, metav1.GetOptions{}); err == nil {
			c.Finalizers = nil
			_, _ = api.Update(ctx, c, metav1.UpdateOptions{})
		}
	}
	t.Cleanup(remove)
	waitCIDRs("10.96.0.0/16,10.97.0.0/24,fd00:10:96::/108")
	remove()
	waitCIDRs("10.96.0.0/16,fd00:10:96::/108")

	if got := named.Cluster(); got != nil {
		t.Errorf("the watcher of a proxy name gave cluster facts %+v, want none", got)
	}
	for _, c := range named.takeCalls() {
		if strings.HasPrefix(c, "SetCluster") {
			t.Errorf("the watcher of a proxy name called %s", c)
		}
	}
}

func TestSliceMovedBetweenServices(t *testing.T) {
	cp.Require(t)
	kc := kubetest.Client{T: t, C: cp.Client()}
	ns := kubetest.Namespace(t, cp.Client())
	name := kubetest.UniqueName("move")
	r := startWatcher(t, watcher.Config{ServiceProxyName: name})
	a := kc.CreateService(kubetest.Service(ns, "a", name))
	kc.CreateService(kubetest.Service(ns, "b", name))
	sl := kc.CreateSlice(kubetest.Slice(a, "s", kubetest.EP{IP: "10.4.0.1"}))
	r.waitFor(t, "slice under a", func(s []*model.ServiceEndpoints) bool {
		return hasEndpoints(ns, "a", "10.4.0.1")(s) && hasEndpoints(ns, "b")(s)
	})
	sl.Labels[discovery.LabelServiceName] = "b"
	kc.UpdateSlice(sl)
	r.waitFor(t, "slice under b", func(s []*model.ServiceEndpoints) bool {
		return hasEndpoints(ns, "a")(s) && hasEndpoints(ns, "b", "10.4.0.1")(s)
	})
}

func TestNodeZoneDrivesHints(t *testing.T) {
	cp.Require(t)
	kc := kubetest.Client{T: t, C: cp.Client()}
	ns := kubetest.Namespace(t, cp.Client())
	name := kubetest.UniqueName("zone")
	nodeName := kubetest.UniqueName("node")
	node, err := cp.Client().CoreV1().Nodes().Create(context.Background(), &v1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: nodeName, Labels: map[string]string{"topology.kubernetes.io/zone": "zone-a"},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r := startWatcher(t, watcher.Config{ServiceProxyName: name, NodeName: nodeName})
	svc := kc.CreateService(kubetest.Service(ns, "h", name))
	kc.CreateSlice(kubetest.Slice(svc, "h-1",
		kubetest.EP{IP: "10.5.0.1", Zone: "zone-a", ForZones: []string{"zone-a"}},
		kubetest.EP{IP: "10.5.0.2", Zone: "zone-b", ForZones: []string{"zone-b"}, ForNodes: []string{nodeName}}))
	sameZone := func(zoneA, zoneB, nodeB bool) func([]*model.ServiceEndpoints) bool {
		return func(s []*model.ServiceEndpoints) bool {
			se := find(s, ns, "h")
			if se == nil || len(se.Endpoints) != 2 || se.Endpoints[0].Hints == nil || se.Endpoints[1].Hints == nil {
				return false
			}
			return se.Endpoints[0].Hints.SameZone == zoneA && se.Endpoints[1].Hints.SameZone == zoneB &&
				se.Endpoints[1].Hints.SameNode == nodeB && !se.Endpoints[0].Hints.SameNode
		}
	}
	r.waitFor(t, "zone-a hints match", sameZone(true, false, true))
	node.Labels["topology.kubernetes.io/zone"] = "zone-b"
	if _, err := cp.Client().CoreV1().Nodes().Update(context.Background(), node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.waitFor(t, "zone-b hints match after the node moved", sameZone(false, true, true))
}

func TestFirstStateIsComplete(t *testing.T) {
	cp.Require(t)
	kc := kubetest.Client{T: t, C: cp.Client()}
	ns := kubetest.Namespace(t, cp.Client())
	name := kubetest.UniqueName("first")
	// Enough objects that the informers' handlers lag behind their stores
	// when the stores report synced.
	const n = 400
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 8 {
				svc := kc.CreateService(kubetest.Service(ns, fmt.Sprintf("s%03d", i), name))
				kc.CreateSlice(kubetest.Slice(svc, fmt.Sprintf("s%03d-1", i), kubetest.EP{IP: fmt.Sprintf("10.6.%d.%d", i/250, i%250+1)}))
			}
		}()
	}
	wg.Wait()
	r := startWatcher(t, watcher.Config{ServiceProxyName: name})
	r.waitFor(t, "first state", func(s []*model.ServiceEndpoints) bool { return true })
	first := r.allStates()[0]
	if len(first) != n {
		t.Fatalf("first state has %d services, want all %d:\n%s", len(first), n, describe(first))
	}
	for i, se := range first {
		if want := fmt.Sprintf("10.6.%d.%d", i/250, i%250+1); !cmp.Equal(endpointKeys(se), []string{want}) {
			t.Errorf("first state: %s has endpoints %v, want [%s]", se.Service.Key(), endpointKeys(se), want)
		}
	}
}

func TestBurstsAreCoalesced(t *testing.T) {
	cp.Require(t)
	kc := kubetest.Client{T: t, C: cp.Client()}
	ns := kubetest.Namespace(t, cp.Client())
	name := kubetest.UniqueName("burst")
	r := startWatcher(t, watcher.Config{ServiceProxyName: name, MinSyncInterval: 300 * time.Millisecond})
	r.waitFor(t, "empty first state", func(s []*model.ServiceEndpoints) bool { return len(s) == 0 })
	const n = 60
	start := time.Now()
	for i := range n {
		kc.CreateService(kubetest.Service(ns, fmt.Sprintf("s%02d", i), name))
	}
	elapsed := time.Since(start)
	r.waitFor(t, "all services", func(s []*model.ServiceEndpoints) bool { return len(s) == n })
	states := r.allStates()
	// 60 creations, at most one delivery per 300ms: far fewer states than
	// events (the bound allows for slow machines: one per interval, plus
	// the first state, plus the trailing one).
	maxStates := 2 + int(elapsed/(300*time.Millisecond)) + 1
	if len(states) > maxStates || len(states) >= n {
		t.Errorf("%d creations in %v gave %d full states, want at most %d", n, elapsed, len(states), maxStates)
	}
	for i := 1; i < len(states); i++ {
		if len(states[i]) < len(states[i-1]) {
			t.Errorf("state %d has %d services, fewer than the %d before: a partial state", i, len(states[i]), len(states[i-1]))
		}
	}
}

func TestAPIServerRestart(t *testing.T) {
	cp.Require(t)
	kc := kubetest.Client{T: t, C: cp.Client()}
	ns := kubetest.Namespace(t, cp.Client())
	name := kubetest.UniqueName("restart")
	svc := kc.CreateService(kubetest.Service(ns, "r", name))
	sl := kc.CreateSlice(kubetest.Slice(svc, "r-1", kubetest.EP{IP: "10.7.0.1"}, kubetest.EP{IP: "10.7.0.2"}))
	// The watcher's client counts, by resource, the requests that failed.
	var mu sync.Mutex
	failed := map[string]int{}
	cfg := cp.RESTConfig()
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(req)
			if err != nil {
				mu.Lock()
				failed[path.Base(req.URL.Path)]++
				mu.Unlock()
			}
			return resp, err
		})
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := startWatcher(t, watcher.Config{Client: client, ServiceProxyName: name})
	r.waitFor(t, "initial state", hasEndpoints(ns, "r", "10.7.0.1", "10.7.0.2"))
	before := len(r.allStates())

	if err := cp.KillAPIServer(); err != nil {
		t.Fatalf("kill API server: %v", err)
	}
	// The watcher saw its watches of services and slices end: it tried
	// again, and failed, while the API server was down.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		seen := failed["services"] > 0 && failed["endpointslices"] > 0
		mu.Unlock()
		if seen {
			break
		}
		if time.Now().After(deadline) {
			mu.Lock()
			t.Fatalf("the watcher's requests failed %v times, by resource, 30 s after the API server was killed: want services and endpointslices", failed)
		}
	}
	if err := cp.StartAPIServer(); err != nil {
		t.Fatalf("restart API server: %v", err)
	}
	// A change made after the restart reaches the sink.
	sl.Endpoints = append(sl.Endpoints, discovery.Endpoint{Addresses: []string{"10.7.0.3"}})
	kc.UpdateSlice(sl)
	r.waitFor(t, "the change made after the restart", hasEndpoints(ns, "r", "10.7.0.1", "10.7.0.2", "10.7.0.3"))

	for i, st := range r.allStates()[before:] {
		se := find(st, ns, "r")
		if se == nil || len(se.Endpoints) < 2 {
			t.Errorf("state %d after the restart lost the service or its endpoints:\n%s", before+i, describe(st))
		}
	}
}

// roundTripFunc is a function as an http.RoundTripper.
type roundTripFunc func(*http.Request) (*http.Response, error)

// RoundTrip implements http.RoundTripper.
func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

func TestNewRejectsBadConfig(t *testing.T) {
	cp.Require(t)
	if _, err := watcher.New(watcher.Config{Client: cp.Client(), ServiceProxyName: "not a label value!"}); err == nil ||
		!strings.Contains(err.Error(), "service-proxy-name") {
		t.Errorf("New with an invalid service-proxy-name: error %v, want one naming service-proxy-name", err)
	}
	if _, err := watcher.New(watcher.Config{}); err == nil {
		t.Errorf("New without a client: no error")
	}
}
