package remote

import (
	"fmt"

	"sigs.k8s.io/kpng/api/kpngv1"
	"sigs.k8s.io/kpng/localsink"
)

// mirror applies the controller's operations to a local Store, and on each
// Sync passes the difference with what the sink holds to the sink. A Reset
// from the controller (sent on every new stream) therefore costs the sink
// nothing when the state did not change.
type mirror struct {
	store  *localsink.Store
	differ *localsink.Differ
	first  bool
}

func newMirror(sink localsink.Sink) *mirror {
	return &mirror{store: localsink.NewStore(), differ: localsink.NewDiffer(sink), first: true}
}

// apply applies one operation; malformed ones are errors (the stream is
// then dropped and reopened).
func (m *mirror) apply(op *kpngv1.Op) error {
	switch o := op.GetOp().(type) {
	case *kpngv1.Op_Reset_:
		m.store.Reset()
	case *kpngv1.Op_SetService:
		if o.SetService.GetName() == "" {
			return fmt.Errorf("set_service without a name")
		}
		m.store.SetService(o.SetService.Model())
	case *kpngv1.Op_DeleteService:
		m.store.DeleteService(o.DeleteService.Model())
	case *kpngv1.Op_SetEndpoint:
		if o.SetEndpoint.GetService() == nil || o.SetEndpoint.GetEndpoint() == nil {
			return fmt.Errorf("set_endpoint without service or endpoint")
		}
		m.store.SetEndpoint(o.SetEndpoint.GetService().Model(), o.SetEndpoint.GetKey(), o.SetEndpoint.GetEndpoint().Model())
	case *kpngv1.Op_DeleteEndpoint:
		if o.DeleteEndpoint.GetService() == nil {
			return fmt.Errorf("delete_endpoint without service")
		}
		m.store.DeleteEndpoint(o.DeleteEndpoint.GetService().Model(), o.DeleteEndpoint.GetKey())
	case *kpngv1.Op_Sync:
		m.sync()
	default:
		return fmt.Errorf("unknown operation %T", o)
	}
	return nil
}

func (m *mirror) sync() {
	changed, _ := m.store.Commit()
	if m.first {
		m.differ.Reset()
	}
	n := 0
	for _, key := range changed {
		n += m.differ.Update(key, m.store.Get(key))
	}
	if n > 0 || m.first {
		m.differ.Sync()
	}
	m.first = false
}
