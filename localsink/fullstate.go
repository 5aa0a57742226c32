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
	handler  Handler
	services map[model.ServiceKey]*fullStateEntry
	keys     []model.ServiceKey // sorted
	dirty    map[model.ServiceKey]struct{}
	reset    bool
}

type fullStateEntry struct {
	svc   *model.Service
	eps   map[string]*model.Endpoint
	built *model.ServiceEndpoints
}

var _ Sink = (*FullState)(nil)

// NewFullState returns a FullState calling h.
func NewFullState(h Handler) *FullState {
	return &FullState{handler: h, services: map[model.ServiceKey]*fullStateEntry{}, dirty: map[model.ServiceKey]struct{}{}}
}

// Reset implements Sink.
func (f *FullState) Reset() {
	clear(f.services)
	clear(f.dirty)
	f.keys = f.keys[:0]
	f.reset = true
}

func (f *FullState) entry(key model.ServiceKey) *fullStateEntry {
	e := f.services[key]
	if e == nil {
		e = &fullStateEntry{eps: map[string]*model.Endpoint{}}
		f.services[key] = e
		i, _ := slices.BinarySearchFunc(f.keys, key, model.ServiceKey.Compare)
		f.keys = slices.Insert(f.keys, i, key)
	}
	f.dirty[key] = struct{}{}
	return e
}

// SetService implements Sink.
func (f *FullState) SetService(svc *model.Service) { f.entry(svc.Key()).svc = svc }

// DeleteService implements Sink.
func (f *FullState) DeleteService(key model.ServiceKey) {
	if _, ok := f.services[key]; !ok {
		return
	}
	delete(f.services, key)
	if i, found := slices.BinarySearchFunc(f.keys, key, model.ServiceKey.Compare); found {
		f.keys = slices.Delete(f.keys, i, i+1)
	}
	f.dirty[key] = struct{}{}
}

// SetEndpoint implements Sink.
func (f *FullState) SetEndpoint(key model.ServiceKey, epKey string, ep *model.Endpoint) {
	f.entry(key).eps[epKey] = ep
}

// DeleteEndpoint implements Sink.
func (f *FullState) DeleteEndpoint(key model.ServiceKey, epKey string) {
	if e := f.services[key]; e != nil {
		delete(e.eps, epKey)
		f.dirty[key] = struct{}{}
	}
}

// Sync implements Sink: it calls the handler when the state changed.
func (f *FullState) Sync() {
	if len(f.dirty) == 0 && !f.reset {
		return
	}
	for key := range f.dirty {
		if e := f.services[key]; e != nil {
			e.built = buildServiceEndpoints(e)
		}
	}
	clear(f.dirty)
	f.reset = false
	f.handler(f.State())
}

// State returns the current state as last built by Sync.
func (f *FullState) State() []*model.ServiceEndpoints {
	items := make([]*model.ServiceEndpoints, 0, len(f.keys))
	for _, key := range f.keys {
		if e := f.services[key]; e.built != nil {
			items = append(items, e.built)
		}
	}
	return items
}

func buildServiceEndpoints(e *fullStateEntry) *model.ServiceEndpoints {
	if e.svc == nil {
		return nil // endpoints without their service: not a service yet
	}
	eps := make([]*model.Endpoint, 0, len(e.eps))
	for _, ep := range e.eps {
		eps = append(eps, ep)
	}
	slices.SortFunc(eps, model.CompareEndpoints)
	return &model.ServiceEndpoints{Service: e.svc, Endpoints: eps}
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
