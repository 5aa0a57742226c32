//go:build !linux

package main

import (
	"context"
	"net/netip"

	"sigs.k8s.io/kpng/backends/healthcheck"
	"sigs.k8s.io/kpng/cmd/kpng/app"
)

// platformBackends are the backends of this system: userspace.
func platformBackends() []app.Backend { return []app.Backend{userspaceBackend()} }

// healthCheckConfig returns the health check server's configuration: it
// listens on the addresses nodePortAddrs selects, in the current network
// namespace; a path fails: network namespaces are Linux's.
func healthCheckConfig(_ context.Context, path string, nodePortAddrs []netip.Prefix) (healthcheck.Config, error) {
	if path != "" {
		return healthcheck.Config{}, app.Usagef("--netns %q: network namespaces exist on Linux only", path)
	}
	return healthcheck.Config{NodePortAddresses: nodePortAddrs}, nil
}
