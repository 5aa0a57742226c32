//go:build linux

package netns

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

// RequireEnv is the environment variable that turns the skips of
// RequirePrivileged and RequireCommands into failures when set to "1". CI
// sets it, so that privileged tests cannot silently stop running.
const RequireEnv = "KPNG_REQUIRE_PRIVILEGED"

var (
	probeOnce sync.Once
	probeErr  error
)

// RequirePrivileged skips t, with the reason, unless the process can create
// network namespaces: it must run as root, have the ip command and be
// allowed to add a namespace (a container without CAP_SYS_ADMIN is not). The
// probe runs once per process. With KPNG_REQUIRE_PRIVILEGED=1 in the
// environment it fails t instead of skipping it. Under -short (make unit)
// it skips t whatever the privileges: real-traffic tests are integration
// tests.
func RequirePrivileged(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("real traffic in network namespaces: not run with -short (make test runs it)")
	}
	probeOnce.Do(func() { probeErr = probe(os.Geteuid()) })
	require(t, probeErr, os.Getenv(RequireEnv))
}

// RequireCommands skips t (fails it with KPNG_REQUIRE_PRIVILEGED=1) unless
// every named command is in $PATH.
func RequireCommands(t testing.TB, names ...string) {
	t.Helper()
	var missing []string
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			missing = append(missing, n)
		}
	}
	var err error
	if len(missing) > 0 {
		err = fmt.Errorf("missing commands: %s (apt-get install iproute2 iptables nftables conntrack jq)", strings.Join(missing, ", "))
	}
	require(t, err, os.Getenv(RequireEnv))
}

// probe says why network namespaces cannot be used, or returns nil.
func probe(euid int) error {
	if euid != 0 {
		return fmt.Errorf("not root (euid %d)", euid)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("no ip command (apt-get install iproute2): %w", err)
	}
	name := fmt.Sprintf("%s%d-probe", Prefix, os.Getpid())
	out, err := exec.Command("ip", "netns", "add", name).CombinedOutput()
	if err != nil {
		return fmt.Errorf("cannot create a network namespace: ip netns add: %v: %s", err, bytes.TrimSpace(out))
	}
	if out, err := exec.Command("ip", "netns", "delete", name).CombinedOutput(); err != nil {
		return fmt.Errorf("cannot delete network namespace %s: %v: %s", name, err, bytes.TrimSpace(out))
	}
	return nil
}

// skipper is the part of testing.TB that require uses.
type skipper interface {
	Helper()
	Skipf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// require skips t when err is not nil, or fails it when env is "1".
func require(t skipper, err error, env string) {
	t.Helper()
	if err == nil {
		return
	}
	if env == "1" {
		t.Fatalf("privileged test cannot run: %v (%s=1 forbids skipping)", err, RequireEnv)
		return
	}
	t.Skipf("privileged test skipped: %v (needs root and network namespaces; set %s=1 to fail instead)", err, RequireEnv)
}
