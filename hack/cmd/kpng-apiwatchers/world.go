//go:build linux

package main

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"sigs.k8s.io/kpng/internal/kubetest"
	"sigs.k8s.io/kpng/internal/loadtool"
)

// world is the run's API objects: services s00000… of namespace ns, each
// with one EndpointSlice (s00000-1…) of endpoints endpoints on nodes
// nodes, labelled with proxyName when it is not empty.
type world struct {
	c                          kubernetes.Interface
	ns, proxyName              string
	services, endpoints, nodes int
	// notReady holds, by service, its endpoints made not ready by the
	// changes so far.
	notReady map[int]map[int]bool
}

func svcName(i int) string   { return fmt.Sprintf("s%05d", i) }
func sliceName(i int) string { return svcName(i) + "-1" }

// endpointIP is the address of endpoint e of service i (up to 62,500
// services of up to 254 endpoints).
func endpointIP(i, e int) string { return fmt.Sprintf("10.%d.%d.%d", 1+i/250, i%250, 1+e) }

// service returns service i.
func (w *world) service(i int) *v1.Service { return kubetest.Service(w.ns, svcName(i), w.proxyName) }

// slice returns the EndpointSlice of service i as the changes so far
// left it; its endpoints have a node and a zone, as a cluster's do.
func (w *world) slice(i int) *discovery.EndpointSlice {
	eps := make([]kubetest.EP, w.endpoints)
	for e := range eps {
		n := (i*w.endpoints + e) % w.nodes
		eps[e] = kubetest.EP{IP: endpointIP(i, e), Node: fmt.Sprintf("node-%05d", n), Zone: fmt.Sprintf("zone-%d", n%3), NotReady: w.notReady[i][e]}
	}
	return kubetest.Slice(w.service(i), sliceName(i), eps...)
}

// create creates the namespace, then the services and their slices with
// workers concurrent requests.
func (w *world) create(ctx context.Context, workers int, logf func(string, ...any)) error {
	if err := loadtool.Retry(ctx, func() error {
		_, err := w.c.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: w.ns}}, metav1.CreateOptions{})
		return loadtool.IgnoreExists(err)
	}); err != nil {
		return fmt.Errorf("create namespace %s: %w", w.ns, err)
	}
	return loadtool.CreateAll(ctx, w.services, workers, logf, func(ctx context.Context, i int) error {
		svc := w.service(i)
		if _, err := w.c.CoreV1().Services(w.ns).Create(ctx, svc, metav1.CreateOptions{}); loadtool.IgnoreExists(err) != nil {
			return fmt.Errorf("create service %s/%s: %w", w.ns, svc.Name, err)
		}
		s := w.slice(i)
		if _, err := w.c.DiscoveryV1().EndpointSlices(w.ns).Create(ctx, s, metav1.CreateOptions{}); loadtool.IgnoreExists(err) != nil {
			return fmt.Errorf("create EndpointSlice %s/%s: %w", w.ns, s.Name, err)
		}
		return nil
	})
}

// flip makes change k in w's state: endpoint (k/services) mod endpoints
// of service k mod services goes from ready to not ready or back. It
// returns what the watchers will see and the service to update.
func (w *world) flip(k int) (*target, int) {
	i, e := k%w.services, (k/w.services)%w.endpoints
	if w.notReady[i] == nil {
		w.notReady[i] = map[int]bool{}
	}
	w.notReady[i][e] = !w.notReady[i][e]
	return &target{ns: w.ns, service: svcName(i), slice: sliceName(i), ip: endpointIP(i, e), ready: !w.notReady[i][e]}, i
}

// update writes the slice of service i as w's state has it.
func (w *world) update(ctx context.Context, i int) error {
	s := w.slice(i)
	if _, err := w.c.DiscoveryV1().EndpointSlices(w.ns).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update EndpointSlice %s/%s: %w", w.ns, s.Name, err)
	}
	return nil
}
