package localsink

import (
	"reflect"
	"slices"

	"sigs.k8s.io/kpng/client/model"
	"sigs.k8s.io/kpng/diffstore"
)

// Differ remembers what a Sink holds and sends it only what changes. It is
// how the watcher and the full-state → incremental adapter keep the Sink
// ordering guarantees. A Differ is not safe for concurrent use.
type Differ struct {
	sink Sink
	held map[model.ServiceKey]*heldService
}

type heldService struct {
	svc *model.Service
	eps *diffstore.Store[string, *model.Endpoint]
}

// NewDiffer returns a Differ feeding sink, which it assumes empty.
func NewDiffer(sink Sink) *Differ {
	return &Differ{sink: sink, held: map[model.ServiceKey]*heldService{}}
}

// Reset calls the sink's Reset and forgets everything it held.
func (d *Differ) Reset() {
	clear(d.held)
	d.sink.Reset()
}

// Sync calls the sink's Sync.
func (d *Differ) Sync() { d.sink.Sync() }

// Len returns the number of services the sink holds.
func (d *Differ) Len() int { return len(d.held) }

// Update brings service key to se (nil: the service is gone), calling the
// sink only for what differs from what it holds. It returns the number of
// calls made.
func (d *Differ) Update(key model.ServiceKey, se *model.ServiceEndpoints) int {
	old := d.held[key]
	if se == nil {
		if old == nil {
			return 0
		}
		n := 0
		old.eps.Each(func(k string, _ *model.Endpoint) {
			d.sink.DeleteEndpoint(key, k)
			n++
		})
		d.sink.DeleteService(key)
		delete(d.held, key)
		return n + 1
	}
	n := 0
	if old == nil {
		old = &heldService{eps: diffstore.New[string](endpointEqual)}
		d.held[key] = old
	}
	if old.svc == nil || !reflect.DeepEqual(old.svc, se.Service) {
		d.sink.SetService(se.Service)
		old.svc = se.Service
		n++
	}
	for _, ep := range se.Endpoints {
		old.eps.Set(ep.Key(), ep)
	}
	ch := old.eps.Done()
	for _, it := range ch.Deleted {
		d.sink.DeleteEndpoint(key, it.Key)
	}
	for _, list := range [][]diffstore.Item[string, *model.Endpoint]{ch.Created, ch.Updated} {
		for _, it := range list {
			d.sink.SetEndpoint(key, it.Key, it.Value)
		}
	}
	return n + ch.Len()
}

// SetAll brings the sink to exactly items: services not in items are
// deleted. It does not call Sync. It returns the number of calls made.
func (d *Differ) SetAll(items []*model.ServiceEndpoints) int {
	seen := make(map[model.ServiceKey]struct{}, len(items))
	sorted := slices.Clone(items)
	slices.SortFunc(sorted, func(a, b *model.ServiceEndpoints) int { return a.Service.Key().Compare(b.Service.Key()) })
	n := 0
	for _, se := range sorted {
		key := se.Service.Key()
		seen[key] = struct{}{}
		n += d.Update(key, se)
	}
	var gone []model.ServiceKey
	for key := range d.held {
		if _, ok := seen[key]; !ok {
			gone = append(gone, key)
		}
	}
	slices.SortFunc(gone, model.ServiceKey.Compare)
	for _, key := range gone {
		n += d.Update(key, nil)
	}
	return n
}

func endpointEqual(a, b *model.Endpoint) bool { return reflect.DeepEqual(a, b) }
