//go:build linux

package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"sigs.k8s.io/kpng/internal/kubetest"
	"sigs.k8s.io/kpng/internal/loadtool"
)

// world is the run's API objects: services s00000… of namespace ns, each
// with one EndpointSlice of endpoints endpoints spread over nodes nodes
// (endpoint e of service i is on node (i*endpoints+e) mod nodes).
type world struct {
	c                          kubernetes.Interface
	ns                         string
	services, endpoints, nodes int
	logf                       func(format string, args ...any)
}

// svcName is the name of service i.
func svcName(i int) string { return fmt.Sprintf("s%05d", i) }

// nodeName is the name of node n.
func nodeName(n int) string { return fmt.Sprintf("node-%05d", n) }

// endpointIP is the address of endpoint e of service i (up to 62,500
// services of up to 254 endpoints).
func endpointIP(i, e int) string {
	return fmt.Sprintf("10.%d.%d.%d", 1+i/250, i%250, 1+e)
}

// node returns the node index of endpoint e of service i.
func (w *world) node(i, e int) int { return (i*w.endpoints + e) % w.nodes }

// localEndpoints returns how many endpoints node n holds.
func (w *world) localEndpoints(n int) int {
	total := w.services * w.endpoints
	k := total / w.nodes
	if n < total%w.nodes {
		k++
	}
	return k
}

// slice returns the EndpointSlice of service i, endpoint notReady (-1:
// none) not ready, stamped with the trigger time now.
func (w *world) slice(svc *v1.Service, i, notReady int, now time.Time) *discovery.EndpointSlice {
	eps := make([]kubetest.EP, w.endpoints)
	for e := range eps {
		eps[e] = kubetest.EP{IP: endpointIP(i, e), Node: nodeName(w.node(i, e)), NotReady: e == notReady}
	}
	s := kubetest.Slice(svc, svcName(i)+"-1", eps...)
	s.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: now.UTC().Format(time.RFC3339Nano)}
	return s
}

// create creates the namespace, then the services and their slices with
// workers concurrent requests.
func (w *world) create(ctx context.Context, workers int) error {
	if err := loadtool.Retry(ctx, func() error {
		_, err := w.c.CoreV1().Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: w.ns}}, metav1.CreateOptions{})
		return loadtool.IgnoreExists(err)
	}); err != nil {
		return fmt.Errorf("create namespace %s: %w", w.ns, err)
	}
	return loadtool.CreateAll(ctx, w.services, workers, w.logf, func(ctx context.Context, i int) error {
		svc := kubetest.Service(w.ns, svcName(i), "")
		if _, err := w.c.CoreV1().Services(w.ns).Create(ctx, svc, metav1.CreateOptions{}); loadtool.IgnoreExists(err) != nil {
			return fmt.Errorf("create service %s/%s: %w", w.ns, svc.Name, err)
		}
		s := w.slice(svc, i, -1, time.Now())
		if _, err := w.c.DiscoveryV1().EndpointSlices(w.ns).Create(ctx, s, metav1.CreateOptions{}); loadtool.IgnoreExists(err) != nil {
			return fmt.Errorf("create EndpointSlice %s/%s: %w", w.ns, s.Name, err)
		}
		return nil
	})
}

// makeNotReady updates the slice of service i with endpoint e not ready;
// it returns the slice's name and resource version after the update.
func (w *world) makeNotReady(ctx context.Context, i, e int) (name, version string, err error) {
	svc := kubetest.Service(w.ns, svcName(i), "")
	s := w.slice(svc, i, e, time.Now())
	got, err := w.c.DiscoveryV1().EndpointSlices(w.ns).Update(ctx, s, metav1.UpdateOptions{})
	if err != nil {
		return "", "", fmt.Errorf("update EndpointSlice %s/%s: %w", w.ns, s.Name, err)
	}
	return got.Name, got.ResourceVersion, nil
}

// sliceEvent is an EndpointSlice event as a watcher of the API server
// received it.
type sliceEvent struct {
	name, version string
	at            time.Time
}

// watchSlices watches the EndpointSlices of the namespace from now on and
// sends each event received on the channel: when a watcher of the API
// server sees a change, which is when the controller, watching the same
// API server, sees it too (within the API server's fan-out to its two
// watches). A watch the API server ends is watched again from its last
// event; the channel is closed when ctx ends, when the watch sends an
// error (logged) or when watching again fails.
func (w *world) watchSlices(ctx context.Context) (<-chan sliceEvent, error) {
	list, err := w.c.DiscoveryV1().EndpointSlices(w.ns).List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return nil, fmt.Errorf("list EndpointSlices of %s: %w", w.ns, err)
	}
	wi, err := w.c.DiscoveryV1().EndpointSlices(w.ns).Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		return nil, fmt.Errorf("watch EndpointSlices of %s: %w", w.ns, err)
	}
	out := make(chan sliceEvent, 64)
	go func() {
		defer close(out)
		defer func() { wi.Stop() }() // the last one watched
		rv := list.ResourceVersion
		for {
			got := false
			for ev := range wi.ResultChan() {
				at := time.Now()
				if ev.Type == watch.Error {
					if ctx.Err() == nil {
						w.logf("the watch of EndpointSlices failed: %v", apierrors.FromObject(ev.Object))
					}
					return
				}
				s, ok := ev.Object.(*discovery.EndpointSlice)
				if !ok {
					continue
				}
				got, rv = true, s.ResourceVersion
				select {
				case out <- sliceEvent{name: s.Name, version: s.ResourceVersion, at: at}:
				case <-ctx.Done():
					return
				}
			}
			wi.Stop()
			if !got { // not in a loop as fast as the API server answers
				select {
				case <-time.After(time.Second):
				case <-ctx.Done():
				}
			}
			if ctx.Err() != nil {
				return
			}
			next, err := w.c.DiscoveryV1().EndpointSlices(w.ns).Watch(ctx, metav1.ListOptions{ResourceVersion: rv})
			if err != nil {
				w.logf("watching EndpointSlices again from version %s: %v", rv, err)
				return
			}
			wi = next
		}
	}()
	return out, nil
}

// The controller's own Service, whose ready endpoints are its replicas
// (to-api --peers-service), named as deploy/kpng-controller.yaml names it
// and headless, as there. There the controller serves the Services of its
// --service-proxy-name, which its own Service is not; here it serves the
// Services without one, so the replicas' Service is given another
// (peersProxyName), and the controller's watch of the state leaves it
// out, as there.
const (
	peersNamespace = "kube-system"
	peersService   = "kpng-controller"
	peersProxyName = "not-this-controller"
	// replicas is how many replicas its EndpointSlice lists.
	replicas = 3
)

// replicaIP is the address of replica r. Only listed: the backends read
// the list and dial nothing (the API server refuses loopback addresses
// in an EndpointSlice).
func replicaIP(r int) string { return fmt.Sprintf("10.254.0.%d", 1+r) }

// readyReplicas is the list every backend must be sent when replica
// notReady (-1: none) is not ready, as kpngv1.PeerIPs orders it.
func readyReplicas(notReady int) string {
	ips := make([]string, 0, replicas)
	for r := range replicas {
		if r != notReady {
			ips = append(ips, replicaIP(r))
		}
	}
	return strings.Join(ips, ",")
}

// replicasService is the controller's own Service.
func replicasService() *v1.Service {
	return kubetest.Service(peersNamespace, peersService, peersProxyName, func(s *v1.Service) { s.Spec.ClusterIP = v1.ClusterIPNone })
}

// createReplicas creates the controller's Service, unless it exists, and
// writes its EndpointSlice with every replica ready.
func (w *world) createReplicas(ctx context.Context) error {
	if _, err := w.c.CoreV1().Services(peersNamespace).Create(ctx, replicasService(), metav1.CreateOptions{}); loadtool.IgnoreExists(err) != nil {
		return fmt.Errorf("create service %s/%s: %w", peersNamespace, peersService, err)
	}
	return w.setReplicas(ctx, -1)
}

// setReplicas writes the EndpointSlice of the controller's Service (made
// by createReplicas), created or updated, with replica notReady (-1:
// none) not ready.
func (w *world) setReplicas(ctx context.Context, notReady int) error {
	svc := replicasService()
	eps := make([]kubetest.EP, replicas)
	for r := range eps {
		eps[r] = kubetest.EP{IP: replicaIP(r), Node: "scale-controller", NotReady: r == notReady}
	}
	s := kubetest.Slice(svc, peersService+"-1", eps...)
	slices := w.c.DiscoveryV1().EndpointSlices(peersNamespace)
	_, err := slices.Update(ctx, s, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		_, err = slices.Create(ctx, s, metav1.CreateOptions{})
	}
	if err != nil {
		return fmt.Errorf("write EndpointSlice %s/%s: %w", peersNamespace, s.Name, err)
	}
	return nil
}
