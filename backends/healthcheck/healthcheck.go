// Package healthcheck serves the health check node ports of services, as
// kube-proxy does: a LoadBalancer Service with externalTrafficPolicy: Local
// gets a healthCheckNodePort, and the cloud load balancer asks each node,
// over HTTP on that port, whether it has local endpoints for the service
// (200) or not (503), to send traffic only to the nodes that do. As
// kube-proxy's, a port also answers 503 while the proxier itself is not
// healthy (Config.Healthy): a node whose rules lag behind gets no new
// traffic.
//
// As kube-proxy, a port listens only on the node's addresses that
// --nodeport-addresses selects (Config.NodePortAddresses), in the
// families where the service has a cluster IP: not on every address of
// both families, and not on loopback unless a prefix asks for it.
//
// It is a localsink.Sink: put it beside a rule backend with localsink.Tee.
package healthcheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

// Config configures a health check server.
type Config struct {
	// Listen opens the listener of a port on one address ("tcp4",
	// "10.0.0.2:32000"; "tcp6", "[fd00::2]:32000"); nil means net.Listen,
	// in the current network namespace.
	Listen func(network, address string) (net.Listener, error)
	// Addresses lists the node's addresses; nil means those of the
	// interfaces of the current network namespace (net.InterfaceAddrs).
	// Use the namespace Listen listens in. They are read at every Sync
	// that serves a port: an address that came or went is followed at
	// the next round (or retry).
	Addresses func() ([]netip.Addr, error)
	// NodePortAddresses selects the addresses a port listens on, as
	// --nodeport-addresses does for node ports: for each family, the
	// node's addresses inside its prefixes; a family without a prefix
	// here (or with a /0 one), every address of that family but loopback.
	// Link-local addresses are never used.
	NodePortAddresses []netip.Prefix
	// Healthy reports whether the proxier is healthy (its changes are
	// applied in time: metrics.Recorder.Healthy); while it is not, every
	// port answers 503. nil means always healthy.
	Healthy func() bool
}

// Sink serves the health check node ports of the services it receives,
// until the context given to New ends or Close is called.
type Sink struct {
	cfg    Config
	logger klog.Logger
	// services are the services that ask for a health check, as of the
	// last Update, and problems those of the last Sync (touched only by
	// the caller's goroutine).
	services map[model.ServiceKey]*model.ServiceEndpoints
	problems []model.Problem

	mu      sync.Mutex
	ports   map[int32]*port
	closed  bool
	servers sync.WaitGroup
}

// timeouts bound how long a client of a health check node port may hold
// a connection: to send its request (readHeader, read), to take the
// answer (write), and between two requests (idle). A port is open on the
// node's addresses, to load balancers and whoever else reaches them.
type timeouts struct {
	readHeader, read, write, idle time.Duration
}

// serverTimeouts are the ports' (tests shorten them): a load balancer's
// probe is one small request and answer, every few seconds.
var serverTimeouts = timeouts{readHeader: 5 * time.Second, read: 5 * time.Second, write: 10 * time.Second, idle: 30 * time.Second}

// port is one served health check node port: one server, listening on
// each of the addresses chosen for it.
type port struct {
	healthy   func() bool
	server    *http.Server
	listeners map[netip.Addr]net.Listener
	mu        sync.Mutex
	state     answer
}

// answer is what a port answers: the service and its local endpoints.
type answer struct {
	Service        model.ServiceKey
	LocalEndpoints int
}

// body is the JSON body of an answer, in kube-proxy's shape.
type body struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

// New returns a health check server that serves nothing until its first
// Sync. When ctx ends, it stops serving (as Close); it logs through ctx's
// logger (klog.FromContext).
func New(ctx context.Context, cfg Config) (*Sink, error) {
	for _, p := range cfg.NodePortAddresses {
		if !p.IsValid() || p != p.Masked() || p.Addr().Zone() != "" {
			return nil, fmt.Errorf("healthcheck: NodePortAddresses: %s: not a valid network address", p)
		}
	}
	if cfg.Listen == nil {
		cfg.Listen = net.Listen
	}
	if cfg.Addresses == nil {
		cfg.Addresses = interfaceAddresses
	}
	if cfg.Healthy == nil {
		cfg.Healthy = func() bool { return true }
	}
	s := &Sink{cfg: cfg, logger: klog.FromContext(ctx), services: map[model.ServiceKey]*model.ServiceEndpoints{}, ports: map[int32]*port{}}
	context.AfterFunc(ctx, s.Close)
	return s, nil
}

var (
	_ localsink.Sink            = (*Sink)(nil)
	_ localsink.ProblemReporter = (*Sink)(nil)
)

// Problems implements localsink.ProblemReporter: the health check node
// ports out of range, or used by a service before in key order, as of the
// last Sync.
func (s *Sink) Problems() []model.Problem { return s.problems }

// Reset implements localsink.Sink.
func (s *Sink) Reset() { clear(s.services) }

// Update implements localsink.Sink: it keeps the services that ask for a
// health check.
func (s *Sink) Update(key model.ServiceKey, _, cur *model.ServiceEndpoints) {
	if cur == nil || cur.Service.HealthCheckNodePort <= 0 || !cur.Service.ExternalTrafficToLocal {
		delete(s.services, key)
		return
	}
	s.services[key] = cur
}

// Sync implements localsink.Sink: it opens the ports of new health checks,
// closes those of the health checks gone, and updates the answers. Each
// port listens on the node addresses NodePortAddresses selects in the
// families where its service has a cluster IP. A port that cannot be
// opened on an address (taken by another program) is an error: the round
// is delivered again later, and the port tried again; the other ports and
// addresses are served meanwhile.
func (s *Sink) Sync() error {
	want := map[int32]answer{}
	families := map[int32][2]bool{} // IPv4, IPv6
	var problems []model.Problem
	keys := make([]model.ServiceKey, 0, len(s.services))
	for key := range s.services {
		keys = append(keys, key)
	}
	slices.SortFunc(keys, model.ServiceKey.Compare)
	for _, key := range keys {
		se := s.services[key]
		p := se.Service.HealthCheckNodePort
		if p > 65535 {
			problems = append(problems, *model.NewProblem(key, "spec.healthCheckNodePort", model.ReasonBadField,
				"service %s: health check node port %d out of range: not served", key, p))
			continue
		}
		if other, ok := want[p]; ok {
			problems = append(problems, *model.NewProblem(key, "spec.healthCheckNodePort", model.ReasonAddressConflict,
				"service %s: health check node port %d already used by service %s: not served", key, p, other.Service))
			continue
		}
		n := 0
		for _, ep := range se.Endpoints {
			if ep != nil && ep.Local && ep.Ready {
				n++
			}
		}
		ips := se.Service.IPs.ClusterIPs
		if se.Service.IPs.Headless || ips.IsEmpty() {
			problems = append(problems, *model.NewProblem(key, "spec.clusterIPs", model.ReasonBadField,
				"service %s: health check node port %d of a service without a cluster IP: not served", key, p))
			continue
		}
		want[p] = answer{Service: key, LocalEndpoints: n}
		families[p] = [2]bool{len(ips.V4) > 0, len(ips.V6) > 0}
	}
	s.problems = problems

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	var errs []error
	for p, pt := range s.ports {
		if _, ok := want[p]; !ok {
			s.stop(p, pt)
		}
	}
	var addrs []netip.Addr
	known := true
	if len(want) > 0 {
		var err error
		if addrs, err = s.cfg.Addresses(); err != nil {
			// Keep the listeners as they are; try again later.
			errs = append(errs, fmt.Errorf("health check node ports: list the node's addresses: %w", err))
			known = false
		}
	}
	for _, p := range slices.Sorted(maps.Keys(want)) {
		a := want[p]
		pt := s.ports[p]
		if pt == nil {
			pt = &port{healthy: s.cfg.Healthy, listeners: map[netip.Addr]net.Listener{}}
			t := serverTimeouts
			pt.server = &http.Server{Handler: pt, ReadHeaderTimeout: t.readHeader, ReadTimeout: t.read, WriteTimeout: t.write, IdleTimeout: t.idle, MaxHeaderBytes: 16 << 10}
			s.ports[p] = pt
		}
		pt.mu.Lock()
		pt.state = a
		pt.mu.Unlock()
		if !known {
			continue
		}
		on := selectAddresses(s.cfg.NodePortAddresses, addrs, families[p])
		for addr, ln := range pt.listeners {
			if !slices.Contains(on, addr) {
				_ = ln.Close()
				delete(pt.listeners, addr)
				s.logger.V(2).Info("Stopped serving a health check node port on an address", "port", p, "address", addr)
			}
		}
		for _, addr := range on {
			if pt.listeners[addr] != nil {
				continue
			}
			if err := s.listen(p, pt, addr); err != nil {
				errs = append(errs, fmt.Errorf("service %s: %w", a.Service, err))
			}
		}
	}
	return errors.Join(errs...)
}

// listen listens on port p of addr and serves it with pt's server.
func (s *Sink) listen(p int32, pt *port, addr netip.Addr) error {
	network := "tcp6"
	if addr.Is4() {
		network = "tcp4"
	}
	ln, err := s.cfg.Listen(network, netip.AddrPortFrom(addr, uint16(p)).String())
	if err != nil {
		return fmt.Errorf("listen on health check node port %d of %s: %w", p, addr, err)
	}
	pt.listeners[addr] = ln
	s.servers.Add(1)
	go func() {
		defer s.servers.Done()
		// A listener closed alone (its address no longer chosen) ends
		// its Serve with net.ErrClosed.
		if err := pt.server.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
			s.logger.Error(err, "Health check server stopped", "port", p, "address", addr)
		}
	}()
	s.logger.V(2).Info("Serving a health check node port", "port", p, "address", addr)
	return nil
}

// selectAddresses returns the addresses of addrs a port listens on in the
// families fams (IPv4, IPv6): for each family, those inside the prefixes
// of that family, or, without any (or with a /0 one), all of that family
// but loopback; link-local ones never (they need a zone).
func selectAddresses(prefixes []netip.Prefix, addrs []netip.Addr, fams [2]bool) []netip.Addr {
	var out []netip.Addr
	for _, a := range addrs {
		a = a.Unmap()
		if !a.IsValid() || a.IsLinkLocalUnicast() || a.IsMulticast() || a.IsUnspecified() {
			continue
		}
		if (a.Is4() && !fams[0]) || (a.Is6() && !fams[1]) {
			continue
		}
		all, inside := true, false
		for _, p := range prefixes {
			if p.Addr().Is4() != a.Is4() {
				continue
			}
			if p.Bits() == 0 {
				all = true
				break
			}
			all = false
			inside = inside || p.Contains(a)
		}
		if (all && !a.IsLoopback()) || (!all && inside) {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// interfaceAddresses lists the addresses of the interfaces of the current
// network namespace.
func interfaceAddresses() ([]netip.Addr, error) {
	ifAddrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, ia := range ifAddrs {
		if n, ok := ia.(*net.IPNet); ok {
			if a, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, a.Unmap())
			}
		}
	}
	return out, nil
}

// stop stops serving port p.
func (s *Sink) stop(p int32, pt *port) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := pt.server.Shutdown(ctx); err != nil {
		_ = pt.server.Close()
	}
	delete(s.ports, p)
	s.logger.V(2).Info("Stopped serving a health check node port", "port", p)
}

// Ports returns the ports being served (on one address at least), sorted.
func (s *Sink) Ports() []int32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	ports := make([]int32, 0, len(s.ports))
	for p, pt := range s.ports {
		if len(pt.listeners) > 0 {
			ports = append(ports, p)
		}
	}
	slices.Sort(ports)
	return ports
}

// Close stops serving every port and waits for the servers to end.
func (s *Sink) Close() {
	s.mu.Lock()
	s.closed = true
	for p, pt := range s.ports {
		s.stop(p, pt)
	}
	s.mu.Unlock()
	s.servers.Wait()
}

// ServeHTTP answers a health check: 200 with local endpoints while the
// proxier is healthy, 503 otherwise; the header
// X-Load-Balancing-Endpoint-Weight holds the number of local endpoints,
// as kube-proxy's.
func (pt *port) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	pt.mu.Lock()
	a := pt.state
	pt.mu.Unlock()
	var b body
	b.Service.Namespace, b.Service.Name = a.Service.Namespace, a.Service.Name
	b.LocalEndpoints = a.LocalEndpoints
	b.ServiceProxyHealthy = pt.healthy()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(a.LocalEndpoints))
	if a.LocalEndpoints == 0 || !b.ServiceProxyHealthy {
		w.WriteHeader(http.StatusServiceUnavailable)
	} else {
		w.WriteHeader(http.StatusOK)
	}
	_ = json.NewEncoder(w).Encode(b)
}
