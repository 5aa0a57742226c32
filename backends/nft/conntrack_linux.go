//go:build linux

package nft

import (
	"time"

	"sigs.k8s.io/kpng/backends/conntrack"
)

// conntrackFlows converts flows for the shared conntrack package.
func conntrackFlows(flows []staleFlow) []conntrack.Flow {
	out := make([]conntrack.Flow, 0, len(flows))
	for _, fl := range flows {
		proto, ok := l4proto(fl.Proto)
		if !ok {
			continue
		}
		out = append(out, conntrack.Flow{IPv6: fl.Family == ipv6, Proto: proto, Dst: fl.Dst, Endpoint: fl.Endpoint})
	}
	return out
}

// flushStaleFlows deletes the conntrack entries of the stale flows
// gathered since the last successful transaction. Errors are logged, never
// returned: the rules are in place, stale entries only delay them for the
// flows concerned until the entries expire.
func (s *Sink) flushStaleFlows() {
	flows := s.staleFlows
	s.staleFlows = nil
	if len(flows) == 0 {
		return
	}
	start := time.Now()
	deleted, err := conntrack.DeleteFlows(s.cfg.Conntrack, conntrackFlows(flows))
	if err != nil {
		s.logger.Error(err, "Cannot delete stale UDP conntrack entries", "table", s.table, "flows", len(flows), "deleted", deleted)
		return
	}
	s.logger.V(2).Info("Deleted stale UDP conntrack entries", "table", s.table, "flows", len(flows), "deleted", deleted, "duration", time.Since(start))
	if v := s.logger.V(4); v.Enabled() {
		for _, f := range flows {
			v.Info("Stale UDP conntrack flow", "table", s.table, "flow", f.String())
		}
	}
}
