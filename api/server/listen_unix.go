//go:build unix

package server

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// listenUnix listens on the unix socket path, created with mode 0600. Its
// directory is created 0755 if missing; it and every directory above it
// must belong to this process's user or to root and must not be writable
// by others (unless sticky, as /tmp): whoever can write to one could
// replace the socket. An existing file at path is replaced only when it is a socket
// of this process's user that nobody listens on (a previous run's): a
// live socket is another controller's, and another user's is not ours to
// remove.
func listenUnix(path string) (net.Listener, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("listen unix:%s: %w", path, err)
	}
	if err := checkDir(dir); err != nil {
		return nil, fmt.Errorf("listen unix:%s: %w", path, err)
	}
	if err := removeStale(path); err != nil {
		return nil, fmt.Errorf("listen unix:%s: %w", path, err)
	}
	// The umask makes the socket 0600 from its creation: no window where
	// another user could connect.
	old := syscall.Umask(0o177)
	l, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listen unix:%s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("listen unix:%s: %w", path, err)
	}
	return l, nil
}

// checkDir checks the socket's directory and every directory above it,
// as written and with its symbolic links resolved: each must belong to
// this process's user or to root, and nobody else may write to it (but
// for a sticky directory, where only a file's owner may remove or rename
// it). Whoever can rename an entry of any of them could put a directory
// of theirs in the socket's path.
func checkDir(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	resolved, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return err
	}
	for _, path := range []string{abs, resolved} {
		for d := path; ; d = filepath.Dir(d) {
			if err := checkOneDir(d); err != nil {
				return err
			}
			if d == filepath.Dir(d) {
				break
			}
		}
	}
	return nil
}

// checkOneDir checks that dir belongs to this process's user or to root,
// and that nobody else can write to it unless it is sticky.
func checkOneDir(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	if uid := int(st.Uid); uid != os.Geteuid() && uid != 0 {
		return fmt.Errorf("directory %s belongs to uid %d, not to this process's (%d) or root: refusing to serve from it", dir, uid, os.Geteuid())
	}
	if fi.Mode().Perm()&0o022 != 0 && fi.Mode()&fs.ModeSticky == 0 {
		return fmt.Errorf("directory %s is writable by others (mode %v): anyone could replace the socket", dir, fi.Mode().Perm())
	}
	return nil
}

// removeStale removes a previous run's socket at path, and refuses any
// other file there.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return errors.New("file exists and is not a socket")
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("the socket there belongs to uid %d, not to this process's (%d): refusing to replace it", st.Uid, os.Geteuid())
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return errors.New("another process is serving on this socket (a controller already running?)")
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	return nil
}
