package metrics

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// health is the body of /healthz and /livez, in kube-proxy's shape
// (without its per-IP-family status: kpng's rounds are not per family).
type health struct {
	// LastUpdated is, as in kube-proxy, the current time while healthy
	// (older clients read it as "the proxier ran recently"), and the last
	// successful sync otherwise.
	LastUpdated time.Time `json:"lastUpdated"`
	CurrentTime time.Time `json:"currentTime"`
	// NodeEligible is in /healthz answers only, when the node is checked.
	NodeEligible *bool `json:"nodeEligible,omitempty"`
	// Healthy says whether the rounds are applied in time (the node's
	// eligibility aside).
	Healthy bool `json:"healthy"`
}

// HealthHandler serves /healthz and /livez with kube-proxy's semantics
// (KEP-3836) and JSON body: /livez answers 200 while Healthy, 503
// otherwise; /healthz also answers 503 when the node is not eligible
// (SetNodeEligible).
func (r *Recorder) HealthHandler() http.Handler {
	mux := http.NewServeMux()
	for path, counter := range map[string]*prometheus.CounterVec{"/healthz": r.healthz, "/livez": r.livez} {
		withNode := path == "/healthz"
		mux.HandleFunc(path, func(w http.ResponseWriter, _ *http.Request) {
			r.mu.Lock()
			b := health{LastUpdated: r.lastSynced, CurrentTime: r.now(), Healthy: r.healthyLocked()}
			ok := b.Healthy
			if withNode && r.nodeEligible != nil {
				eligible := *r.nodeEligible
				b.NodeEligible = &eligible
				ok = ok && eligible
			}
			r.mu.Unlock()
			code := http.StatusOK
			if !ok {
				code = http.StatusServiceUnavailable
			}
			if b.Healthy {
				b.LastUpdated = b.CurrentTime
			}
			counter.WithLabelValues(strconv.Itoa(code)).Inc()
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.WriteHeader(code)
			_ = json.NewEncoder(w).Encode(b)
		})
	}
	return mux
}
