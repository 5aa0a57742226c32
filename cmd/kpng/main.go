// Command kpng is the kpng controller: it takes the state of the services
// of one service-proxy-name from an input (the Kubernetes API server, a
// file, another controller) to an output (backends over gRPC, a file, an
// in-process backend). Run "kpng --help".
package main

import (
	"os"

	"sigs.k8s.io/kpng/cmd/kpng/app"
)

func main() {
	// The in-process backends "to-local" can run: add yours here (and in
	// backends_linux.go for Linux-only ones).
	backends := append([]app.Backend{
		app.JSONBackend(os.Stdout),
	}, platformBackends()...)
	os.Exit(app.Main(os.Args[1:], os.Stdout, os.Stderr, backends...))
}
