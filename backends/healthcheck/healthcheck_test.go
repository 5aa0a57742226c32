package healthcheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/localsink/sinktest"
	"sigs.k8s.io/kpng/model"
)

// freePorts returns n TCP ports free on loopback.
func freePorts(t *testing.T, n int) []int32 {
	t.Helper()
	var ports []int32
	var lns []net.Listener
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		ports = append(ports, int32(ln.Addr().(*net.TCPAddr).Port))
	}
	for _, ln := range lns {
		ln.Close()
	}
	return ports
}

// loopback is a Config serving on 127.0.0.1 only (the unit tests never
// listen elsewhere): the node's one address, selected explicitly (the
// default leaves loopback out).
var loopback = Config{
	Addresses:         func() ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil },
	NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
}

// get asks the health check on port p; status 0 means no answer.
func get(t *testing.T, p int32) (int, body) {
	t.Helper()
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", p))
	if err != nil {
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("health check on %d: %v", p, err)
		}
		return 0, body{}
	}
	defer resp.Body.Close()
	var b body
	data, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(data, &b); err != nil {
		t.Fatalf("health check on %d: body %q: %v", p, data, err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("content type %q", ct)
	}
	return resp.StatusCode, b
}

func lbService(name string, hc int32, local bool) *model.Service {
	return &model.Service{Namespace: "default", Name: name, Type: "LoadBalancer", HealthCheckNodePort: hc, ExternalTrafficToLocal: local,
		IPs: model.ServiceIPs{ClusterIPs: model.IPSet{V4: []string{"10.96.0.1"}}}}
}

func endpoint(ip string, local, ready bool) *model.Endpoint {
	return &model.Endpoint{IPs: model.IPSet{V4: []string{ip}}, Local: local, Ready: ready, Serving: ready}
}

// feed returns a Feeder over s through a contract checker, as kpng feeds
// a sink; the test fails at its end if the contract was broken.
func feed(t *testing.T, s *Sink, opts localsink.FeederOptions) *localsink.Feeder {
	c := sinktest.NewChecker(s)
	f := localsink.NewFeeder(c, opts)
	t.Cleanup(func() {
		f.Close()
		if err := c.Err(); err != nil {
			t.Errorf("Sink contract broken:\n%v", err)
		}
	})
	return f
}

func withEndpoints(svc *model.Service, eps ...*model.Endpoint) *model.ServiceEndpoints {
	return &model.ServiceEndpoints{Service: svc, Endpoints: eps}
}

// TestHealthCheck follows one health check node port through a service's
// life: served with the number of ready local endpoints (200), 503 without
// any, a port conflict, the port closed when the service no longer needs
// it, and Close.
func TestHealthCheck(t *testing.T) {
	ports := freePorts(t, 2)
	s := newSink(t, loopback)
	defer s.Close()
	f := feed(t, s, localsink.FeederOptions{NoRetry: true})
	lb := lbService("lb", ports[0], true)
	key := lb.Key()
	ep3 := endpoint("10.1.0.3", false, true) // other node
	ep4 := endpoint("10.1.0.4", true, false) // not ready
	// Same port, later in key order: not served.
	dup := lbService("other", ports[0], true)
	f.SetAll([]*model.ServiceEndpoints{
		withEndpoints(lb, endpoint("10.1.0.1", true, true), endpoint("10.1.0.2", true, true), ep3, ep4),
		withEndpoints(dup),
		// Cluster policy: no health check even with a port.
		withEndpoints(lbService("cluster", ports[1], false)),
	})
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}

	if code, b := get(t, ports[0]); code != http.StatusOK || b.LocalEndpoints != 2 || b.Service.Namespace != "default" || b.Service.Name != "lb" {
		t.Errorf("two local ready endpoints: %d %+v, want 200 with 2 for default/lb", code, b)
	}
	if code, _ := get(t, ports[1]); code != 0 {
		t.Errorf("Cluster policy service: answered %d, want no server", code)
	}
	if got := s.Ports(); len(got) != 1 || got[0] != ports[0] {
		t.Errorf("ports %v, want [%d]", got, ports[0])
	}

	f.Update(key, withEndpoints(lb, ep3, ep4))
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if code, b := get(t, ports[0]); code != http.StatusServiceUnavailable || b.LocalEndpoints != 0 {
		t.Errorf("no local ready endpoint: %d %+v, want 503 with 0", code, b)
	}

	// The port moves: the old one closes, the new one opens.
	f.Update(dup.Key(), nil)
	f.Update(key, withEndpoints(lbService("lb", ports[1], true), ep3, ep4))
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if code, _ := get(t, ports[0]); code != 0 {
		t.Errorf("old port still answers %d", code)
	}
	if code, _ := get(t, ports[1]); code != http.StatusServiceUnavailable {
		t.Errorf("new port: %d, want 503", code)
	}

	s.Close()
	if code, _ := get(t, ports[1]); code != 0 {
		t.Errorf("after Close, answered %d", code)
	}
	if err := s.Sync(); err != nil { // harmless after Close
		t.Errorf("Sync after Close: %v", err)
	}
	if got := s.Ports(); len(got) != 0 {
		t.Errorf("ports after Close: %v", got)
	}
}

// TestHealthCheckListenError checks that a port that cannot be opened
// makes Sync fail with an error naming the service, that the other ports
// are served meanwhile, and that kpng's retry opens it once it is free,
// with no new round.
func TestHealthCheckListenError(t *testing.T) {
	ports := freePorts(t, 2)
	busy, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", ports[0]))
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	s := newSink(t, loopback)
	defer s.Close()
	f := feed(t, s, localsink.FeederOptions{MinRetry: 50 * time.Millisecond, MaxRetry: 100 * time.Millisecond})
	f.SetAll([]*model.ServiceEndpoints{
		withEndpoints(lbService("a", ports[0], true)),
		withEndpoints(lbService("b", ports[1], true), endpoint("10.1.0.1", true, true)),
	})
	err = f.Sync()
	if err == nil || !strings.Contains(err.Error(), "default/a") || !strings.Contains(err.Error(), fmt.Sprint(ports[0])) {
		t.Errorf("Sync with a busy port: %v, want an error naming default/a and port %d", err, ports[0])
	} else if strings.Contains(err.Error(), "default/b") {
		t.Errorf("Sync with a busy port: %v, names default/b, whose port is free", err)
	}
	if got := s.Ports(); len(got) != 1 || got[0] != ports[1] {
		t.Errorf("ports %v, want only %d (the other is busy)", got, ports[1])
	}
	if code, b := get(t, ports[1]); code != http.StatusOK || b.Service.Name != "b" || b.LocalEndpoints != 1 {
		t.Errorf("the free port while the other is busy: %d %+v, want 200 for default/b", code, b)
	}
	busy.Close()
	deadline := time.Now().Add(10 * time.Second)
	for len(s.Ports()) != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("ports %v 10s after the port was freed, want both", s.Ports())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The retry's Sync returns before the Feeder records its success.
	for f.Failed() {
		if time.Now().After(deadline) {
			t.Fatalf("the retry that opened the port still reports a failure")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if code, b := get(t, ports[0]); code != http.StatusServiceUnavailable || b.Service.Name != "a" {
		t.Errorf("freed port: %d %+v, want 503 for default/a", code, b)
	}
	if code, b := get(t, ports[1]); code != http.StatusOK || b.Service.Name != "b" {
		t.Errorf("the other port after the retry: %d %+v, want 200 for default/b", code, b)
	}
}

// TestHealthCheckListenErrorNextSync drives the sink directly: while a
// port is taken by another listener, every Sync fails naming the service
// and the other port is served; once the blocker is gone, the next Sync,
// with no Update, serves the port and succeeds.
func TestHealthCheckListenErrorNextSync(t *testing.T) {
	ports := freePorts(t, 2)
	busy, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", ports[1]))
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	s := newSink(t, loopback)
	defer s.Close()
	a := withEndpoints(lbService("a", ports[0], true), endpoint("10.1.0.1", true, true))
	z := withEndpoints(lbService("z", ports[1], true), endpoint("10.1.0.2", true, true), endpoint("10.1.0.3", true, true))
	s.Reset()
	s.Update(a.Service.Key(), nil, a)
	s.Update(z.Service.Key(), nil, z)
	for i := range 2 { // the round, then a Sync alone while still blocked
		err := s.Sync()
		if err == nil || !strings.Contains(err.Error(), "default/z") || strings.Contains(err.Error(), "default/a") {
			t.Errorf("Sync %d with port %d busy: %v, want an error naming default/z only", i, ports[1], err)
		}
		if got := s.Ports(); len(got) != 1 || got[0] != ports[0] {
			t.Errorf("Sync %d: ports %v, want [%d]", i, got, ports[0])
		}
		if code, b := get(t, ports[0]); code != http.StatusOK || b.Service.Name != "a" || b.LocalEndpoints != 1 {
			t.Errorf("Sync %d: the free port: %d %+v, want 200 for default/a with 1", i, code, b)
		}
	}

	busy.Close()
	if err := s.Sync(); err != nil {
		t.Fatalf("Sync after the port was freed: %v", err)
	}
	if got := s.Ports(); len(got) != 2 {
		t.Errorf("ports %v after the port was freed, want both", got)
	}
	if code, b := get(t, ports[1]); code != http.StatusOK || b.Service.Name != "z" || b.LocalEndpoints != 2 {
		t.Errorf("freed port: %d %+v, want 200 for default/z with 2", code, b)
	}
	if code, b := get(t, ports[0]); code != http.StatusOK || b.Service.Name != "a" {
		t.Errorf("the other port: %d %+v, want 200 for default/a", code, b)
	}
}

// TestHealthCheckProxierUnhealthy: while the proxier is not healthy, a
// port answers 503 even with local endpoints, as kube-proxy's do; the
// answer says so, and carries the endpoint weight header.
func TestHealthCheckProxierUnhealthy(t *testing.T) {
	ports := freePorts(t, 1)
	var healthy atomic.Bool
	healthy.Store(true)
	cfg := loopback
	cfg.Healthy = healthy.Load
	s := newSink(t, cfg)
	defer s.Close()
	f := feed(t, s, localsink.FeederOptions{NoRetry: true})
	f.SetAll([]*model.ServiceEndpoints{withEndpoints(lbService("lb", ports[0], true), endpoint("10.1.0.1", true, true), endpoint("10.1.0.2", true, true))})
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if code, b := get(t, ports[0]); code != http.StatusOK || !b.ServiceProxyHealthy {
		t.Errorf("healthy proxier: %d %+v, want 200", code, b)
	}
	healthy.Store(false)
	if code, b := get(t, ports[0]); code != http.StatusServiceUnavailable || b.ServiceProxyHealthy || b.LocalEndpoints != 2 {
		t.Errorf("unhealthy proxier: %d %+v, want 503 with 2 local endpoints", code, b)
	}
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", ports[0]))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if w := resp.Header.Get("X-Load-Balancing-Endpoint-Weight"); w != "2" {
		t.Errorf("X-Load-Balancing-Endpoint-Weight: %q, want 2", w)
	}
	healthy.Store(true)
	if code, _ := get(t, ports[0]); code != http.StatusOK {
		t.Errorf("healthy again: %d, want 200", code)
	}
}

// TestHealthCheckProblems: a port out of range, used by another service,
// or of a service without a cluster IP is a problem the sink reports,
// naming the service and the field.
func TestHealthCheckProblems(t *testing.T) {
	ports := freePorts(t, 1)
	s := newSink(t, loopback)
	defer s.Close()
	headless := lbService("d", ports[0]+1, true)
	headless.IPs = model.ServiceIPs{Headless: true}
	var rounds []localsink.Round
	f := feed(t, s, localsink.FeederOptions{NoRetry: true, Observe: func(r localsink.Round) { rounds = append(rounds, r) }})
	f.SetAll([]*model.ServiceEndpoints{
		withEndpoints(lbService("a", ports[0], true)),
		withEndpoints(lbService("b", ports[0], true)),
		withEndpoints(lbService("c", 70000, true)),
		withEndpoints(headless),
	})
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	want := []model.Problem{
		{Service: model.ServiceKey{Namespace: "default", Name: "b"}, Field: "spec.healthCheckNodePort", Reason: model.ReasonAddressConflict,
			Message: fmt.Sprintf("service default/b: health check node port %d already used by service default/a: not served", ports[0])},
		{Service: model.ServiceKey{Namespace: "default", Name: "c"}, Field: "spec.healthCheckNodePort", Reason: model.ReasonBadField,
			Message: "service default/c: health check node port 70000 out of range: not served"},
		{Service: model.ServiceKey{Namespace: "default", Name: "d"}, Field: "spec.clusterIPs", Reason: model.ReasonBadField,
			Message: fmt.Sprintf("service default/d: health check node port %d of a service without a cluster IP: not served", ports[0]+1)},
	}
	if len(rounds) != 1 || !slices.Equal(rounds[0].Problems, want) {
		t.Errorf("problems %+v, want %+v", rounds[0].Problems, want)
	}
}

// newSink returns New(ctx, cfg) with a context that ends with the test.
func newSink(t *testing.T, cfg Config) *Sink {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestNewRefusesBadPrefix(t *testing.T) {
	_, err := New(context.Background(), Config{NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("10.0.0.1/8")}})
	if err == nil || !strings.Contains(err.Error(), "NodePortAddresses") {
		t.Errorf("New with a prefix with host bits: %v, want an error naming NodePortAddresses", err)
	}
}

func TestContextEndStopsServing(t *testing.T) {
	ports := freePorts(t, 1)
	ctx, cancel := context.WithCancel(context.Background())
	s, err := New(ctx, loopback)
	if err != nil {
		t.Fatal(err)
	}
	f := feed(t, s, localsink.FeederOptions{NoRetry: true})
	f.SetAll([]*model.ServiceEndpoints{withEndpoints(lbService("lb", ports[0], true), endpoint("10.1.0.1", true, true))})
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if len(s.Ports()) != 1 {
		t.Fatalf("ports %v, want one", s.Ports())
	}
	cancel()
	deadline := time.Now().Add(10 * time.Second)
	for len(s.Ports()) != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if len(s.Ports()) != 0 {
		t.Errorf("ports %v served after the context ended", s.Ports())
	}
}

// TestIdleConnectionsAreClosed serves a health check node port on a real
// loopback port with a short idle timeout: a keep-alive connection left
// idle after its answer is closed by the server (without the timeout, a
// client could hold connections to the node's port for ever), and one
// that never finishes its request is closed too.
func TestIdleConnectionsAreClosed(t *testing.T) {
	saved := serverTimeouts
	serverTimeouts = timeouts{readHeader: 200 * time.Millisecond, read: 200 * time.Millisecond, write: 200 * time.Millisecond, idle: 200 * time.Millisecond}
	t.Cleanup(func() { serverTimeouts = saved })
	ports := freePorts(t, 1)
	s, err := New(context.Background(), loopback)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	f := feed(t, s, localsink.FeederOptions{NoRetry: true})
	f.SetAll([]*model.ServiceEndpoints{withEndpoints(lbService("lb", ports[0], true), endpoint("10.1.0.1", true, true))})
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	for _, tc := range []struct{ what, request string }{
		{"an idle keep-alive connection", "GET /healthz HTTP/1.1\r\nHost: kpng\r\n\r\n"},
		{"a request never finished", "GET /healthz HTTP/1.1\r\nHost: kpng\r\n"},
	} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, tc.request); err != nil {
			t.Fatal(err)
		}
		if err := c.SetReadDeadline(time.Now().Add(20 * time.Second)); err != nil {
			t.Fatal(err)
		}
		// The answer, if any, then the end of the connection.
		if _, err := io.Copy(io.Discard, c); err != nil {
			t.Errorf("%s: %v, want the server to close it", tc.what, err)
		}
	}
}
