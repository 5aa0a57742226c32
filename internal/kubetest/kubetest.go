// Package kubetest builds the Kubernetes objects integration tests create on
// the test control plane: namespaces, Services and the EndpointSlices the
// (absent) EndpointSlice controller would write for them.
package kubetest

import (
	"context"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
)

// ProxyNameLabel is service.kubernetes.io/service-proxy-name.
const ProxyNameLabel = "service.kubernetes.io/service-proxy-name"

var seq atomic.Int64

// UniqueName returns prefix followed by a number unique in this process and
// time, valid as a namespace or label value.
func UniqueName(prefix string) string {
	return fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano()%1e6, seq.Add(1))
}

// Namespace creates a fresh namespace for one test.
func Namespace(t testing.TB, c kubernetes.Interface) string {
	t.Helper()
	name := UniqueName("t")
	_, err := c.CoreV1().Namespaces().Create(context.Background(),
		&v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	return name
}

// Service returns a ClusterIP service with one TCP port 80 → 8080, labelled
// with proxyName when it is not empty; mods adjust it.
func Service(ns, name, proxyName string, mods ...func(*v1.Service)) *v1.Service {
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{}},
		Spec: v1.ServiceSpec{
			Ports: []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}},
		},
	}
	if proxyName != "" {
		svc.Labels[ProxyNameLabel] = proxyName
	}
	for _, m := range mods {
		m(svc)
	}
	return svc
}

// EP describes one endpoint of a slice.
type EP struct {
	IP          string
	Node        string
	Zone        string
	NotReady    bool
	NotServing  bool
	Terminating bool
	ForZones    []string
	ForNodes    []string
}

// Slice returns an EndpointSlice of service svc as the EndpointSlice
// controller would write it: the service's labels copied, the service-name
// label set, address type from the first endpoint, and port "http" 8080.
func Slice(svc *v1.Service, name string, eps ...EP) *discovery.EndpointSlice {
	labels := map[string]string{}
	for k, v := range svc.Labels {
		labels[k] = v
	}
	labels[discovery.LabelServiceName] = svc.Name
	labels[discovery.LabelManagedBy] = "kpng-tests"
	s := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: svc.Namespace, Name: name, Labels: labels},
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: ptr("http"), Protocol: ptr(v1.ProtocolTCP), Port: ptr(int32(8080))}},
	}
	for i, e := range eps {
		if i == 0 {
			if ip, err := netip.ParseAddr(e.IP); err == nil && ip.Is6() {
				s.AddressType = discovery.AddressTypeIPv6
			}
		}
		ep := discovery.Endpoint{
			Addresses: []string{e.IP},
			Conditions: discovery.EndpointConditions{
				Ready:       ptr(!e.NotReady),
				Serving:     ptr(!e.NotServing),
				Terminating: ptr(e.Terminating),
			},
		}
		if e.Node != "" {
			ep.NodeName = ptr(e.Node)
		}
		if e.Zone != "" {
			ep.Zone = ptr(e.Zone)
		}
		if len(e.ForZones)+len(e.ForNodes) > 0 {
			ep.Hints = &discovery.EndpointHints{}
			for _, z := range e.ForZones {
				ep.Hints.ForZones = append(ep.Hints.ForZones, discovery.ForZone{Name: z})
			}
			for _, n := range e.ForNodes {
				ep.Hints.ForNodes = append(ep.Hints.ForNodes, discovery.ForNode{Name: n})
			}
		}
		s.Endpoints = append(s.Endpoints, ep)
	}
	return s
}

func ptr[T any](v T) *T { return &v }

// Client wraps a clientset with create/update/delete calls that fail the
// test on error.
type Client struct {
	T testing.TB
	C kubernetes.Interface
}

var (
	ctx     = context.Background()
	create  = metav1.CreateOptions{}
	update  = metav1.UpdateOptions{}
	deleteO = metav1.DeleteOptions{}
)

// CreateService creates svc and returns the stored object.
func (c Client) CreateService(svc *v1.Service) *v1.Service {
	c.T.Helper()
	out, err := c.C.CoreV1().Services(svc.Namespace).Create(ctx, svc, create)
	if err != nil {
		c.T.Fatalf("create service %s/%s: %v", svc.Namespace, svc.Name, err)
	}
	return out
}

// UpdateService updates svc (which must come from the API server).
func (c Client) UpdateService(svc *v1.Service) *v1.Service {
	c.T.Helper()
	out, err := c.C.CoreV1().Services(svc.Namespace).Update(ctx, svc, update)
	if err != nil {
		c.T.Fatalf("update service %s/%s: %v", svc.Namespace, svc.Name, err)
	}
	return out
}

// DeleteService deletes a service.
func (c Client) DeleteService(ns, name string) {
	c.T.Helper()
	if err := c.C.CoreV1().Services(ns).Delete(ctx, name, deleteO); err != nil {
		c.T.Fatalf("delete service %s/%s: %v", ns, name, err)
	}
}

// CreateSlice creates an EndpointSlice and returns the stored object.
func (c Client) CreateSlice(s *discovery.EndpointSlice) *discovery.EndpointSlice {
	c.T.Helper()
	out, err := c.C.DiscoveryV1().EndpointSlices(s.Namespace).Create(ctx, s, create)
	if err != nil {
		c.T.Fatalf("create endpointslice %s/%s: %v", s.Namespace, s.Name, err)
	}
	return out
}

// UpdateSlice updates an EndpointSlice (which must come from the API server).
func (c Client) UpdateSlice(s *discovery.EndpointSlice) *discovery.EndpointSlice {
	c.T.Helper()
	out, err := c.C.DiscoveryV1().EndpointSlices(s.Namespace).Update(ctx, s, update)
	if err != nil {
		c.T.Fatalf("update endpointslice %s/%s: %v", s.Namespace, s.Name, err)
	}
	return out
}

// DeleteSlice deletes an EndpointSlice.
func (c Client) DeleteSlice(ns, name string) {
	c.T.Helper()
	if err := c.C.DiscoveryV1().EndpointSlices(ns).Delete(ctx, name, deleteO); err != nil {
		c.T.Fatalf("delete endpointslice %s/%s: %v", ns, name, err)
	}
}
