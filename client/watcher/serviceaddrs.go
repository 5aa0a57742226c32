package watcher

import (
	"context"
	"fmt"
	"slices"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// WatchReadyAddresses calls set with the addresses of the ready endpoints of
// the Service namespace/name (from its EndpointSlices: an endpoint whose
// ready condition is not false), sorted and without duplicates, when they
// are first known and whenever they change, until ctx ends. A controller
// watches its own Service so to tell its backends where its replicas are
// (api/server.Peers).
func WatchReadyAddresses(ctx context.Context, client kubernetes.Interface, namespace, name string, set func(addrs []string)) error {
	if namespace == "" || name == "" {
		return fmt.Errorf("watch the ready addresses of service %q/%q: a namespace and a name are needed", namespace, name)
	}
	selector := labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: name}).String()
	infs := &informers{client: client}
	inf := infs.endpointSlicesIn(namespace, func(o *metav1.ListOptions) { o.LabelSelector = selector }, nil)
	bySlice := map[string][]string{} // only touched by the informer's handler goroutine
	var last []string
	known := false
	update := func(obj any, deleted bool) {
		es, ok := obj.(*discoveryv1.EndpointSlice)
		if !ok {
			return
		}
		if deleted {
			delete(bySlice, es.Name)
		} else {
			bySlice[es.Name] = readyAddresses(es)
		}
		var all []string
		for _, addrs := range bySlice {
			all = append(all, addrs...)
		}
		slices.Sort(all)
		all = slices.Compact(all)
		if known && slices.Equal(all, last) {
			return
		}
		last, known = all, true
		klog.V(2).InfoS("Ready addresses of a service", "service", namespace+"/"+name, "addresses", all)
		set(all)
	}
	if _, err := inf.AddEventHandler(handlers(update)); err != nil {
		return fmt.Errorf("watch the EndpointSlices of service %s/%s: %w", namespace, name, err)
	}
	infs.start(ctx)
	<-ctx.Done()
	infs.wait()
	return nil
}

// readyAddresses returns the addresses of a slice's endpoints whose ready
// condition is not false (unset means ready, as the API says).
func readyAddresses(es *discoveryv1.EndpointSlice) []string {
	var out []string
	for _, ep := range es.Endpoints {
		if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
			continue
		}
		out = append(out, ep.Addresses...)
	}
	return out
}
