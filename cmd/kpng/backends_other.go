//go:build !linux

package main

import (
	"context"
	"net"

	"sigs.k8s.io/kpng/cmd/kpng/app"
)

// platformBackends are the backends of this system: userspace.
func platformBackends() []app.Backend { return []app.Backend{userspaceBackend()} }

// netnsListen fails for a path: network namespaces are Linux's.
func netnsListen(_ context.Context, path string) (func(network, address string) (net.Listener, error), error) {
	if path == "" {
		return nil, nil
	}
	return nil, app.Usagef("--netns %q: network namespaces exist on Linux only", path)
}
