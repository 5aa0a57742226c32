package watcher

import (
	"context"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coreinformers "k8s.io/client-go/informers/core/v1"
	discoveryinformers "k8s.io/client-go/informers/discovery/v1"
	"k8s.io/client-go/informers/internalinterfaces"
	networkinginformers "k8s.io/client-go/informers/networking/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// informers runs the few informers a watcher needs. It takes the place of
// client-go's SharedInformerFactory, whose methods (kept whole by the linker,
// as the factory is used through an interface) reach the informers and
// listers of every API group: about 1.5 MB in every program that links
// the watcher (docs/operating.md, "Image").
type informers struct {
	client kubernetes.Interface
	list   []cache.SharedIndexInformer
	wg     sync.WaitGroup
}

// options are the options of one informer: the list and watch requests'
// selectors, and no resync.
func options(tweak func(*metav1.ListOptions)) internalinterfaces.InformerOptions {
	return internalinterfaces.InformerOptions{TweakListOptions: tweak}
}

// services returns an informer of the services of every namespace.
func (s *informers) services(tweak func(*metav1.ListOptions), transform cache.TransformFunc) cache.SharedIndexInformer {
	return s.add(coreinformers.NewServiceInformerWithOptions(s.client, metav1.NamespaceAll, options(tweak)), transform)
}

// endpointSlices returns an informer of the EndpointSlices of every
// namespace.
func (s *informers) endpointSlices(tweak func(*metav1.ListOptions), transform cache.TransformFunc) cache.SharedIndexInformer {
	return s.endpointSlicesIn(metav1.NamespaceAll, tweak, transform)
}

// endpointSlicesIn returns an informer of the EndpointSlices of one
// namespace.
func (s *informers) endpointSlicesIn(namespace string, tweak func(*metav1.ListOptions), transform cache.TransformFunc) cache.SharedIndexInformer {
	return s.add(discoveryinformers.NewEndpointSliceInformerWithOptions(s.client, namespace, options(tweak)), transform)
}

// nodes returns an informer of nodes.
func (s *informers) nodes(tweak func(*metav1.ListOptions), transform cache.TransformFunc) cache.SharedIndexInformer {
	return s.add(coreinformers.NewNodeInformerWithOptions(s.client, options(tweak)), transform)
}

// serviceCIDRs returns an informer of the ServiceCIDR objects.
func (s *informers) serviceCIDRs(transform cache.TransformFunc) cache.SharedIndexInformer {
	return s.add(networkinginformers.NewServiceCIDRInformerWithOptions(s.client, options(nil)), transform)
}

// add keeps inf, with transform (nil: none), to be started.
func (s *informers) add(inf cache.SharedIndexInformer, transform cache.TransformFunc) cache.SharedIndexInformer {
	if transform != nil {
		_ = inf.SetTransform(transform) // fails only once started
	}
	s.list = append(s.list, inf)
	return inf
}

// start runs every informer until ctx ends; wait waits for them to stop.
func (s *informers) start(ctx context.Context) {
	for _, inf := range s.list {
		s.wg.Go(func() { inf.RunWithContext(ctx) })
	}
}

// wait returns when every informer started has stopped.
func (s *informers) wait() { s.wg.Wait() }
