//go:build linux

package netns

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// Prefix starts the name of every namespace New creates: the default
// prefix. NewWithPrefix takes another.
const Prefix = "kpngt-"

// RunDir is where `ip netns` keeps the bind mounts of named namespaces.
const RunDir = "/run/netns"

// NS is a named network namespace created by New. It is deleted when the
// test that created it ends.
type NS struct {
	// Name is the namespace's name, as `ip netns list` shows it.
	Name string
	t    testing.TB
}

var (
	seq   atomic.Int64
	swept sync.Map // prefix → *sync.Once: its leftovers were removed
)

// CheckPrefix says why prefix cannot start the names of namespaces, or
// returns nil. A prefix is lowercase words of letters separated by single
// dashes, and ends with a dash ("kpngt-", "ci-job-"): no digits, so that
// the names of one prefix (prefix, then the creating process's id) are
// never read as another's, even when one prefix starts another.
func CheckPrefix(prefix string) error {
	words, ok := strings.CutSuffix(prefix, "-")
	if !ok || words == "" {
		return fmt.Errorf("namespace prefix %q: must end with a dash", prefix)
	}
	for _, w := range strings.Split(words, "-") {
		if w == "" {
			return fmt.Errorf("namespace prefix %q: empty word (two dashes, or a leading dash)", prefix)
		}
		for _, r := range w {
			if r < 'a' || r > 'z' {
				return fmt.Errorf("namespace prefix %q: %q is not a lowercase letter (letters and single dashes only)", prefix, r)
			}
		}
	}
	return nil
}

// New creates a uniquely named network namespace for t, with its loopback
// interface up, IPv6 duplicate address detection off for the interfaces
// created in it later (so that addresses are usable at once), and ICMP
// redirects neither sent nor accepted (a node forwarding a packet back out of
// the interface it came in on would otherwise teach the client a route that
// bypasses it). It is deleted by t.Cleanup. label (letters, digits and '-')
// ends the name, to make it recognisable. The name starts with Prefix: New
// is NewWithPrefix(t, Prefix, label).
func New(t testing.TB, label string) *NS {
	t.Helper()
	return NewWithPrefix(t, Prefix, label)
}

// NewWithPrefix is New with the name starting with prefix (see
// CheckPrefix) instead of Prefix: the name is
// <prefix><pid>-<n>-<label>, pid being the creating process's id.
//
// The first call in a process for a prefix also deletes the namespaces of
// that prefix whose creating process no longer runs (the leftovers of a
// test binary killed before its cleanups ran), and only those: the
// namespaces of other prefixes are never touched. On a host shared with
// other users, who may run tests in other PID namespaces (whose processes
// this one cannot see), give each user or job a prefix of its own.
func NewWithPrefix(t testing.TB, prefix, label string) *NS {
	t.Helper()
	if err := CheckPrefix(prefix); err != nil {
		t.Fatal(err)
	}
	once, _ := swept.LoadOrStore(prefix, new(sync.Once))
	once.(*sync.Once).Do(func() { sweepStale(prefix) })
	name := fmt.Sprintf("%s%d-%d-%s", prefix, os.Getpid(), seq.Add(1), label)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, bytes.TrimSpace(out))
	}
	n := &NS{Name: name, t: t}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "delete", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns delete %s: %v: %s", name, err, bytes.TrimSpace(out))
		}
	})
	n.IP("link", "set", "lo", "up")
	for _, kv := range [][2]string{
		{"net.ipv6.conf.default.accept_dad", "0"},
		{"net.ipv6.conf.all.accept_dad", "0"},
		{"net.ipv4.conf.all.send_redirects", "0"},
		{"net.ipv4.conf.default.send_redirects", "0"},
		{"net.ipv4.conf.all.accept_redirects", "0"},
		{"net.ipv4.conf.default.accept_redirects", "0"},
		{"net.ipv6.conf.all.accept_redirects", "0"},
		{"net.ipv6.conf.default.accept_redirects", "0"},
	} {
		n.Sysctl(kv[0], kv[1])
	}
	return n
}

// sweepStale deletes the namespaces named <prefix><pid>-<n>-... whose
// process no longer exists: the leftovers of a test binary that was killed
// before its cleanups ran.
func sweepStale(prefix string) {
	entries, err := os.ReadDir(RunDir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if pid, ok := creator(e.Name(), prefix); ok && !running(pid) {
			_ = exec.Command("ip", "netns", "delete", e.Name()).Run()
		}
	}
}

// creator returns the id of the process that created the namespace name,
// if name is <prefix><pid>-<n>-<label> (as NewWithPrefix names them).
func creator(name, prefix string) (int, bool) {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return 0, false
	}
	fields := strings.SplitN(rest, "-", 3)
	if len(fields) != 3 || fields[2] == "" {
		return 0, false
	}
	pid, err := strconv.Atoi(fields[0])
	if err != nil || pid <= 0 || fields[0] != strconv.Itoa(pid) {
		return 0, false
	}
	if n, err := strconv.Atoi(fields[1]); err != nil || n <= 0 {
		return 0, false
	}
	return pid, true
}

// running says whether process pid exists (this process counts).
func running(pid int) bool {
	if pid == os.Getpid() {
		return true
	}
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}

// Path returns the namespace's bind mount, which can be opened to get a file
// descriptor for setns(2) or for netlink libraries (nftables.WithNetNSFd,
// netlink.NewHandleAt).
func (n *NS) Path() string { return filepath.Join(RunDir, n.Name) }

// String returns the namespace's name.
func (n *NS) String() string { return n.Name }

// Exec runs name with args inside the namespace (`ip netns exec`), with
// stdin as its standard input (nil for none), and returns its standard
// output and standard error. The error says which command failed and
// includes its standard error.
func (n *NS) Exec(stdin []byte, name string, args ...string) (stdout, stderr string, err error) {
	cmd := exec.Command("ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	if err != nil {
		err = fmt.Errorf("in %s: %s %s: %w: %s", n.Name, name, strings.Join(args, " "), err, strings.TrimSpace(e.String()))
	}
	return o.String(), e.String(), err
}

// MustExec is Exec without standard input that fails the test on error and
// returns the standard output.
func (n *NS) MustExec(name string, args ...string) string {
	n.t.Helper()
	out, _, err := n.Exec(nil, name, args...)
	if err != nil {
		n.t.Fatal(err)
	}
	return out
}

// IP runs `ip -n NS args...` and fails the test on error.
func (n *NS) IP(args ...string) string {
	n.t.Helper()
	out, err := exec.Command("ip", append([]string{"-n", n.Name}, args...)...).CombinedOutput()
	if err != nil {
		n.t.Fatalf("ip -n %s %s: %v: %s", n.Name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return string(out)
}

// Sysctl sets a sysctl of the namespace, e.g. Sysctl("net.ipv4.ip_forward",
// "1"), and fails the test on error. Network sysctls are per namespace.
func (n *NS) Sysctl(key, value string) {
	n.t.Helper()
	n.MustExec("sysctl", "-q", "-w", key+"="+value)
}

// EnableForwarding turns IPv4 and IPv6 forwarding on, making the namespace a
// router.
func (n *NS) EnableForwarding() {
	n.t.Helper()
	n.Sysctl("net.ipv4.ip_forward", "1")
	n.Sysctl("net.ipv6.conf.all.forwarding", "1")
}

// AddAddr adds an address in CIDR form (e.g. "10.0.0.1/24", "fd00::1/64")
// to dev. IPv6 addresses are added with nodad: usable at once.
func (n *NS) AddAddr(dev, cidr string) {
	n.t.Helper()
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		n.t.Fatalf("AddAddr %s: %v", cidr, err)
	}
	args := []string{"addr", "add", cidr, "dev", dev}
	if p.Addr().Is6() {
		args = append([]string{"-6"}, append(args, "nodad")...)
	}
	n.IP(args...)
}

// AddRoute adds a route: `ip route add ARGS...`, e.g. AddRoute("default",
// "via", "10.0.0.2"). The family is inferred by ip from the addresses.
func (n *NS) AddRoute(args ...string) {
	n.t.Helper()
	fam := "-4"
	for _, a := range args {
		if strings.Contains(a, ":") {
			fam = "-6"
		}
	}
	n.IP(append([]string{fam, "route", "add"}, args...)...)
}

// Veth creates a veth pair with one end, aDev, in a and the other, bDev, in
// b, and sets both up. Deleting either namespace deletes the pair.
func Veth(t testing.TB, a *NS, aDev string, b *NS, bDev string) {
	t.Helper()
	a.IP("link", "add", aDev, "type", "veth", "peer", "name", bDev, "netns", b.Name)
	a.IP("link", "set", aDev, "up")
	b.IP("link", "set", bDev, "up")
}

// Do runs fn on an OS thread switched into the namespace and returns fn's
// error. Sockets created by fn stay in the namespace after Do returns and can
// be used from any goroutine. fn must not start goroutines that need to be in
// the namespace: they run on other threads.
//
// The thread is switched back before Do returns; if that fails, the thread is
// left locked, so that the Go runtime discards it rather than reuse it in the
// wrong namespace.
func (n *NS) Do(fn func() error) error {
	_, err := RunIn(n.Path(), func() (struct{}, error) { return struct{}{}, fn() })
	return err
}

// RunIn is Do for the network namespace at path (a /run/netns entry or any
// namespace file), returning fn's value too: for programs that have a
// namespace's path rather than an NS.
func RunIn[T any](path string, fn func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		var zero T
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{zero, fmt.Errorf("open current network namespace: %w", err)}
			return
		}
		defer orig.Close()
		target, err := os.Open(path)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{zero, fmt.Errorf("open network namespace %s: %w", path, err)}
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{zero, fmt.Errorf("enter network namespace %s: %w", path, err)}
			return
		}
		v, fnErr := fn()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			// Stay locked: the thread dies with this goroutine.
			ch <- result{v, errors.Join(fnErr, fmt.Errorf("return from network namespace %s: %w", path, err))}
			return
		}
		runtime.UnlockOSThread()
		ch <- result{v, fnErr}
	}()
	r := <-ch
	return r.v, r.err
}

// Forward copies each connection accepted by l to a new TCP connection to
// addr, both ways, until l is closed: for example a listener made in a
// namespace with RunIn, forwarding to a server outside it.
func Forward(l net.Listener, addr string) {
	for {
		in, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer in.Close()
			out, err := net.Dial("tcp", addr)
			if err != nil {
				return
			}
			defer out.Close()
			done := make(chan struct{}, 2)
			go func() { _, _ = io.Copy(out, in); done <- struct{}{} }()
			go func() { _, _ = io.Copy(in, out); done <- struct{}{} }()
			<-done
		}()
	}
}
