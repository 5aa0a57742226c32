package controlplane

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"
)

// Main runs the tests of a package against one control plane, for use as
// the package's TestMain:
//
//	var cp *controlplane.ControlPlane
//
//	func TestMain(m *testing.M) { controlplane.Main(m, &cp, opts...) }
//
// It builds or locates the binaries (see Binaries), starts the control
// plane, stores it in *cp, runs the tests, stops the control plane and exits
// with the tests' status. With -v it reports start-up and restart times on
// stderr.
//
// If the control plane cannot be started, Main prints why and exits with
// status 1: the tests fail rather than skip. With -short (make unit),
// Main starts nothing and leaves *cp nil: the tests that need the control
// plane call cp.Require first, which skips them. SIGINT and SIGTERM stop the
// control plane before exiting.
//
// A cold build of kube-apiserver takes minutes and counts against go test's
// overall limit (-timeout plus one minute), so on a fresh machine run
// hack/build-controlplane.sh once first, or raise -timeout.
func Main(m *testing.M, cp **ControlPlane, opts ...Option) {
	os.Exit(run(m, cp, opts))
}

func run(m *testing.M, cp **ControlPlane, opts []Option) int {
	if !flag.Parsed() {
		flag.Parse()
	}
	if testing.Short() {
		// make unit: nothing is built or started; the tests that need
		// the control plane skip (Require).
		*cp = nil
		return m.Run()
	}
	logf := func(format string, args ...any) {
		if testing.Verbose() {
			fmt.Fprintf(os.Stderr, format+"\n", args...)
		}
	}
	started, err := Start(append([]Option{WithLogf(logf)}, opts...)...)
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: cannot start the test control plane (etcd + kube-apiserver): %v\n", err)
		return 1
	}
	*cp = started

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		sig, ok := <-signals
		if !ok {
			return
		}
		fmt.Fprintf(os.Stderr, "controlplane: %v: stopping the control plane\n", sig)
		if err := started.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "controlplane: %v\n", err)
		}
		os.Exit(1)
	}()

	code := m.Run()

	signal.Stop(signals)
	close(signals)
	if err := started.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: stopping the test control plane: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// Require skips the test when there is no control plane: under -short,
// where Main starts none. Call it first in every test that uses one (a
// nil *ControlPlane is valid here).
func (c *ControlPlane) Require(tb testing.TB) {
	tb.Helper()
	if c == nil {
		tb.Skip("needs the test control plane (etcd + kube-apiserver), which -short does not start: run make test")
	}
}

// SkipIfShort skips a test that starts a control plane of its own, under
// -short (make unit), which builds and starts none.
func SkipIfShort(tb testing.TB) {
	tb.Helper()
	if testing.Short() {
		tb.Skip("starts a test control plane (etcd + kube-apiserver), which -short does not: run make test")
	}
}
