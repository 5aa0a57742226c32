package localsink

import (
	"slices"

	"sigs.k8s.io/kpng/client/model"
)

// Handler receives the whole state: every selected service with its
// endpoints, services sorted by namespace and name, endpoints by address.
// The items and everything they point to are read-only and are never
// modified afterwards, so a handler may keep them.
type Handler func(items []*model.ServiceEndpoints)

// FullState is a Sink that rebuilds the whole state and hands it to a
// Handler on each Sync that changed something (and on the first Sync after a
// Reset, even when the state is empty). Only the services that changed are
// rebuilt; unchanged ones are handed over as the same pointers as before.
type FullState struct {
	*Store
	handler Handler
	keys    []model.ServiceKey // sorted keys of the services in the state
}

var _ Sink = (*FullState)(nil)

// NewFullState returns a FullState calling h.
func NewFullState(h Handler) *FullState {
	return &FullState{Store: NewStore(), handler: h}
}

// Sync implements Sink: it calls the handler when the state changed.
func (f *FullState) Sync() {
	changed, reset := f.Commit()
	if len(changed) == 0 && !reset {
		return
	}
	for _, key := range changed {
		i, found := slices.BinarySearchFunc(f.keys, key, model.ServiceKey.Compare)
		switch present := f.Get(key) != nil; {
		case present && !found:
			f.keys = slices.Insert(f.keys, i, key)
		case !present && found:
			f.keys = slices.Delete(f.keys, i, i+1)
		}
	}
	f.handler(f.State())
}

// State returns the current state as of the last Sync.
func (f *FullState) State() []*model.ServiceEndpoints {
	items := make([]*model.ServiceEndpoints, len(f.keys))
	for i, key := range f.keys {
		items[i] = f.Get(key)
	}
	return items
}

// FromFullState returns a Handler that feeds sink the difference between
// successive full states: Reset and the whole state on the first call, then
// only what changed, each call ending with Sync.
func FromFullState(sink Sink) Handler {
	d := NewDiffer(sink)
	first := true
	return func(items []*model.ServiceEndpoints) {
		if first {
			d.Reset()
			first = false
		}
		d.SetAll(items)
		d.Sync()
	}
}
