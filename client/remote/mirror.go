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
//
// On a node-independent stream (the controller's Reset names the node's
// facts) the mirror holds the state every node shares, and computes its
// node's view of each service it delivers (model.Node.ViewService); it
// keeps the hash of the last state the controller named, which a new
// stream sends so as not to be sent that state again.
type mirror struct {
	feeder   *localsink.Feeder
	services map[model.ServiceKey]*wireService
	changed  map[model.ServiceKey]struct{}
	// cluster are the cluster-level facts the controller sent (a Reset
	// forgets them).
	cluster *model.Cluster
	// node is the backend's node, independent whether the state is
	// node-independent (its view computed here with node), hash the
	// state hash of the last sync that named one (nil after a Reset and
	// when a stream ended in the middle of a round).
	node        model.Node
	independent bool
	hash        []byte
	// midRound: operations were applied since the last sync.
	midRound bool
}

// wireService is a service as the operations built it.
type wireService struct {
	svc *model.Service
	eps map[string]*model.Endpoint
}

func newMirror(feeder *localsink.Feeder, node string) *mirror {
	return &mirror{feeder: feeder, services: map[model.ServiceKey]*wireService{}, changed: map[model.ServiceKey]struct{}{}, node: model.Node{Name: node}}
}

// streamEnded is called when a stream ends: a round cut in the middle
// leaves the mirror holding part of it, which is no state the controller
// named.
func (m *mirror) streamEnded() {
	if m.midRound {
		m.hash = nil
	}
}

// haveState is the state hash a new stream sends (nil: none).
func (m *mirror) haveState() []byte {
	if !m.independent {
		return nil
	}
	return m.hash
}

// setNode takes the node's facts: its zone, and its name when the
// controller gives it (the node it authorized: a client certificate's
// when the backend named none).
func (m *mirror) setNode(n *kpngv1.NodeFacts) {
	m.node.Zone = n.GetZone()
	if name := n.GetName(); name != "" {
		m.node.Name = name
	}
}

// markAll marks every service changed (their view is to be computed
// again).
func (m *mirror) markAll() {
	for key := range m.services {
		m.changed[key] = struct{}{}
	}
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
	if op.GetSync() == nil {
		m.midRound = true
	}
	switch o := op.GetOp().(type) {
	case *kpngv1.Op_Reset_:
		m.markAll()
		clear(m.services)
		m.cluster, m.hash = nil, nil
		if n := o.Reset_.GetNode(); n != nil {
			m.independent = true
			m.setNode(n)
		} else {
			m.independent, m.node.Zone = false, ""
		}
	case *kpngv1.Op_SetNode:
		// The zone is only compared with the hints' zones.
		m.independent = true
		m.setNode(o.SetNode)
		m.markAll()
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
		if h := o.Sync.GetStateHash(); len(h) > 0 {
			m.hash = slices.Clone(h)
		}
		m.midRound = false
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
			if m.independent {
				se = m.node.ViewService(se)
			}
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
