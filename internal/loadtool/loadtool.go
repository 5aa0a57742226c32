// Package loadtool is what the measuring tools of hack/cmd share: a
// working directory, the test control plane built from
// $KPNG_CONTROLPLANE_DIR, and an API client fast enough to load thousands
// of objects.
package loadtool

import (
	"fmt"
	"os"

	"k8s.io/client-go/kubernetes"

	"sigs.k8s.io/kpng/internal/controlplane"
)

// Env is a running control plane with a client and a working directory.
type Env struct {
	// Dir is the working directory: the one given, or a temporary one
	// removed by Close.
	Dir string
	// CP is the control plane; Client talks to it at 2,000 requests a
	// second (client-go's default of 50 would take minutes to load
	// 20,000 objects).
	CP     *controlplane.ControlPlane
	Client kubernetes.Interface

	removeDir bool
}

// Start makes the working directory (dir, or a temporary one named after
// prefix when empty) and starts the control plane. script names what
// sets $KPNG_CONTROLPLANE_DIR, for the error when it is not set; logf
// says what it does.
func Start(script, prefix, dir string, logf func(format string, args ...any)) (*Env, error) {
	bin := os.Getenv("KPNG_CONTROLPLANE_DIR")
	if bin == "" {
		return nil, fmt.Errorf("KPNG_CONTROLPLANE_DIR is not set (%s sets it)", script)
	}
	e := &Env{Dir: dir}
	if dir == "" {
		d, err := os.MkdirTemp("", prefix)
		if err != nil {
			return nil, fmt.Errorf("working directory: %w", err)
		}
		e.Dir, e.removeDir = d, true
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("--dir: %w", err)
	}
	logf("starting the control plane")
	cp, err := controlplane.Start(controlplane.WithBinaryDir(bin))
	if err != nil {
		e.Close()
		return nil, fmt.Errorf("control plane: %w", err)
	}
	e.CP = cp
	rc := cp.RESTConfig()
	rc.QPS, rc.Burst = 2000, 4000
	if e.Client, err = kubernetes.NewForConfig(rc); err != nil {
		e.Close()
		return nil, fmt.Errorf("API client: %w", err)
	}
	return e, nil
}

// Close stops the control plane and removes a temporary directory.
func (e *Env) Close() {
	if e.CP != nil {
		_ = e.CP.Stop()
	}
	if e.removeDir {
		_ = os.RemoveAll(e.Dir)
	}
}
