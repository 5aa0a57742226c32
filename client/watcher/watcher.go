// Package watcher is kpng's in-process Kubernetes watcher: it follows the
// Services, EndpointSlices and Node a proxier needs, selected by
// service-proxy-name, and feeds a localsink.Sink with consistent changes.
//
// Selection: with a ServiceProxyName, only Services labelled
// service.kubernetes.io/service-proxy-name=<name>; without one, only Services
// without that label (what kube-proxy handles). Both Services and
// EndpointSlices are filtered on the API server with the same label selector,
// which relies on the EndpointSlice controller (and the mirroring controller)
// copying a Service's labels onto the slices it manages; EndpointSlices
// labelled service.kubernetes.io/headless are left out for Services with a
// cluster IP, as kube-proxy leaves them out (HeadlessLabel). EndpointSlices
// written by other controllers must carry the label themselves; the watcher
// deliberately does not watch every slice in the cluster to find unlabelled
// ones, because a specialized proxier handling ten services would then hold
// every endpoint of the cluster in memory. kube-proxy relies on the same
// contract.
//
// Without a ServiceProxyName the watcher is the cluster's default
// proxier's, kube-proxy's role: it also watches the ServiceCIDR objects
// (networking.k8s.io/v1) and gives their ranges to the sink as
// cluster-level facts (model.Cluster, localsink.ClusterSink), for the
// proxier to drop the traffic to the addresses no service holds. Where
// the API server does not serve ServiceCIDRs, or the proxier may not list
// them, it says so once and gives none.
package watcher

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	networking "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

// ServiceProxyNameLabel is the label that hands a Service to a specialized
// proxier instead of kube-proxy.
const ServiceProxyNameLabel = "service.kubernetes.io/service-proxy-name"

// HeadlessLabel marks the EndpointSlices of headless Services (the
// EndpointSlice controller sets it on theirs). kube-proxy leaves out every
// slice that carries it, whatever its value; the watcher leaves out those
// of Services that have a cluster IP, and keeps them for headless Services,
// whose endpoints specialized proxiers program (the all-IP proxier).
const HeadlessLabel = "service.kubernetes.io/headless"

// DefaultMinSyncInterval is the default minimum time between two deliveries.
const DefaultMinSyncInterval = 20 * time.Millisecond

// zoneLabel is the well-known node label holding the node's zone.
const zoneLabel = "topology.kubernetes.io/zone"

// Config configures a Watcher.
type Config struct {
	// Client talks to the API server.
	Client kubernetes.Interface
	// ServiceProxyName selects the Services labelled with it; empty selects
	// the Services without a service-proxy-name label.
	ServiceProxyName string
	// NodeName is the node the proxier runs on: endpoints on it are Local,
	// and its zone label drives topology hints. Empty means no endpoint is
	// local and hints never match.
	NodeName string
	// MinSyncInterval is the minimum time between two deliveries: the first
	// change after a quiet period is delivered at once, later ones are
	// coalesced until the interval has passed. Zero means
	// DefaultMinSyncInterval.
	MinSyncInterval time.Duration
	// Observe, if set, receives the record of each round delivered to the
	// sink, and Queued the time each round with changes was queued (see
	// localsink.FeederOptions).
	Observe func(localsink.Round)
	Queued  func(time.Time)
	// NodeEligible, if set (and NodeName is), is told whether the node is
	// eligible to receive load-balancer traffic, as kube-proxy's /healthz
	// requires (KEP-3836): the Node exists, is not being deleted and has
	// no ToBeDeletedByClusterAutoscaler taint. It is called once the
	// informers have synced, then on each change, from the informers'
	// goroutines, one call at a time.
	NodeEligible func(eligible bool)
}

// ToBeDeletedTaint is the taint the cluster autoscaler puts on a node it
// is about to delete: a node with it is not eligible (Config.NodeEligible).
const ToBeDeletedTaint = "ToBeDeletedByClusterAutoscaler"

// Watcher follows the API server and feeds a Sink. Create it with New.
type Watcher struct {
	cfg      Config
	selector string

	mu       sync.Mutex
	node     model.Node
	services map[model.ServiceKey]*v1.Service
	slices   map[model.ServiceKey]map[string]*discovery.EndpointSlice
	owners   map[string]model.ServiceKey // slice namespace/name → service
	dirty    map[model.ServiceKey]struct{}
	notify   chan struct{}
	// serviceCIDRs are the spec.cidrs of each ServiceCIDR object, by
	// name (default proxier only); clusterDirty says they changed since
	// the last round.
	serviceCIDRs map[string][]string
	clusterDirty bool
	// start is when Run started: trigger times before it are not
	// measured (they would count the watcher's own start). triggers are
	// the trigger times of the slices changed since the last round, by
	// service; events the Service and EndpointSlice events received
	// since, the first at firstEvent.
	start      time.Time
	triggers   map[model.ServiceKey][]time.Time
	events     int
	firstEvent time.Time
	// eligible is the node's eligibility as last reported (nil: not yet).
	eligible *bool
}

// New checks cfg and returns a Watcher.
func New(cfg Config) (*Watcher, error) {
	if cfg.Client == nil {
		return nil, errors.New("watcher config: Client is nil")
	}
	selector := "!" + ServiceProxyNameLabel
	if cfg.ServiceProxyName != "" {
		if errs := validation.IsValidLabelValue(cfg.ServiceProxyName); len(errs) > 0 {
			return nil, fmt.Errorf("invalid service-proxy-name %q: %s", cfg.ServiceProxyName, errs[0])
		}
		selector = ServiceProxyNameLabel + "=" + cfg.ServiceProxyName
	}
	if cfg.MinSyncInterval <= 0 {
		cfg.MinSyncInterval = DefaultMinSyncInterval
	}
	return &Watcher{
		cfg:      cfg,
		selector: selector,
		node:     model.Node{Name: cfg.NodeName},
		services: map[model.ServiceKey]*v1.Service{},
		slices:   map[model.ServiceKey]map[string]*discovery.EndpointSlice{},
		owners:   map[string]model.ServiceKey{},
		dirty:    map[model.ServiceKey]struct{}{},
		notify:   make(chan struct{}, 1),
		triggers: map[model.ServiceKey][]time.Time{},

		serviceCIDRs: map[string][]string{},
	}, nil
}

// Selector returns the label selector used for Services and EndpointSlices.
func (w *Watcher) Selector() string { return w.selector }

// Run watches until ctx is done, feeding sink through a localsink.Feeder.
// Nothing reaches sink before every informer has synced; the first round is
// Reset, the whole state, then Sync. A round the sink fails to apply is
// synced again (with the next round, or after a backoff). Run returns nil
// when ctx is cancelled, and only returns after all its goroutines have
// stopped (a retry in progress included). A Watcher runs once.
func (w *Watcher) Run(ctx context.Context, sink localsink.Sink) error {
	if !w.waitForAPI(ctx) {
		return nil // ctx ended
	}
	watchCIDRs := w.cfg.ServiceProxyName == "" && w.serviceCIDRsServed(ctx)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w.mu.Lock()
	w.start = time.Now()
	w.mu.Unlock()

	// What the watcher does not read is dropped from the caches (compact).
	strip := (&compactor{}).compact
	byLabel := func(o *metav1.ListOptions) { o.LabelSelector = w.selector }
	infs := &informers{client: w.cfg.Client}
	svcInformer := infs.services(byLabel, strip)
	sliceInformer := infs.endpointSlices(byLabel, strip)
	// The first state must hold everything the initial lists returned, so
	// wait until each handler (not just each informer's store) has seen
	// it: the registrations' HasSynced say so.
	var synced []cache.InformerSynced
	reg, err := svcInformer.AddEventHandler(handlers(w.onService))
	if err != nil {
		return fmt.Errorf("watch services: %w", err)
	}
	synced = append(synced, reg.HasSynced)
	reg, err = sliceInformer.AddEventHandler(handlers(w.onSlice))
	if err != nil {
		return fmt.Errorf("watch endpointslices: %w", err)
	}
	synced = append(synced, reg.HasSynced)
	if watchCIDRs {
		reg, err := infs.serviceCIDRs(strip).AddEventHandler(handlers(w.onServiceCIDR))
		if err != nil {
			return fmt.Errorf("watch servicecidrs: %w", err)
		}
		synced = append(synced, reg.HasSynced)
	}
	if w.cfg.NodeName != "" {
		nodeInformer := infs.nodes(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", w.cfg.NodeName).String()
		}, strip)
		reg, err := nodeInformer.AddEventHandler(handlers(w.onNode))
		if err != nil {
			return fmt.Errorf("watch node %s: %w", w.cfg.NodeName, err)
		}
		synced = append(synced, reg.HasSynced)
	}
	infs.start(ctx)
	defer func() {
		cancel()
		infs.wait()
	}()

	klog.InfoS("Waiting for informers to sync", "selector", w.selector, "node", w.cfg.NodeName)
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return nil // ctx cancelled
	}
	klog.InfoS("Informers synced", "selector", w.selector)
	if w.cfg.NodeName != "" {
		// A node the informer did not list does not exist.
		w.mu.Lock()
		if w.eligible == nil {
			w.setEligible(false, "the Node does not exist")
		}
		w.mu.Unlock()
	}

	feeder := localsink.NewFeeder(sink, localsink.FeederOptions{Observe: w.cfg.Observe, Queued: w.cfg.Queued})
	defer feeder.Close()
	w.deliver(feeder)
	last := time.Now()
	timer := time.NewTimer(0)
	<-timer.C
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-w.notify:
		}
		if wait := time.Until(last.Add(w.cfg.MinSyncInterval)); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				timer.Stop()
				return nil
			case <-timer.C:
			}
		}
		last = time.Now()
		w.deliver(feeder)
	}
}

// waitForAPI checks that the API server answers and lets us list services,
// retrying with backoff and saying clearly what is wrong. It returns false
// when ctx ends first.
func (w *Watcher) waitForAPI(ctx context.Context) bool {
	backoff := wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 1 << 30, Cap: 30 * time.Second}
	for {
		_, err := w.cfg.Client.CoreV1().Services("").List(ctx, metav1.ListOptions{LabelSelector: w.selector, Limit: 1})
		if err == nil {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		delay := backoff.Step()
		klog.ErrorS(err, "Cannot list services from the Kubernetes API server, retrying", "retryIn", delay.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return false
		case <-time.After(delay):
		}
	}
}

// serviceCIDRsServed reports whether the ServiceCIDRs can be watched: a
// server that does not serve them (before Kubernetes 1.33) or a proxier
// that may not list them gives no service CIDRs, and nothing is dropped
// (logged once). It returns false when ctx ends; other errors are
// retried as waitForAPI does.
func (w *Watcher) serviceCIDRsServed(ctx context.Context) bool {
	backoff := wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 1 << 30, Cap: 30 * time.Second}
	for {
		_, err := w.cfg.Client.NetworkingV1().ServiceCIDRs().List(ctx, metav1.ListOptions{Limit: 1})
		switch {
		case err == nil:
			return true
		case apierrors.IsNotFound(err):
			klog.InfoS("The API server does not serve ServiceCIDRs (networking.k8s.io/v1): no service CIDRs, the addresses no service holds are not dropped")
			return false
		case apierrors.IsForbidden(err):
			klog.ErrorS(err, "Cannot list ServiceCIDRs (the default proxier needs list and watch on servicecidrs.networking.k8s.io): no service CIDRs, the addresses no service holds are not dropped")
			return false
		case ctx.Err() != nil:
			return false
		}
		delay := backoff.Step()
		klog.ErrorS(err, "Cannot list ServiceCIDRs from the Kubernetes API server, retrying", "retryIn", delay.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return false
		case <-time.After(delay):
		}
	}
}

func (w *Watcher) signal() {
	select {
	case w.notify <- struct{}{}:
	default:
	}
}

// handlers returns informer handlers calling on with each object added or
// updated (deleted false) or deleted (deleted true, the object unwrapped
// from a DeletedFinalStateUnknown when the informer missed the deletion).
func handlers(on func(obj any, deleted bool)) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { on(obj, false) },
		UpdateFunc: func(_, obj any) { on(obj, false) },
		DeleteFunc: func(obj any) { on(unwrapDeleted(obj), true) },
	}
}

func unwrapDeleted(obj any) any {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return d.Obj
	}
	return obj
}

func (w *Watcher) onService(obj any, deleted bool) {
	svc, ok := obj.(*v1.Service)
	if !ok {
		return
	}
	key := model.ServiceKey{Namespace: svc.Namespace, Name: svc.Name}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.countEvent()
	if deleted {
		delete(w.services, key)
	} else {
		w.services[key] = svc
	}
	w.dirty[key] = struct{}{}
	w.signal()
}

func (w *Watcher) onSlice(obj any, deleted bool) {
	s, ok := obj.(*discovery.EndpointSlice)
	if !ok {
		return
	}
	id := s.Namespace + "/" + s.Name
	svcName := s.Labels[discovery.LabelServiceName]
	w.mu.Lock()
	defer w.mu.Unlock()
	w.countEvent()
	// A slice may move to another service (its service-name label
	// changed): take it out of its previous owner first.
	if old, had := w.owners[id]; had && (deleted || old.Name != svcName) {
		// As kube-proxy: a deletion's trigger time is that of the
		// slice's last update, not of the deletion; the service's
		// times are not measured.
		delete(w.triggers, old)
		delete(w.slices[old], s.Name)
		if len(w.slices[old]) == 0 {
			delete(w.slices, old)
		}
		delete(w.owners, id)
		w.dirty[old] = struct{}{}
	}
	if !deleted && svcName != "" {
		key := model.ServiceKey{Namespace: s.Namespace, Name: svcName}
		if w.slices[key] == nil {
			w.slices[key] = map[string]*discovery.EndpointSlice{}
		}
		w.noteTrigger(key, w.slices[key][s.Name], s)
		w.slices[key][s.Name] = s
		w.owners[id] = key
		w.dirty[key] = struct{}{}
	} else if svcName == "" {
		klog.V(4).InfoS("Ignoring EndpointSlice without a service name label", "endpointSlice", klog.KObj(s))
	}
	w.signal()
}

func (w *Watcher) onNode(obj any, deleted bool) {
	n, ok := obj.(*v1.Node)
	if !ok {
		return
	}
	zone := ""
	if !deleted {
		zone = n.Labels[zoneLabel]
	}
	eligible, why := nodeEligibility(n, deleted)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.setEligible(eligible, why)
	if zone == w.node.Zone {
		return
	}
	klog.InfoS("Node zone changed", "node", w.cfg.NodeName, "zone", zone)
	w.node.Zone = zone
	// Hint matches of every service may have changed.
	for key := range w.services {
		w.dirty[key] = struct{}{}
	}
	w.signal()
}

// nodeEligibility says whether node n (deleted: its last state before
// its deletion) is eligible for load-balancer traffic (see
// Config.NodeEligible), and if not, why.
func nodeEligibility(n *v1.Node, deleted bool) (bool, string) {
	switch {
	case deleted:
		return false, "the Node was deleted"
	case n.DeletionTimestamp != nil:
		return false, "the Node is being deleted"
	}
	for _, t := range n.Spec.Taints {
		if t.Key == ToBeDeletedTaint {
			return false, "the Node has the " + ToBeDeletedTaint + " taint"
		}
	}
	return true, ""
}

// setEligible reports the node's eligibility when it changed. w.mu is
// held.
func (w *Watcher) setEligible(eligible bool, why string) {
	if w.eligible != nil && *w.eligible == eligible {
		return
	}
	w.eligible = &eligible
	if eligible {
		klog.InfoS("Node eligible for load-balancer traffic", "node", w.cfg.NodeName)
	} else {
		klog.InfoS("Node not eligible for load-balancer traffic: /healthz fails", "node", w.cfg.NodeName, "reason", why)
	}
	if w.cfg.NodeEligible != nil {
		w.cfg.NodeEligible(eligible)
	}
}

// countEvent counts a Service or EndpointSlice event for the next round.
// w.mu is held.
func (w *Watcher) countEvent() {
	if w.events == 0 {
		w.firstEvent = time.Now()
	}
	w.events++
}

// noteTrigger records the trigger time of slice s of service key (the
// EndpointSlice controller's last-change-trigger-time annotation), unless
// it is that of the slice's previous version old, or from before the
// watcher started. w.mu is held.
func (w *Watcher) noteTrigger(key model.ServiceKey, old, s *discovery.EndpointSlice) {
	text, ok := s.Annotations[v1.EndpointsLastChangeTriggerTime]
	if !ok || (old != nil && old.Annotations[v1.EndpointsLastChangeTriggerTime] == text) {
		return
	}
	t, err := time.Parse(time.RFC3339Nano, text)
	if err != nil {
		klog.ErrorS(err, "Bad trigger time: the change's network programming latency is not measured", "endpointSlice", klog.KObj(s),
			"field", "metadata.annotations["+v1.EndpointsLastChangeTriggerTime+"]")
		return
	}
	if t.After(w.start) {
		w.triggers[key] = append(w.triggers[key], t)
	}
}

func (w *Watcher) onServiceCIDR(obj any, deleted bool) {
	c, ok := obj.(*networking.ServiceCIDR)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	old, had := w.serviceCIDRs[c.Name]
	switch {
	case deleted:
		delete(w.serviceCIDRs, c.Name)
	case had && slices.Equal(old, c.Spec.CIDRs):
		return
	default:
		w.serviceCIDRs[c.Name] = slices.Clone(c.Spec.CIDRs)
	}
	w.clusterDirty = true
	w.signal()
}

// cluster returns the cluster-level facts: the union of the service
// CIDRs (nil: none). w.mu is held.
func (w *Watcher) cluster() *model.Cluster {
	var texts []string
	for _, name := range slices.Sorted(maps.Keys(w.serviceCIDRs)) {
		texts = append(texts, w.serviceCIDRs[name]...)
	}
	cidrs, bad := model.ParseCIDRs(texts...)
	for _, b := range bad {
		klog.ErrorS(nil, "Skipping invalid CIDR", "kind", "ServiceCIDR", "field", "spec.cidrs", "value", b)
	}
	if len(cidrs) == 0 {
		return nil
	}
	return &model.Cluster{ServiceCIDRs: cidrs}
}

// round is what snapshot takes for a round: the new state of the services
// changed, with the trigger times and events behind them, and the
// cluster-level facts when they changed (clusterChanged false: they did
// not).
type round struct {
	keys           []model.ServiceKey
	states         map[model.ServiceKey]*model.ServiceEndpoints
	triggers       map[model.ServiceKey][]time.Time
	events         int
	firstEvent     time.Time
	cluster        *model.Cluster
	clusterChanged bool
}

// snapshot builds the new state of every dirty service (nil: gone) under the
// lock, so that a round reflects one consistent view of the caches, and the
// cluster-level facts when they changed.
func (w *Watcher) snapshot() round {
	w.mu.Lock()
	defer w.mu.Unlock()
	var r round
	if w.clusterDirty {
		r.cluster, r.clusterChanged, w.clusterDirty = w.cluster(), true, false
	}
	keys := make([]model.ServiceKey, 0, len(w.dirty))
	states := make(map[model.ServiceKey]*model.ServiceEndpoints, len(w.dirty))
	for key := range w.dirty {
		keys = append(keys, key)
		svc, ok := w.services[key]
		if !ok || !proxied(svc) {
			continue
		}
		m := convertService(svc)
		sl := make([]*discovery.EndpointSlice, 0, len(w.slices[key]))
		for _, s := range w.slices[key] {
			sl = append(sl, s)
		}
		states[key] = &model.ServiceEndpoints{Service: m, Endpoints: buildEndpoints(m, sl, w.node)}
	}
	clear(w.dirty)
	slices.SortFunc(keys, model.ServiceKey.Compare)
	r.keys, r.states, r.events, r.firstEvent = keys, states, w.events, w.firstEvent
	if len(w.triggers) > 0 {
		r.triggers, w.triggers = w.triggers, map[model.ServiceKey][]time.Time{}
	}
	w.events, w.firstEvent = 0, time.Time{}
	return r
}

// deliver hands the changed services to the feeder, with their trigger
// times and the events behind them, and ends the round (the feeder
// delivers what differs from what the sink holds, and retries what the
// sink fails to apply). Its log says how long the round's first event
// waited for it (waited: the coalescing, and the wake-up of Run) and how
// long the delivery took, the sink's Sync included (duration): with the
// log line's time, these place a change's path through kpng.
func (w *Watcher) deliver(f *localsink.Feeder) {
	start := time.Now()
	r := w.snapshot()
	var waited time.Duration
	if !r.firstEvent.IsZero() {
		waited = start.Sub(r.firstEvent)
	}
	if r.clusterChanged {
		f.SetCluster(r.cluster)
	}
	for _, key := range r.keys {
		f.Update(key, r.states[key])
	}
	for key, times := range r.triggers {
		f.Triggered(key, times...)
	}
	f.Seen(r.events, r.firstEvent)
	err := f.Sync()
	klog.V(2).InfoS("Delivered state", "dirtyServices", len(r.keys), "services", f.Len(), "failed", err != nil,
		"waited", waited, "duration", time.Since(start))
}
