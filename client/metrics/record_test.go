package metrics

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"sigs.k8s.io/kpng/localsink"
	kmodel "sigs.k8s.io/kpng/model"
)

// histogram returns the cumulative bucket counts of histogram name, by
// upper bound.
func histogram(t *testing.T, r *Recorder, name string) map[float64]uint64 {
	t.Helper()
	out := map[float64]uint64{}
	for _, b := range families(t, r)[name].GetMetric()[0].GetHistogram().GetBucket() {
		out[b.GetUpperBound()] = b.GetCumulativeCount()
	}
	return out
}

// TestNetworkProgrammingLatency: each trigger time of a round applied is
// one sample, from the trigger to the end of the round, in kube-proxy's
// buckets; a failed round measures nothing.
func TestNetworkProgrammingLatency(t *testing.T) {
	now := time.Unix(1000, 0)
	r := New(Options{ServiceProxyName: "p", Now: func() time.Time { return now }})
	a := kmodel.ServiceKey{Namespace: "ns", Name: "a"}
	r.Observe(localsink.Round{Start: now, Duration: time.Second, Err: errTest})
	r.Observe(localsink.Round{Start: now, Duration: time.Second, Triggers: map[kmodel.ServiceKey][]time.Time{
		a: {now.Add(-200 * time.Millisecond), now.Add(-89 * time.Second)},
	}})
	b := histogram(t, r, "kpng_network_programming_duration_seconds")
	// 1.2 s and 90 s: kube-proxy's buckets 0.25, 0.5, 1..59, 60..115 by 5,
	// 120..300 by 30.
	for bound, want := range map[float64]uint64{1: 0, 2: 1, 85: 1, 90: 2, 300: 2} {
		if b[bound] != want {
			t.Errorf("bucket le=%v: %d, want %d", bound, b[bound], want)
		}
	}
	if len(b) != 2+59+12+7+1 {
		t.Errorf("%d buckets, want kube-proxy's 80 and +Inf", len(b))
	}
}

var errTest = &kmodel.Problem{Message: "test failure"}

// TestRecorderHeld: what the backend holds (services, endpoints, the
// service ports whose Local traffic this node drops), from the rounds'
// changes; the events behind the rounds; the pending changes.
func TestRecorderHeld(t *testing.T) {
	now := time.Unix(1000, 0)
	r := New(Options{ServiceProxyName: "p", Now: func() time.Time { return now }})
	svc := func(name string, internalLocal, externalLocal bool) *kmodel.Service {
		return &kmodel.Service{Namespace: "ns", Name: name, Type: "NodePort", InternalTrafficToLocal: internalLocal, ExternalTrafficToLocal: externalLocal,
			Ports: []*kmodel.PortMapping{{Name: "a", Protocol: kmodel.TCP, Port: 80, TargetPort: 80}, {Name: "b", Protocol: kmodel.UDP, Port: 53, TargetPort: 53}}}
	}
	ep := func(ip string, local bool) *kmodel.Endpoint {
		set, _ := kmodel.NewIPSet(ip)
		return &kmodel.Endpoint{IPs: set, Ready: true, Serving: true, Local: local}
	}
	remote := &kmodel.ServiceEndpoints{Service: svc("remote", true, true), Endpoints: []*kmodel.Endpoint{ep("10.0.0.1", false), ep("10.0.0.2", false)}}
	local := &kmodel.ServiceEndpoints{Service: svc("local", true, false), Endpoints: []*kmodel.Endpoint{ep("10.0.0.3", true)}}
	none := &kmodel.ServiceEndpoints{Service: svc("none", true, true)}
	key := func(se *kmodel.ServiceEndpoints) kmodel.ServiceKey { return se.Service.Key() }
	r.Observe(localsink.Round{Start: now, Reset: true, Services: 3, Events: 5, FirstEvent: now.Add(-300 * time.Millisecond),
		Changes: []localsink.Change{{Key: key(local), Cur: local}, {Key: key(none), Cur: none}, {Key: key(remote), Cur: remote}}})
	m := scrape(t, r)
	for name, want := range map[string]float64{
		"kpng_services": 3, "kpng_endpoints": 3,
		// remote: both ports drop internal and external traffic; none
		// has no endpoint at all (reject, not drop); local has one.
		"kpng_sync_proxy_rules_no_local_endpoints_total/internal": 2,
		"kpng_sync_proxy_rules_no_local_endpoints_total/external": 2,
		"kpng_events_total": 5, "kpng_events_coalesced_total": 2, "kpng_event_delivery_duration_seconds": 1,
		"kpng_sync_full_proxy_rules_duration_seconds": 1, "kpng_sync_partial_proxy_rules_duration_seconds": 0,
	} {
		if m[name] != want {
			t.Errorf("%s = %v, want %v", name, m[name], want)
		}
	}
	// remote gets a local endpoint and fails to apply; local goes.
	remote2 := &kmodel.ServiceEndpoints{Service: remote.Service, Endpoints: append(remote.Endpoints, ep("10.0.0.4", true))}
	r.Observe(localsink.Round{Start: now, Services: 2, Endpoints: 2, Err: errTest, PendingServices: 2, PendingEndpoints: 2,
		Changes: []localsink.Change{{Key: key(local)}, {Key: key(remote), Cur: remote2}}})
	m = scrape(t, r)
	for name, want := range map[string]float64{
		"kpng_services": 2, "kpng_endpoints": 3,
		"kpng_sync_proxy_rules_no_local_endpoints_total/internal": 0,
		"kpng_sync_proxy_rules_no_local_endpoints_total/external": 0,
		"kpng_sync_proxy_rules_service_changes_pending":           2, "kpng_sync_proxy_rules_endpoint_changes_pending": 2,
		"kpng_sync_partial_proxy_rules_duration_seconds": 1,
	} {
		if m[name] != want {
			t.Errorf("after the second round: %s = %v, want %v", name, m[name], want)
		}
	}
}

// TestRecorderProblems: the problems by reason (gauge: those held now;
// counter: each once when it appears), and the debug endpoint listing
// what the backend holds and what it refused.
func TestRecorderProblems(t *testing.T) {
	r := New(Options{ServiceProxyName: "p"})
	a := &kmodel.ServiceEndpoints{Service: &kmodel.Service{Namespace: "ns", Name: "a", Type: "ClusterIP"}}
	b := &kmodel.ServiceEndpoints{Service: &kmodel.Service{Namespace: "ns", Name: "b", Type: "ClusterIP"}}
	conflict := kmodel.Problem{Service: b.Service.Key(), Field: "spec.externalIPs", Reason: kmodel.ReasonAddressConflict, Message: "service ns/b: ipv4 10.0.0.1 is already used by service ns/a: ignored"}
	proto := kmodel.Problem{Service: a.Service.Key(), Field: "spec.ports[0].protocol", Reason: kmodel.ReasonUnsupportedProtocol, Message: "sctp"}
	r.Observe(localsink.Round{Reset: true, Changes: []localsink.Change{{Key: a.Service.Key(), Cur: a}, {Key: b.Service.Key(), Cur: b}},
		Problems: []kmodel.Problem{conflict, proto}, NewProblems: []kmodel.Problem{conflict, proto}})
	r.Observe(localsink.Round{Problems: []kmodel.Problem{conflict}})
	m := scrape(t, r)
	for name, want := range map[string]float64{
		"kpng_service_problems/AddressConflict": 1, "kpng_service_problems/UnsupportedProtocol": 0,
		"kpng_service_problems_total/AddressConflict": 1, "kpng_service_problems_total/UnsupportedProtocol": 1,
	} {
		if m[name] != want {
			t.Errorf("%s = %v, want %v", name, m[name], want)
		}
	}

	get := func(query string) (int, Debug) {
		rec := httptest.NewRecorder()
		r.DebugHandler().ServeHTTP(rec, httptest.NewRequest("GET", DebugPath+query, nil))
		var d Debug
		if rec.Code == http.StatusOK {
			if err := json.Unmarshal(rec.Body.Bytes(), &d); err != nil {
				t.Fatalf("debug endpoint: %v\n%s", err, rec.Body)
			}
		}
		return rec.Code, d
	}
	code, d := get("")
	want := Debug{ServiceProxyName: "p", Services: []*kmodel.ServiceEndpoints{a, b}, Problems: []kmodel.Problem{conflict}}
	if diff := cmp.Diff(want, d); code != http.StatusOK || diff != "" {
		t.Errorf("debug endpoint: %d, (-want +got):\n%s", code, diff)
	}
	code, d = get("?service=ns/b")
	want = Debug{ServiceProxyName: "p", Services: []*kmodel.ServiceEndpoints{b}, Problems: []kmodel.Problem{conflict}}
	if diff := cmp.Diff(want, d); code != http.StatusOK || diff != "" {
		t.Errorf("debug endpoint for ns/b: %d, (-want +got):\n%s", code, diff)
	}
	if code, _ := get("?service=ns/gone"); code != http.StatusNotFound {
		t.Errorf("debug endpoint for a service not held: %d, want 404", code)
	}
	if code, _ := get("?service=nonamespace"); code != http.StatusBadRequest {
		t.Errorf("debug endpoint with a bad service: %d, want 400", code)
	}
}

// TestHealthNodeEligible: /healthz fails while the node is not eligible,
// /livez does not; the bodies have kube-proxy's shape.
func TestHealthNodeEligible(t *testing.T) {
	now := time.Unix(1000, 0)
	r := New(Options{ServiceProxyName: "p", Now: func() time.Time { return now }})
	r.Observe(localsink.Round{Start: now, Reset: true})
	body := func(path string) (int, map[string]any) {
		rec := httptest.NewRecorder()
		r.HealthHandler().ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		var b map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &b); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return rec.Code, b
	}
	stamp := now.UTC().Format(time.RFC3339)
	code, b := body("/healthz")
	if want := map[string]any{"lastUpdated": stamp, "currentTime": stamp, "healthy": true}; code != 200 || !cmp.Equal(want, b) {
		t.Errorf("/healthz before the node is known: %d %v, want 200 %v", code, b, want)
	}
	r.SetNodeEligible(false)
	code, b = body("/healthz")
	if want := map[string]any{"lastUpdated": stamp, "currentTime": stamp, "healthy": true, "nodeEligible": false}; code != 503 || !cmp.Equal(want, b) {
		t.Errorf("/healthz with the node not eligible: %d %v, want 503 %v", code, b, want)
	}
	code, b = body("/livez")
	if want := map[string]any{"lastUpdated": stamp, "currentTime": stamp, "healthy": true}; code != 200 || !cmp.Equal(want, b) {
		t.Errorf("/livez with the node not eligible: %d %v, want 200 %v", code, b, want)
	}
	if m := scrape(t, r); m["kpng_node_eligible"] != 0 || m["kpng_proxy_healthz_total/503"] != 1 {
		t.Errorf("metrics: node eligible %v, healthz 503 %v", m["kpng_node_eligible"], m["kpng_proxy_healthz_total/503"])
	}
	r.SetNodeEligible(true)
	if code, b = body("/healthz"); code != 200 || b["nodeEligible"] != true {
		t.Errorf("/healthz with the node eligible again: %d %v", code, b)
	}
	// Unhealthy: lastUpdated is the last sync.
	r.Queued(now)
	now = now.Add(2 * DefaultHealthTimeout)
	if code, b = body("/livez"); code != 503 || b["lastUpdated"] != stamp || b["healthy"] != false {
		t.Errorf("/livez unhealthy: %d %v", code, b)
	}
}
