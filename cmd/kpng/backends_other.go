//go:build !linux

package main

import "sigs.k8s.io/kpng/cmd/kpng/app"

// platformBackends are the backends only some systems have: none here.
func platformBackends() []app.Backend { return nil }
