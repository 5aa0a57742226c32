package app

import (
	"context"
	"fmt"
	"net/http"
	"net/http/pprof"

	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/client/metrics"
)

// profilingMux serves Go's profiles (net/http/pprof) under /debug/pprof/:
// what --profiling-bind-address serves. Its requests are bounded by the
// server's 30 s write timeout, so a CPU profile is at most about 25 s
// (/debug/pprof/profile?seconds=25).
func profilingMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// serveProfiling serves profilingMux on addr until ctx ends; an empty addr
// serves nothing.
func serveProfiling(ctx context.Context, addr string) error {
	if addr == "" {
		return nil
	}
	if _, err := metrics.Serve(ctx, addr, profilingMux()); err != nil {
		return fmt.Errorf("--profiling-bind-address=%s: %w", addr, err)
	}
	klog.FromContext(ctx).Info("Serving", "flag", "--profiling-bind-address", "address", addr)
	return nil
}
