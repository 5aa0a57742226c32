package watcher

import (
	"sync"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
)

// compactor is the transform of the watcher's informers: what the watcher
// does not read is dropped from each object before the informer stores it,
// and the strings and flags that thousands of endpoints repeat are shared.
// The informers hold every selected Service and EndpointSlice for as long
// as the watcher runs: at 10,000 services × 10 endpoints, 45 MiB without
// managed fields, more in a real cluster, whose slices carry a target
// reference per endpoint and an owner reference each.
type compactor struct {
	mu sync.Mutex
	// strings are the node names and zones of the endpoints seen, each
	// held once; forgotten (not to grow for ever as nodes come and go)
	// when they reach maxShared.
	strings map[string]*string
}

// maxShared bounds compactor.strings: beyond it, the table starts again.
const maxShared = 1 << 14

// Shared condition values: the conditions of an endpoint are read, never
// written.
var (
	sharedTrue  = true
	sharedFalse = false
)

// compact is the informers' transform (cache.TransformFunc): managed
// fields, owner references and annotations dropped, but an
// EndpointSlice's trigger time (the EndpointSlice controller's
// last-change-trigger-time, for the network programming latency); for
// EndpointSlices, the endpoints' target references, hostnames and
// deprecated topology dropped, their node names, zones and conditions
// shared; for Services, the selector and the status conditions dropped.
func (c *compactor) compact(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
		m.SetOwnerReferences(nil)
		var keep map[string]string
		if t, ok := m.GetAnnotations()[v1.EndpointsLastChangeTriggerTime]; ok {
			if _, isSlice := obj.(*discovery.EndpointSlice); isSlice {
				keep = map[string]string{v1.EndpointsLastChangeTriggerTime: t}
			}
		}
		m.SetAnnotations(keep)
	}
	switch o := obj.(type) {
	case *discovery.EndpointSlice:
		c.compactSlice(o)
	case *v1.Service:
		o.Spec.Selector = nil
		o.Status.Conditions = nil
	}
	return obj, nil
}

// compactSlice compacts the endpoints of s.
func (c *compactor) compactSlice(s *discovery.EndpointSlice) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		e.TargetRef, e.Hostname, e.DeprecatedTopology = nil, nil, nil
		e.NodeName, e.Zone = c.share(e.NodeName), c.share(e.Zone)
		cond := &e.Conditions
		cond.Ready, cond.Serving, cond.Terminating = shareBool(cond.Ready), shareBool(cond.Serving), shareBool(cond.Terminating)
	}
}

// share returns a pointer to the value of p held once (nil for nil). c.mu
// is held.
func (c *compactor) share(p *string) *string {
	if p == nil {
		return nil
	}
	if q, ok := c.strings[*p]; ok {
		return q
	}
	if c.strings == nil || len(c.strings) >= maxShared {
		c.strings = map[string]*string{}
	}
	c.strings[*p] = p
	return p
}

// shareBool returns a pointer to a shared value equal to *p (nil for nil).
func shareBool(p *bool) *bool {
	switch {
	case p == nil:
		return nil
	case *p:
		return &sharedTrue
	}
	return &sharedFalse
}
