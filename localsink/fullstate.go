package localsink

import (
	"slices"

	"sigs.k8s.io/kpng/model"
)

// Handler receives the whole state: every selected service with its
// endpoints, services sorted by namespace and name, endpoints by address.
// The items and everything they point to are read-only and are never
// modified afterwards, so a handler may keep them.
type Handler func(items []*model.ServiceEndpoints)

// FullState is a Sink that hands the whole state to a Handler on each Sync
// (which, by the Sink contract, only comes when something changed, and
// after a Reset). Unchanged services are handed over as the same pointers
// as before; the cost per round is one slice of pointers.
//
// It is a ClusterSink: the cluster-level facts are not part of the state
// handed to the handler (its JSON is the public contract), but a handler
// may read them with Cluster.
type FullState struct {
	handler  Handler
	services map[model.ServiceKey]*model.ServiceEndpoints
	keys     []model.ServiceKey // sorted keys of services
	cluster  *model.Cluster
}

var _ ClusterSink = (*FullState)(nil)

// NewFullState returns a FullState calling h.
func NewFullState(h Handler) *FullState {
	return &FullState{handler: h, services: map[model.ServiceKey]*model.ServiceEndpoints{}}
}

// Reset implements Sink.
func (f *FullState) Reset() {
	clear(f.services)
	f.keys = f.keys[:0]
	f.cluster = nil
}

// SetCluster implements ClusterSink.
func (f *FullState) SetCluster(c *model.Cluster) { f.cluster = c }

// Cluster returns the cluster-level facts as of the current state (nil:
// none), for a handler that needs them.
func (f *FullState) Cluster() *model.Cluster { return f.cluster }

// Update implements Sink.
func (f *FullState) Update(key model.ServiceKey, _, cur *model.ServiceEndpoints) {
	i, found := slices.BinarySearchFunc(f.keys, key, model.ServiceKey.Compare)
	switch {
	case cur != nil && !found:
		f.keys = slices.Insert(f.keys, i, key)
	case cur == nil && found:
		f.keys = slices.Delete(f.keys, i, i+1)
	}
	if cur == nil {
		delete(f.services, key)
	} else {
		f.services[key] = cur
	}
}

// Sync implements Sink: it calls the handler with the whole state.
func (f *FullState) Sync() error {
	f.handler(f.State())
	return nil
}

// State returns the current state: every service, in key order.
func (f *FullState) State() []*model.ServiceEndpoints {
	items := make([]*model.ServiceEndpoints, len(f.keys))
	for i, key := range f.keys {
		items[i] = f.services[key]
	}
	return items
}

// FromFullState returns a Handler that feeds sink the difference between
// successive full states through a Feeder: Reset and the whole state on
// the first call, then only what changed, each call a round. It has no
// retry timer: a round the sink fails to apply is delivered again with the
// next call. A full state carries no cluster-level facts: the sink gets
// none.
func FromFullState(sink Sink) Handler {
	f := NewFeeder(sink, FeederOptions{NoRetry: true})
	return func(items []*model.ServiceEndpoints) {
		f.SetAll(items)
		_ = f.Sync() // the Feeder logs failures and keeps them pending
	}
}
