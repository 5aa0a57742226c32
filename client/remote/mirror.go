package remote

import (
	"fmt"
	"slices"

	"sigs.k8s.io/kpng/api/kpngv1"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

// mirror is the receiving edge of the wire format: it applies the
// controller's per-endpoint operations to whole services, and on each Sync
// hands the services that changed to a Feeder, which delivers to the sink
// only what differs from what it holds. A Reset from the controller (sent
// on every new stream) therefore costs the sink nothing when the state did
// not change. The Feeder lives across streams.
type mirror struct {
	feeder   *localsink.Feeder
	services map[model.ServiceKey]*wireService
	changed  map[model.ServiceKey]struct{}
	// cluster are the cluster-level facts the controller sent (a Reset
	// forgets them).
	cluster *model.Cluster
}

// wireService is a service as the operations built it.
type wireService struct {
	svc *model.Service
	eps map[string]*model.Endpoint
}

func newMirror(feeder *localsink.Feeder) *mirror {
	return &mirror{feeder: feeder, services: map[model.ServiceKey]*wireService{}, changed: map[model.ServiceKey]struct{}{}}
}

// entry returns the service key, created when missing, marked changed.
func (m *mirror) entry(key model.ServiceKey) *wireService {
	e := m.services[key]
	if e == nil {
		e = &wireService{eps: map[string]*model.Endpoint{}}
		m.services[key] = e
	}
	m.changed[key] = struct{}{}
	return e
}

// apply applies one operation; malformed ones are errors (the stream is
// then dropped and reopened).
func (m *mirror) apply(op *kpngv1.Op) error {
	switch o := op.GetOp().(type) {
	case *kpngv1.Op_Reset_:
		for key := range m.services {
			m.changed[key] = struct{}{}
		}
		clear(m.services)
		m.cluster = nil
	case *kpngv1.Op_SetService:
		if o.SetService.GetName() == "" {
			return fmt.Errorf("set_service without a name")
		}
		svc, err := o.SetService.Model()
		if err != nil {
			return fmt.Errorf("set_service: %w", err)
		}
		// Names the API server would refuse (another controller's stream
		// is not checked by it) reach rule text and logs: refused.
		if err := svc.CheckNames(); err != nil {
			return fmt.Errorf("set_service: %w", err)
		}
		m.entry(svc.Key()).svc = svc
	case *kpngv1.Op_DeleteService:
		key := o.DeleteService.Model()
		if _, ok := m.services[key]; ok {
			delete(m.services, key)
			m.changed[key] = struct{}{}
		}
	case *kpngv1.Op_SetEndpoint:
		if o.SetEndpoint.GetService() == nil || o.SetEndpoint.GetEndpoint() == nil {
			return fmt.Errorf("set_endpoint without service or endpoint")
		}
		key, ep := o.SetEndpoint.GetService().Model(), o.SetEndpoint.GetEndpoint().Model()
		if err := ep.CheckNames(key, "endpoints[]"); err != nil {
			return fmt.Errorf("set_endpoint %s: %w", model.Quote(o.SetEndpoint.GetKey()), err)
		}
		m.entry(key).eps[o.SetEndpoint.GetKey()] = ep
	case *kpngv1.Op_DeleteEndpoint:
		if o.DeleteEndpoint.GetService() == nil {
			return fmt.Errorf("delete_endpoint without service")
		}
		if e := m.services[o.DeleteEndpoint.GetService().Model()]; e != nil {
			delete(e.eps, o.DeleteEndpoint.GetKey())
			m.changed[o.DeleteEndpoint.GetService().Model()] = struct{}{}
		}
	case *kpngv1.Op_Sync:
		if c := o.Sync.GetCluster(); c != nil {
			cluster, err := c.Model()
			if err != nil {
				return fmt.Errorf("sync: %w", err)
			}
			m.cluster = cluster
		}
		for _, t := range o.Sync.GetTriggers() {
			key, times, err := t.Model()
			if err != nil {
				return fmt.Errorf("sync: %w", err)
			}
			m.feeder.Triggered(key, times...)
		}
		m.sync()
	default:
		return fmt.Errorf("unknown operation %T", o)
	}
	return nil
}

// sync ends a round: the cluster-level facts and the services changed go
// to the feeder (which delivers only what differs), rebuilt.
func (m *mirror) sync() {
	m.feeder.SetCluster(m.cluster)
	for key := range m.changed {
		var se *model.ServiceEndpoints
		if e := m.services[key]; e != nil && e.svc != nil {
			se = e.build()
		}
		m.feeder.Update(key, se)
	}
	clear(m.changed)
	_ = m.feeder.Sync() // the Feeder logs a failure and retries it
}

// build returns the service with its endpoints sorted by address.
func (e *wireService) build() *model.ServiceEndpoints {
	eps := make([]*model.Endpoint, 0, len(e.eps))
	for _, ep := range e.eps {
		eps = append(eps, ep)
	}
	slices.SortFunc(eps, model.CompareEndpoints)
	return &model.ServiceEndpoints{Service: e.svc, Endpoints: eps}
}
