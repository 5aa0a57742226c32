package localsink

import (
	"slices"

	"sigs.k8s.io/kpng/client/model"
)

// Store applies Sink calls (all but Sync) to an in-memory state, and on each
// Commit rebuilds the services that changed and says which they were. It is
// the common part of the sinks that need the state itself: FullState, the
// API server's hub, the remote client's mirror. A Store is not safe for
// concurrent use.
type Store struct {
	services map[model.ServiceKey]*storeEntry
	changed  map[model.ServiceKey]struct{}
	reset    bool
}

type storeEntry struct {
	svc   *model.Service
	eps   map[string]*model.Endpoint
	built *model.ServiceEndpoints
}

// NewStore returns an empty Store.
func NewStore() *Store {
	return &Store{services: map[model.ServiceKey]*storeEntry{}, changed: map[model.ServiceKey]struct{}{}}
}

// Reset drops the whole state (every service held counts as changed).
func (s *Store) Reset() {
	for key := range s.services {
		s.changed[key] = struct{}{}
	}
	clear(s.services)
	s.reset = true
}

func (s *Store) entry(key model.ServiceKey) *storeEntry {
	e := s.services[key]
	if e == nil {
		e = &storeEntry{eps: map[string]*model.Endpoint{}}
		s.services[key] = e
	}
	s.changed[key] = struct{}{}
	return e
}

// SetService creates or replaces a service.
func (s *Store) SetService(svc *model.Service) { s.entry(svc.Key()).svc = svc }

// DeleteService removes a service and its endpoints.
func (s *Store) DeleteService(key model.ServiceKey) {
	if _, ok := s.services[key]; ok {
		delete(s.services, key)
		s.changed[key] = struct{}{}
	}
}

// SetEndpoint creates or replaces an endpoint of a service.
func (s *Store) SetEndpoint(key model.ServiceKey, epKey string, ep *model.Endpoint) {
	s.entry(key).eps[epKey] = ep
}

// DeleteEndpoint removes an endpoint of a service.
func (s *Store) DeleteEndpoint(key model.ServiceKey, epKey string) {
	if e := s.services[key]; e != nil {
		delete(e.eps, epKey)
		s.changed[key] = struct{}{}
	}
}

// Commit ends a round: it rebuilds the services that changed since the last
// Commit and returns their keys, sorted, and whether Reset was called in
// the round.
func (s *Store) Commit() (changed []model.ServiceKey, reset bool) {
	changed = make([]model.ServiceKey, 0, len(s.changed))
	for key := range s.changed {
		changed = append(changed, key)
		if e := s.services[key]; e != nil {
			e.built = e.build()
		}
	}
	clear(s.changed)
	slices.SortFunc(changed, model.ServiceKey.Compare)
	reset, s.reset = s.reset, false
	return changed, reset
}

// Get returns a service with its endpoints as of the last Commit, nil when
// it does not exist (or has endpoints but no service yet). The value is
// read-only and is replaced, never modified, when the service changes.
func (s *Store) Get(key model.ServiceKey) *model.ServiceEndpoints {
	if e := s.services[key]; e != nil {
		return e.built
	}
	return nil
}

// Keys returns the keys of the services held, in no particular order.
func (s *Store) Keys() []model.ServiceKey {
	keys := make([]model.ServiceKey, 0, len(s.services))
	for key := range s.services {
		keys = append(keys, key)
	}
	return keys
}

func (e *storeEntry) build() *model.ServiceEndpoints {
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
