package watcher

import (
	"context"
	"fmt"
	"slices"
	"sync"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// WatchReadyAddresses calls set with the IP addresses of the ready endpoints
// of the Service namespace/name (from its IPv4 and IPv6 EndpointSlices: an
// endpoint whose ready condition is not false), sorted and without
// duplicates, once the first list of its slices is in (even if it has
// none) and whenever they change, until ctx ends. A controller watches its
// own Service so to tell its backends where its replicas are
// (api/server.Peers).
func WatchReadyAddresses(ctx context.Context, client kubernetes.Interface, namespace, name string, set func(addrs []string)) error {
	if namespace == "" || name == "" {
		return fmt.Errorf("watch the ready addresses of service %q/%q: a namespace and a name are needed", namespace, name)
	}
	selector := labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: name}).String()
	infs := &informers{client: client}
	inf := infs.endpointSlicesIn(namespace, func(o *metav1.ListOptions) { o.LabelSelector = selector }, nil)
	var (
		mu      sync.Mutex
		bySlice = map[string][]string{}
		last    []string
		known   bool
		synced  bool // the first list is in: partial lists are not told
	)
	// tell calls set with the addresses when they changed; mu is held.
	tell := func() {
		if !synced {
			return
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
	update := func(obj any, deleted bool) {
		es, ok := obj.(*discoveryv1.EndpointSlice)
		if !ok {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if deleted {
			delete(bySlice, es.Name)
		} else {
			bySlice[es.Name] = readyAddresses(es)
		}
		tell()
	}
	reg, err := inf.AddEventHandler(handlers(update))
	if err != nil {
		return fmt.Errorf("watch the EndpointSlices of service %s/%s: %w", namespace, name, err)
	}
	infs.start(ctx)
	// The handler has had every slice of the first list.
	if cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		mu.Lock()
		synced = true
		tell()
		mu.Unlock()
	}
	<-ctx.Done()
	infs.wait()
	return nil
}

// readyAddresses returns the addresses of a slice's endpoints whose ready
// condition is not false (unset means ready, as the API says); none for a
// slice of FQDNs.
func readyAddresses(es *discoveryv1.EndpointSlice) []string {
	if es.AddressType != discoveryv1.AddressTypeIPv4 && es.AddressType != discoveryv1.AddressTypeIPv6 {
		return nil
	}
	var out []string
	for _, ep := range es.Endpoints {
		if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
			continue
		}
		out = append(out, ep.Addresses...)
	}
	return out
}
