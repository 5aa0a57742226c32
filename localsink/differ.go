package localsink

import (
	"reflect"
	"slices"

	"sigs.k8s.io/kpng/client/model"
	"sigs.k8s.io/kpng/diffstore"
)

// Differ remembers what a Sink holds and sends it only what changes. It is
// how the watcher, the API server and the adapters keep the Sink ordering
// guarantees. It holds only pointers to the values it was given (which are
// immutable), so many Differs over the same state cost little: the API
// server keeps one per connected backend. A Differ is not safe for
// concurrent use.
type Differ struct {
	sink Sink
	held map[model.ServiceKey]*model.ServiceEndpoints
	// all is used by SetAll: the services of the last full state.
	all *diffstore.Store[string, *model.ServiceEndpoints]
}

// NewDiffer returns a Differ feeding sink, which it assumes empty.
func NewDiffer(sink Sink) *Differ {
	return &Differ{sink: sink, held: map[model.ServiceKey]*model.ServiceEndpoints{}}
}

// Reset calls the sink's Reset and forgets everything it held.
func (d *Differ) Reset() {
	clear(d.held)
	d.all = nil
	d.sink.Reset()
}

// Sync calls the sink's Sync.
func (d *Differ) Sync() { d.sink.Sync() }

// Len returns the number of services the sink holds.
func (d *Differ) Len() int { return len(d.held) }

// Update brings service key to se (nil: the service is gone), calling the
// sink only for what differs from what it holds: SetService when the service
// changed, then DeleteEndpoint for the endpoints that went away, then
// SetEndpoint for the new and changed ones, in address order. Endpoints are
// identified by their Key; when se lists one twice, the first wins. It
// returns the number of calls made.
func (d *Differ) Update(key model.ServiceKey, se *model.ServiceEndpoints) int {
	old := d.held[key]
	if se == nil {
		if old == nil {
			return 0
		}
		for _, ep := range old.Endpoints {
			d.sink.DeleteEndpoint(key, ep.Key())
		}
		d.sink.DeleteService(key)
		delete(d.held, key)
		return len(old.Endpoints) + 1
	}
	if old == se {
		return 0 // values are immutable: the same pointer is the same value
	}
	n := 0
	if old == nil || (old.Service != se.Service && !reflect.DeepEqual(old.Service, se.Service)) {
		d.sink.SetService(se.Service)
		n++
	}
	se = sortedEndpoints(se)
	var oldEps []*model.Endpoint
	if old != nil {
		oldEps = old.Endpoints
	}
	// Both lists are sorted by address: merge them.
	var sets []*model.Endpoint
	i, j := 0, 0
	for i < len(oldEps) || j < len(se.Endpoints) {
		var c int
		switch {
		case i == len(oldEps):
			c = 1
		case j == len(se.Endpoints):
			c = -1
		default:
			c = model.CompareEndpoints(oldEps[i], se.Endpoints[j])
		}
		switch {
		case c < 0:
			d.sink.DeleteEndpoint(key, oldEps[i].Key())
			n++
			i++
		case c > 0:
			sets = append(sets, se.Endpoints[j])
			j++
		default:
			if oldEps[i] != se.Endpoints[j] && !reflect.DeepEqual(oldEps[i], se.Endpoints[j]) {
				sets = append(sets, se.Endpoints[j])
			}
			i++
			j++
		}
	}
	for _, ep := range sets {
		d.sink.SetEndpoint(key, ep.Key(), ep)
	}
	d.held[key] = se
	return n + len(sets)
}

// sortedEndpoints returns se with its endpoints sorted by address and
// unique (se itself when they already are).
func sortedEndpoints(se *model.ServiceEndpoints) *model.ServiceEndpoints {
	ordered := true
	for i := 1; i < len(se.Endpoints); i++ {
		if model.CompareEndpoints(se.Endpoints[i-1], se.Endpoints[i]) >= 0 {
			ordered = false
			break
		}
	}
	if ordered {
		return se
	}
	eps := slices.Clone(se.Endpoints)
	slices.SortStableFunc(eps, model.CompareEndpoints)
	eps = slices.CompactFunc(eps, func(a, b *model.Endpoint) bool { return model.CompareEndpoints(a, b) == 0 })
	return &model.ServiceEndpoints{Service: se.Service, Endpoints: eps}
}

// SetAll brings the sink to exactly items, a full state: services not in
// items are deleted. It compares the services with the previous full state
// (through a diffstore), so unchanged services cost a pointer comparison.
// It does not call Sync. It returns the number of calls made.
func (d *Differ) SetAll(items []*model.ServiceEndpoints) int {
	if d.all == nil {
		// Unchanged means the same value as in the previous full state,
		// and still what the sink holds (Update may have changed it since).
		d.all = diffstore.New[string](func(a, b *model.ServiceEndpoints) bool {
			return a == b && d.held[b.Service.Key()] == b
		})
	}
	for _, se := range items {
		d.all.Set(se.Service.Key().String(), se)
	}
	ch := d.all.Done()
	type change struct {
		key model.ServiceKey
		se  *model.ServiceEndpoints
	}
	changes := make([]change, 0, ch.Len())
	for _, list := range [][]diffstore.Item[string, *model.ServiceEndpoints]{ch.Created, ch.Updated} {
		for _, it := range list {
			changes = append(changes, change{it.Value.Service.Key(), it.Value})
		}
	}
	for _, it := range ch.Deleted {
		changes = append(changes, change{it.Value.Service.Key(), nil})
	}
	slices.SortFunc(changes, func(a, b change) int { return a.key.Compare(b.key) })
	n := 0
	for _, c := range changes {
		n += d.Update(c.key, c.se)
	}
	// Services the sink holds from Update calls outside SetAll, and not in
	// this full state, go too.
	if len(d.held) > d.all.Len() {
		var gone []model.ServiceKey
		for key := range d.held {
			if _, ok := d.all.Get(key.String()); !ok {
				gone = append(gone, key)
			}
		}
		slices.SortFunc(gone, model.ServiceKey.Compare)
		for _, key := range gone {
			n += d.Update(key, nil)
		}
	}
	return n
}
