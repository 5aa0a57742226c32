//go:build linux

package main

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"sigs.k8s.io/kpng/internal/controlplane"
	"sigs.k8s.io/kpng/internal/kubetest"
)

// kube-proxy's label selectors (cmd/kube-proxy/app/server.go, v1.36):
// Services without a service-proxy-name, EndpointSlices not of headless
// services.
const (
	kubeProxyServices = "!" + kubetest.ProxyNameLabel
	kubeProxySlices   = "!" + v1.IsHeadlessService
)

// rawSelectors returns the raw watchers' selectors: kube-proxy's, its
// Services' clause replaced by service-proxy-name=proxyName when
// proxyName is not empty (the objects a controller of that name gets).
func rawSelectors(proxyName string) (services, slices string) {
	if proxyName == "" {
		return kubeProxyServices, kubeProxySlices
	}
	return kubetest.ProxyNameLabel + "=" + proxyName, kubeProxySlices
}

// rawSet is n raw watchers: each its own client and connection, with an
// informer of Services and one of EndpointSlices, as kube-proxy has.
type rawSet struct {
	*group
	cfg      config
	ws       []*rawWatcher
	cancel   context.CancelFunc
	syncedCh chan struct{}
	// watchErrors counts the watches that ended in an error and were
	// started again (the reflectors' WatchErrorHandler).
	watchErrors atomic.Int64
	logOnce     sync.Once
}

// rawWatcher is one watcher.
type rawWatcher struct {
	seer
	read             atomic.Int64
	objects          atomic.Int64
	mu               sync.Mutex
	conns            []net.Conn
	factories        []informers.SharedInformerFactory
	services, slices cache.SharedIndexInformer
}

// startRaw starts n raw watchers against cp, in cfg.contentType.
func startRaw(ctx context.Context, cfg config, cp *controlplane.ControlPlane, tr *tracker, n int) (watcherSet, error) {
	ctx, cancel := context.WithCancel(ctx)
	set := &rawSet{group: newGroup(), cfg: cfg, cancel: cancel, syncedCh: make(chan struct{})}
	svcSel, sliceSel := rawSelectors(cfg.proxyName)
	for range n {
		rw := &rawWatcher{seer: seer{tr: tr}}
		rc := cp.RESTConfig()
		rc.ContentType = cfg.contentType
		// Its own connection, whose bytes it counts: a transport is shared
		// by configs with the same dialer only.
		rc.Dial = rw.dial
		cs, err := kubernetes.NewForConfig(rc)
		if err != nil {
			set.stop()
			return nil, fmt.Errorf("raw watcher client: %w", err)
		}
		rw.services, err = rw.informer(cs, svcSel, func(f informers.SharedInformerFactory) cache.SharedIndexInformer {
			return f.Core().V1().Services().Informer()
		}, rw.counted(stripService))
		if err == nil {
			rw.slices, err = rw.informer(cs, sliceSel, func(f informers.SharedInformerFactory) cache.SharedIndexInformer {
				return f.Discovery().V1().EndpointSlices().Informer()
			}, rw.counted(stripSlice))
		}
		for _, inf := range []cache.SharedIndexInformer{rw.services, rw.slices} {
			if err == nil {
				err = inf.SetWatchErrorHandlerWithContext(set.onWatchError)
			}
		}
		if err == nil {
			_, err = rw.slices.AddEventHandler(cache.ResourceEventHandlerFuncs{
				AddFunc:    func(obj any) { rw.onSlice(obj) },
				UpdateFunc: func(_, obj any) { rw.onSlice(obj) },
			})
		}
		if err != nil {
			set.stop()
			return nil, fmt.Errorf("raw watcher informers: %w", err)
		}
		set.ws = append(set.ws, rw)
	}
	// The watchers start in waves of cfg.wave, each once the one before
	// holds the state (all at once with no wave).
	wave := cfg.wave
	if wave < 1 {
		wave = n
	}
	go func() {
		for first := 0; first < n; first += wave {
			ws := set.ws[first:min(first+wave, n)]
			for _, rw := range ws {
				for _, f := range rw.factories {
					f.Start(ctx.Done())
				}
			}
			for _, rw := range ws {
				if !cache.WaitForCacheSync(ctx.Done(), rw.services.HasSynced, rw.slices.HasSynced) {
					return
				}
			}
		}
		close(set.syncedCh)
	}()
	return set, nil
}

// onWatchError counts a watch that ended in an error (it is started
// again), and logs the first.
func (s *rawSet) onWatchError(ctx context.Context, r *cache.Reflector, err error) {
	s.watchErrors.Add(1)
	s.logOnce.Do(func() {
		s.cfg.logf("a raw watcher's watch ended (the count is in the results; this is the first): %v", err)
	})
}

// restarts is how many watches ended in an error and were started again.
func (s *rawSet) restarts() int64 { return s.watchErrors.Load() }

// informer makes the informer get returns of a factory of its own,
// filtered by selector, stripped by transform.
func (rw *rawWatcher) informer(cs kubernetes.Interface, selector string, get func(informers.SharedInformerFactory) cache.SharedIndexInformer, transform cache.TransformFunc) (cache.SharedIndexInformer, error) {
	f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }))
	rw.factories = append(rw.factories, f)
	inf := get(f)
	if err := inf.SetTransform(transform); err != nil {
		return nil, err
	}
	return inf, nil
}

// dial opens a TCP connection whose reads are counted.
func (rw *rawWatcher) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	rw.mu.Lock()
	rw.conns = append(rw.conns, c)
	rw.mu.Unlock()
	return &countingConn{Conn: c, n: &rw.read}, nil
}

// onSlice counts the change in progress when the slice holds it.
func (rw *rawWatcher) onSlice(obj any) {
	s, ok := obj.(*discovery.EndpointSlice)
	t := rw.tr.current.Load()
	if !ok || t == nil || s.Namespace != t.ns || s.Name != t.slice {
		return
	}
	for _, ep := range s.Endpoints {
		if len(ep.Addresses) > 0 && ep.Addresses[0] == t.ip && (ep.Conditions.Ready == nil || *ep.Conditions.Ready) == t.ready {
			rw.holds(t)
		}
	}
}

// counted counts the objects the watcher receives (listed, or in watch
// events), then strips them.
func (rw *rawWatcher) counted(strip cache.TransformFunc) cache.TransformFunc {
	return func(obj any) (any, error) {
		rw.objects.Add(1)
		return strip(obj)
	}
}

// stripService keeps a Service's name only: the watcher counts them.
func stripService(obj any) (any, error) {
	if s, ok := obj.(*v1.Service); ok {
		return &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: s.Name, ResourceVersion: s.ResourceVersion}}, nil
	}
	return obj, nil
}

// stripSlice keeps a slice's name and its endpoints' addresses and
// readiness: what the watcher checks.
func stripSlice(obj any) (any, error) {
	s, ok := obj.(*discovery.EndpointSlice)
	if !ok {
		return obj, nil
	}
	out := &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: s.Name, ResourceVersion: s.ResourceVersion}}
	for _, ep := range s.Endpoints {
		out.Endpoints = append(out.Endpoints, discovery.Endpoint{Addresses: ep.Addresses, Conditions: discovery.EndpointConditions{Ready: ep.Conditions.Ready}})
	}
	return out, nil
}

func (s *rawSet) synced() <-chan struct{} { return s.syncedCh }

func (s *rawSet) bytes() int64 {
	var n int64
	for _, rw := range s.ws {
		n += rw.read.Load()
	}
	return n
}

func (s *rawSet) clientCPU() float64 { return 0 }

// objects is how many objects the watchers received, together.
func (s *rawSet) objects() int64 {
	var n int64
	for _, rw := range s.ws {
		n += rw.objects.Load()
	}
	return n
}

// check counts the services and slices of the run's namespace each
// watcher holds.
func (s *rawSet) check() []string {
	var problems []string
	for k, rw := range s.ws {
		svcs, slices := inNamespace(rw.services, s.cfg.namespace), inNamespace(rw.slices, s.cfg.namespace)
		if svcs != s.cfg.services || slices != s.cfg.services {
			problems = append(problems, fmt.Sprintf("raw watcher %d holds %d services and %d slices, want %d of each", k, svcs, slices, s.cfg.services))
		}
	}
	return problems
}

// inNamespace counts the objects of ns an informer holds.
func inNamespace(inf cache.SharedIndexInformer, ns string) int {
	objs, err := inf.GetIndexer().ByIndex(cache.NamespaceIndex, ns)
	if err != nil {
		return -1
	}
	return len(objs)
}

// stop stops the informers and closes the watchers' connections.
func (s *rawSet) stop() {
	s.cancel()
	for _, rw := range s.ws {
		for _, f := range rw.factories {
			f.Shutdown()
		}
		rw.mu.Lock()
		for _, c := range rw.conns {
			_ = c.Close()
		}
		rw.mu.Unlock()
	}
}

// countingConn adds the bytes read from a connection to n.
type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	k, err := c.Conn.Read(p)
	c.n.Add(int64(k))
	return k, err
}
