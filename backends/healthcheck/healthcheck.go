// Package healthcheck serves the health check node ports of services, as
// kube-proxy does: a LoadBalancer Service with externalTrafficPolicy: Local
// gets a healthCheckNodePort, and the cloud load balancer asks each node,
// over HTTP on that port, whether it has local endpoints for the service
// (200) or not (503), to send traffic only to the nodes that do.
//
// It is a localsink.Sink: put it beside a rule backend with localsink.Tee.
package healthcheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/client/model"
	"sigs.k8s.io/kpng/localsink"
)

// Config configures a health check server.
type Config struct {
	// Listen opens the listener of a port ("tcp", ":32000"); nil means
	// net.Listen, in the current network namespace.
	Listen func(network, address string) (net.Listener, error)
}

// Sink serves the health check node ports of the services it receives.
// Call Close to stop serving.
type Sink struct {
	cfg Config
	// services are the services that ask for a health check, as of the
	// last Update (touched only by the caller's goroutine).
	services map[model.ServiceKey]*model.ServiceEndpoints

	mu      sync.Mutex
	ports   map[int32]*port
	closed  bool
	servers sync.WaitGroup
}

// port is one served health check node port.
type port struct {
	server *http.Server
	mu     sync.Mutex
	state  answer
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
	LocalEndpoints int `json:"localEndpoints"`
}

// New returns a health check server that serves nothing until its first
// Sync.
func New(cfg Config) *Sink {
	if cfg.Listen == nil {
		cfg.Listen = net.Listen
	}
	return &Sink{cfg: cfg, services: map[model.ServiceKey]*model.ServiceEndpoints{}, ports: map[int32]*port{}}
}

var _ localsink.Sink = (*Sink)(nil)

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
// closes those of the health checks gone, and updates the answers. A port
// that cannot be opened (taken by another program) is an error: the round
// is delivered again later, and the port tried again; the other ports are
// served meanwhile.
func (s *Sink) Sync() error {
	want := map[int32]answer{}
	keys := make([]model.ServiceKey, 0, len(s.services))
	for key := range s.services {
		keys = append(keys, key)
	}
	slices.SortFunc(keys, model.ServiceKey.Compare)
	for _, key := range keys {
		se := s.services[key]
		p := se.Service.HealthCheckNodePort
		if p > 65535 {
			klog.InfoS("Health check node port out of range: not served", "service", key, "field", "spec.healthCheckNodePort", "value", p)
			continue
		}
		if other, ok := want[p]; ok {
			klog.InfoS("Health check node port already used by another service: not served", "service", key, "port", p, "usedBy", other.Service)
			continue
		}
		n := 0
		for _, ep := range se.Endpoints {
			if ep != nil && ep.Local && ep.Ready {
				n++
			}
		}
		want[p] = answer{Service: key, LocalEndpoints: n}
	}

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
	for p, a := range want {
		pt := s.ports[p]
		if pt == nil {
			var err error
			if pt, err = s.start(p); err != nil {
				errs = append(errs, fmt.Errorf("service %s: %w", a.Service, err))
				continue
			}
			s.ports[p] = pt
		}
		pt.mu.Lock()
		pt.state = a
		pt.mu.Unlock()
	}
	return errors.Join(errs...)
}

// start listens on port p and serves it.
func (s *Sink) start(p int32) (*port, error) {
	ln, err := s.cfg.Listen("tcp", ":"+strconv.Itoa(int(p)))
	if err != nil {
		return nil, fmt.Errorf("listen on health check node port %d: %w", p, err)
	}
	pt := &port{}
	pt.server = &http.Server{Handler: pt, ReadHeaderTimeout: 5 * time.Second}
	s.servers.Add(1)
	go func() {
		defer s.servers.Done()
		if err := pt.server.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.ErrorS(err, "Health check server stopped", "port", p)
		}
	}()
	klog.V(2).InfoS("Serving a health check node port", "port", p)
	return pt, nil
}

// stop stops serving port p.
func (s *Sink) stop(p int32, pt *port) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := pt.server.Shutdown(ctx); err != nil {
		_ = pt.server.Close()
	}
	delete(s.ports, p)
	klog.V(2).InfoS("Stopped serving a health check node port", "port", p)
}

// Ports returns the ports being served, sorted.
func (s *Sink) Ports() []int32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	ports := make([]int32, 0, len(s.ports))
	for p := range s.ports {
		ports = append(ports, p)
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

// ServeHTTP answers a health check: 200 with local endpoints, 503 without.
func (pt *port) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	pt.mu.Lock()
	a := pt.state
	pt.mu.Unlock()
	var b body
	b.Service.Namespace, b.Service.Name = a.Service.Namespace, a.Service.Name
	b.LocalEndpoints = a.LocalEndpoints
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if a.LocalEndpoints == 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
	} else {
		w.WriteHeader(http.StatusOK)
	}
	_ = json.NewEncoder(w).Encode(b)
}
