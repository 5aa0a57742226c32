package userspace

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"testing"

	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/model"
)

// fakePlatform holds addresses in a map and, like netsh on Windows, fails
// to add an address already there; sockets open in the test's own
// network namespace (the tests use loopback addresses).
type fakePlatform struct {
	mu     sync.Mutex
	held   map[netip.Addr]bool
	adds   int
	closed bool
	// noSockets makes every socket fail to open.
	noSockets bool
	// blackholes are the prefixes routed nowhere.
	blackholes []netip.Prefix
	// afterAdd, if set, is called after each address added, with the
	// number added so far (f.mu not held).
	afterAdd func(adds int)
}

func (f *fakePlatform) addAddress(a netip.Addr) error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return errors.New("platform used after close")
	}
	if f.held[a] {
		f.mu.Unlock()
		return fmt.Errorf("add %s: the object already exists", a)
	}
	f.held[a] = true
	f.adds++
	adds, after := f.adds, f.afterAdd
	f.mu.Unlock()
	if after != nil {
		after(adds)
	}
	return nil
}

func (f *fakePlatform) awaitLocal([]netip.Addr) error { return nil }

func (f *fakePlatform) removeAddress(a netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return errors.New("platform used after close")
	}
	delete(f.held, a)
	return nil
}

func (f *fakePlatform) nodeAddresses() ([]netip.Addr, error) { return nil, nil }

func (f *fakePlatform) blackhole(prefixes []netip.Prefix) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.blackholes = prefixes
	return nil
}

// errNoSockets is the failure of every socket of a fakePlatform with
// noSockets.
var errNoSockets = errors.New("no sockets on this fake platform")

func (f *fakePlatform) in(fn func() error) error {
	if f.noSockets {
		return errNoSockets
	}
	return fn()
}

func (f *fakePlatform) close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	return nil
}

// fakeNodeIP is the node address of the fake proxiers: a loopback
// address nothing else on the machine uses.
var fakeNodeIP = netip.MustParseAddr("127.77.9.1")

// fakeProxier is a proxier on a fakePlatform whose node address is
// fakeNodeIP.
func fakeProxier(t *testing.T) (*Sink, *fakePlatform) {
	t.Helper()
	fp := &fakePlatform{held: map[netip.Addr]bool{}}
	p, err := newProxier(klog.Background(), Config{ServiceProxyName: "fake"}, Options{NodeIPs: []netip.Addr{fakeNodeIP}}.withDefaults("fake"), fp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p, fp
}

// loopService is default/<name> on cluster IP ip (a loopback address) and
// the given ports.
func loopService(name, ip string, ports ...*model.PortMapping) *model.ServiceEndpoints {
	return &model.ServiceEndpoints{
		Service:   &model.Service{Namespace: "default", Name: name, Type: "ClusterIP", IPs: model.ServiceIPs{ClusterIPs: ipset(ip)}, Ports: ports},
		Endpoints: []*model.Endpoint{ep("127.0.0.2", false)},
	}
}

// TestAddressAddedOnce: two ports of one address, then endpoint changes:
// the address is added once (netsh on Windows refuses a second add), and
// removed with the last frontend using it.
func TestAddressAddedOnce(t *testing.T) {
	p, fp := fakeProxier(t)
	se := loopService("web", "127.0.0.11", &model.PortMapping{Name: "a", Protocol: model.TCP, Port: 18081, TargetPort: 80},
		&model.PortMapping{Name: "b", Protocol: model.UDP, Port: 18081, TargetPort: 80})
	key := se.Service.Key()
	p.Update(key, nil, se)
	if err := p.Sync(); err != nil {
		t.Fatalf("first Sync: %v", err)
	}
	moved := *se
	moved.Endpoints = []*model.Endpoint{ep("127.0.0.3", false)}
	p.Update(key, se, &moved)
	if err := p.Sync(); err != nil {
		t.Fatalf("endpoint change: %v", err)
	}
	if fp.adds != 1 {
		t.Errorf("the address was added %d times, want once", fp.adds)
	}
	p.Update(key, &moved, nil)
	if err := p.Sync(); err != nil {
		t.Fatal(err)
	}
	if len(fp.held) != 0 || len(p.addrRefs) != 0 || len(p.onLink) != 0 {
		t.Errorf("after the service was deleted: held %v, refs %v, on link %v", fp.held, p.addrRefs, p.onLink)
	}
}

// TestAddressKindChange: a service's external IP that is the node's own
// address becomes a node port on the same address and port: the address
// is released with the external IP, never counted for the node port.
func TestAddressKindChange(t *testing.T) {
	p, fp := fakeProxier(t)
	eps := []*model.Endpoint{ep("127.0.0.2", false)}
	ext := &model.Service{Namespace: "default", Name: "a", Type: "ClusterIP",
		IPs:   model.ServiceIPs{ClusterIPs: ipset("127.0.0.12"), ExternalIPs: ipset(fakeNodeIP.String())},
		Ports: []*model.PortMapping{{Name: "p", Protocol: model.TCP, Port: 31080, TargetPort: 80}}}
	np := &model.Service{Namespace: "default", Name: "a", Type: "NodePort",
		IPs:   model.ServiceIPs{ClusterIPs: ipset("127.0.0.12")},
		Ports: []*model.PortMapping{{Name: "p", Protocol: model.TCP, Port: 80, NodePort: 31080, TargetPort: 80}}}
	key := ext.Key()
	for i, svc := range []*model.Service{ext, np, ext, np} {
		p.Update(key, nil, &model.ServiceEndpoints{Service: svc, Endpoints: eps})
		if err := p.Sync(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if want := svc == ext; fp.held[fakeNodeIP] != want {
			t.Errorf("step %d: the node's address held: %v, want %v", i, !want, want)
		}
	}
	p.Update(key, nil, nil)
	if err := p.Sync(); err != nil {
		t.Fatal(err)
	}
	if len(fp.held) != 0 || len(p.addrRefs) != 0 {
		t.Errorf("after the service was deleted: held %v, refs %v", fp.held, p.addrRefs)
	}
}

// TestCloseDuringSync: Close from another goroutine while a Sync runs
// (to-userspace closes on its context) waits for the Sync: the platform
// is never used after it is closed (run with -race). The Sync is held
// after its 100th address until Close has begun.
func TestCloseDuringSync(t *testing.T) {
	p, fp := fakeProxier(t)
	for i := range 200 {
		se := loopService(fmt.Sprintf("s%03d", i), fmt.Sprintf("127.0.%d.%d", 20+i/250, 1+i%250),
			&model.PortMapping{Protocol: model.TCP, Port: 18090, TargetPort: 80})
		p.Update(se.Service.Key(), nil, se)
	}
	midway, release := make(chan struct{}), make(chan struct{})
	fp.mu.Lock()
	fp.afterAdd = func(adds int) {
		if adds == 100 {
			close(midway)
			<-release
		}
	}
	fp.mu.Unlock()
	done := make(chan error, 1)
	go func() { done <- p.Sync() }()
	<-midway
	closed := make(chan struct{})
	go func() {
		p.Close()
		close(closed)
	}()
	// Close has begun (it marks the proxier closed first): let the Sync go on.
	for {
		p.mu.Lock()
		c := p.closed
		p.mu.Unlock()
		if c {
			break
		}
		runtime.Gosched()
	}
	close(release)
	// The fake platform refuses an address once it is closed.
	if err := <-done; err != nil {
		t.Errorf("Sync: %v", err)
	}
	<-closed
	if err := p.Sync(); err != nil {
		t.Errorf("Sync after Close: %v", err)
	}
	fp.mu.Lock()
	defer fp.mu.Unlock()
	if !fp.closed {
		t.Error("the platform was not closed")
	}
}

// TestWaitingServiceGetsAddress: a service waiting for another's address
// stays waiting across Syncs, and gets the address in the round where the
// other lets it go.
func TestWaitingServiceGetsAddress(t *testing.T) {
	p, _ := fakeProxier(t)
	port := &model.PortMapping{Protocol: model.TCP, Port: 18095, TargetPort: 80}
	a, b := loopService("a", "127.0.0.13", port), loopService("b", "127.0.0.13", port)
	p.Update(a.Service.Key(), nil, a)
	p.Update(b.Service.Key(), nil, b)
	for range 2 {
		if err := p.Sync(); err != nil {
			t.Fatal(err)
		}
		if !p.losers[b.Service.Key()] {
			t.Fatalf("b is not waiting: %v", p.losers)
		}
		want := []model.Problem{{Service: b.Service.Key(), Field: "spec.clusterIPs", Reason: model.ReasonAddressConflict,
			Message: `service default/b port "": TCP 127.0.0.13:18095 already used by service default/a: not proxied until it lets go`}}
		if got := p.Problems(); !slices.Equal(got, want) {
			t.Errorf("problems while b waits: %+v, want %+v", got, want)
		}
	}
	p.Update(a.Service.Key(), a, nil)
	if err := p.Sync(); err != nil {
		t.Fatal(err)
	}
	k := frontendKey{model.TCP, netip.MustParseAddrPort("127.0.0.13:18095")}
	if owner := p.owners[k]; owner != b.Service.Key() || len(p.losers) != 0 {
		t.Errorf("after a left: owner %v, waiting %v; want b, nobody", owner, p.losers)
	}
	if got := p.Problems(); len(got) != 0 {
		t.Errorf("problems after a left: %+v, want none", got)
	}
}
