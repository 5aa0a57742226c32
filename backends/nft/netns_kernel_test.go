//go:build linux

package nft

import (
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"sigs.k8s.io/kpng/internal/netns"
)

// TestConnInNetNSRefusesAClosedNamespace checks that ConnInNetNS refuses a
// descriptor that is no longer a network namespace (closed, then another
// file's) instead of connecting in the current namespace.
func TestConnInNetNSRefusesAClosedNamespace(t *testing.T) {
	netns.RequirePrivileged(t)
	fd := freshNetNS(t)
	newConn := ConnInNetNS(fd)
	if _, err := newConn(); err != nil {
		t.Fatalf("an open namespace: %v", err)
	}
	unix.Close(fd)
	if _, err := newConn(); err == nil || !strings.Contains(err.Error(), "not an open network namespace") {
		t.Errorf("a closed descriptor: %v, want an error", err)
	}
	f, err := os.Open(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := ConnInNetNS(int(f.Fd()))(); err == nil {
		t.Errorf("a regular file: no error")
	}
}
