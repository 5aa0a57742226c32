package metrics

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"

	"sigs.k8s.io/kpng/model"
)

// DebugPath is where MetricsMux serves DebugHandler.
const DebugPath = "/debug/kpng/services"

// Debug is the body of the debug endpoint: what the backend holds and what
// it could not program. Services are in the model's JSON (what kpng-json
// prints), in key order.
type Debug struct {
	ServiceProxyName string
	Services         []*model.ServiceEndpoints
	// Problems are the parts of the services the backend refused, as
	// reported after the last round.
	Problems []model.Problem
}

// DebugHandler serves Debug as JSON. With ?service=namespace/name, only
// that service and its problems (404 when the backend does not hold it
// and has no problem with it).
func (r *Recorder) DebugHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var only *model.ServiceKey
		if q := req.URL.Query().Get("service"); q != "" {
			ns, name, ok := strings.Cut(q, "/")
			if !ok || ns == "" || name == "" {
				http.Error(w, "service: want namespace/name, got "+q, http.StatusBadRequest)
				return
			}
			only = &model.ServiceKey{Namespace: ns, Name: name}
		}
		d := Debug{ServiceProxyName: r.name, Services: []*model.ServiceEndpoints{}, Problems: []model.Problem{}}
		r.mu.Lock()
		for key, se := range r.held {
			if only == nil || key == *only {
				d.Services = append(d.Services, se)
			}
		}
		for _, p := range r.refused {
			if only == nil || p.Service == *only {
				d.Problems = append(d.Problems, p)
			}
		}
		r.mu.Unlock()
		if only != nil && len(d.Services)+len(d.Problems) == 0 {
			http.Error(w, "service "+only.String()+" is not held", http.StatusNotFound)
			return
		}
		// Values are immutable: they are encoded outside the lock.
		slices.SortFunc(d.Services, func(a, b *model.ServiceEndpoints) int { return a.Service.Key().Compare(b.Service.Key()) })
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(d)
	})
}

// MetricsMux serves MetricsHandler on /metrics: what
// --metrics-bind-address serves. The debug endpoint is not in it: it
// lists every service and endpoint the backend holds, and is served only
// where asked (--debug-bind-address, client.Flags.DebugBindAddress).
func (r *Recorder) MetricsMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", r.MetricsHandler())
	return mux
}
