//go:build linux

package server_test

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/kpng/api/server"
	"sigs.k8s.io/kpng/client/remote"
	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/model"
)

// nobody is the uid of another user.
const nobody = 65534

// TestUnixSocketPathChecks: a controller does not take a socket path from
// another controller serving on it (which keeps serving), nor a socket
// that belongs to another user, nor serves from a directory that belongs
// to another user or that others can write to, nor from one inside such
// a directory (as written, or through a symbolic link); each is refused
// with an error saying why, and nothing is removed. (root, for chown.)
func TestUnixSocketPathChecks(t *testing.T) {
	netns.RequirePrivileged(t)
	addr := socketAddr(t)
	first := startServer(t, server.ListenConfig{Address: addr}, 0)
	first.feed([]*model.ServiceEndpoints{svc("ns", "a", ep("10.0.0.1", "node-a"))})
	if _, _, err := (server.ListenConfig{Address: addr}).Listen(); err == nil || !strings.Contains(err.Error(), "another process is serving on this socket") {
		t.Errorf("a second controller on a live socket: %v, want it refused", err)
	}
	r := runClient(t, remote.Config{Address: addr, NodeName: "node-a"})
	r.WaitSyncs(t, 1, 20*time.Second)

	// Another user's socket, nobody listening.
	dir := t.TempDir()
	theirs := filepath.Join(dir, "theirs.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: theirs, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	if err := os.Chown(theirs, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	if _, _, err := (server.ListenConfig{Address: "unix://" + theirs}).Listen(); err == nil || !strings.Contains(err.Error(), "belongs to uid 65534") {
		t.Errorf("another user's socket: %v, want it refused", err)
	}
	if _, err := os.Lstat(theirs); err != nil {
		t.Errorf("another user's socket was removed: %v", err)
	}

	// Another user's directory; a directory anyone can write to.
	for _, tc := range []struct {
		what  string
		setup func(dir string) error
		want  string
	}{
		{"another user's directory", func(dir string) error { return os.Chown(dir, nobody, nobody) }, "belongs to uid 65534"},
		{"a directory writable by others", func(dir string) error { return os.Chmod(dir, 0o777) }, "writable by others"},
	} {
		dir := filepath.Join(t.TempDir(), "run")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := tc.setup(dir); err != nil {
			t.Fatal(err)
		}
		if _, _, err := (server.ListenConfig{Address: "unix://" + filepath.Join(dir, "kpng.sock")}).Listen(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.what, err, tc.want)
		}
	}
	// A directory above the socket's that another user owns, or that
	// others can write to (not sticky): they could rename the socket's
	// directory away and put theirs in its place. As written, and through
	// a symbolic link.
	for _, tc := range []struct {
		what string
		// setup prepares base and returns the socket's directory and
		// the directory the error must name.
		setup func(base string) (sockDir, bad string, err error)
		want  string
	}{
		{"a root directory inside a directory writable by others", func(base string) (string, string, error) {
			return filepath.Join(base, "run"), base, os.Chmod(base, 0o777)
		}, "writable by others"},
		{"a root directory inside another user's", func(base string) (string, string, error) {
			return filepath.Join(base, "run"), base, os.Chown(base, nobody, nobody)
		}, "belongs to uid 65534"},
		{"a link in a directory writable by others", func(base string) (string, string, error) {
			open := filepath.Join(base, "open")
			if err := os.Mkdir(open, 0o777); err != nil {
				return "", "", err
			}
			if err := os.Chmod(open, 0o777); err != nil {
				return "", "", err
			}
			return filepath.Join(open, "link"), open, os.Symlink(filepath.Join(base, "run"), filepath.Join(open, "link"))
		}, "writable by others"},
		{"a link to a directory inside one writable by others", func(base string) (string, string, error) {
			open := filepath.Join(base, "open")
			if err := os.Mkdir(open, 0o777); err != nil {
				return "", "", err
			}
			if err := os.Chmod(open, 0o777); err != nil {
				return "", "", err
			}
			if err := os.Mkdir(filepath.Join(open, "run"), 0o755); err != nil {
				return "", "", err
			}
			return filepath.Join(base, "link"), open, os.Symlink(filepath.Join(open, "run"), filepath.Join(base, "link"))
		}, "writable by others"},
	} {
		base := filepath.Join(t.TempDir(), "base")
		if err := os.Mkdir(base, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(filepath.Join(base, "run"), 0o755); err != nil {
			t.Fatal(err)
		}
		sockDir, bad, err := tc.setup(base)
		if err != nil {
			t.Fatal(err)
		}
		_, _, err = (server.ListenConfig{Address: "unix://" + filepath.Join(sockDir, "kpng.sock")}).Listen()
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "directory "+bad+" ") {
			t.Errorf("%s: %v, want %q naming %s", tc.what, err, tc.want, bad)
		}
	}
	// /tmp is writable by all, but sticky: fine.
	tmp := filepath.Join(os.TempDir(), "kpng-test-"+filepath.Base(t.TempDir())+".sock")
	l2, _, err := (server.ListenConfig{Address: "unix://" + tmp}).Listen()
	if err != nil {
		t.Errorf("a socket in %s (sticky): %v", os.TempDir(), err)
	} else {
		l2.Close()
	}
}
