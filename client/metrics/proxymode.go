package metrics

import (
	"net/http"
)

// SetProxyMode names how the backend fed by this Recorder implements
// services, for /proxyMode on the metrics address: kube-proxy's word for
// the same mechanism ("nftables", "iptables"; "userspace" for kpng's
// userspace proxier). Tools and Kubernetes' e2e tests ask a node's
// proxier for it on 127.0.0.1:10249, as they ask kube-proxy.
func (r *Recorder) SetProxyMode(mode string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.proxyMode = mode
}

// ProxyModeHandler serves /proxyMode: the mode SetProxyMode gave, as
// plain text (kube-proxy's answer), or 404 when the backend gave none (a
// controller's, or a program's that does not say).
func (r *Recorder) ProxyModeHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		mode := r.proxyMode
		r.mu.Unlock()
		if mode == "" {
			http.Error(w, "no proxy mode: this kpng runs no proxier backend", http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = w.Write([]byte(mode))
	})
}
