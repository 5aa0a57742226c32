//go:build linux

package netns

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fakeT records what require does.
type fakeT struct{ skipped, failed string }

func (f *fakeT) Helper()                           {}
func (f *fakeT) Skipf(format string, args ...any)  { f.skipped = fmt.Sprintf(format, args...) }
func (f *fakeT) Fatalf(format string, args ...any) { f.failed = fmt.Sprintf(format, args...) }

func TestRequireDecision(t *testing.T) {
	cause := errors.New("not root (euid 1000)")
	for _, tc := range []struct {
		name       string
		err        error
		env        string
		skip, fail bool
	}{
		{"privileged", nil, "", false, false},
		{"privileged, required", nil, "1", false, false},
		{"unprivileged skips", cause, "", true, false},
		{"unprivileged, env 0 skips", cause, "0", true, false},
		{"unprivileged, required fails", cause, "1", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f fakeT
			require(&f, tc.err, tc.env)
			if (f.skipped != "") != tc.skip || (f.failed != "") != tc.fail {
				t.Fatalf("skipped %q, failed %q; want skip %v, fail %v", f.skipped, f.failed, tc.skip, tc.fail)
			}
			for _, msg := range []string{f.skipped, f.failed} {
				if msg != "" && (!strings.Contains(msg, cause.Error()) || !strings.Contains(msg, RequireEnv)) {
					t.Errorf("message %q should give the cause and name %s", msg, RequireEnv)
				}
			}
		})
	}
}

func TestProbeNotRoot(t *testing.T) {
	if err := probe(1000); err == nil || !strings.Contains(err.Error(), "not root") {
		t.Fatalf("probe(1000) = %v, want a not-root error", err)
	}
}

func TestParseAnswer(t *testing.T) {
	want := Answer{Server: "pod", Network: "udp",
		Local:  netip.MustParseAddrPort("[1100::202]:7000"),
		Remote: netip.MustParseAddrPort("10.0.0.1:40000")}
	got, err := ParseAnswer(want.String() + "\n")
	if err != nil || got != want {
		t.Fatalf("ParseAnswer(%q) = %+v, %v; want %+v", want.String(), got, err, want)
	}
	for _, bad := range []string{"", "id=pod", "id=pod net=tcp local=x remote=1.2.3.4:5", "a b c d"} {
		if _, err := ParseAnswer(bad); err == nil {
			t.Errorf("ParseAnswer(%q) succeeded", bad)
		}
	}
}

// TestNamespaceLifecycle checks names, and that a namespace is gone after
// the test that created it.
func TestNamespaceLifecycle(t *testing.T) {
	RequirePrivileged(t)
	var names []string
	t.Run("create", func(t *testing.T) {
		a, b := New(t, "a"), New(t, "b")
		names = []string{a.Name, b.Name}
		if a.Name == b.Name {
			t.Fatalf("two namespaces named %s", a.Name)
		}
		for _, n := range []*NS{a, b} {
			if !strings.HasPrefix(n.Name, Prefix) {
				t.Errorf("%s lacks prefix %s", n.Name, Prefix)
			}
			if _, err := os.Stat(n.Path()); err != nil {
				t.Errorf("namespace %s: %v", n.Name, err)
			}
		}
		Veth(t, a, "x0", b, "y0")
		a.AddAddr("x0", "192.168.7.1/24")
		if out := b.IP("link", "show", "y0"); !strings.Contains(out, "y0") {
			t.Errorf("peer not in %s: %s", b.Name, out)
		}
	})
	for _, n := range names {
		if _, err := os.Stat(RunDir + "/" + n); !os.IsNotExist(err) {
			t.Errorf("namespace %s still exists after its test (stat: %v)", n, err)
		}
	}
}

// TestDoRestoresNamespace checks that Do runs in the namespace and leaves
// the calling goroutine where it was.
func TestDoRestoresNamespace(t *testing.T) {
	RequirePrivileged(t)
	n := New(t, "do")
	self := func() (string, error) { return os.Readlink("/proc/thread-self/ns/net") }
	before, err := self()
	if err != nil {
		t.Fatal(err)
	}
	var inside string
	if err := n.Do(func() error {
		var err error
		inside, err = self()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(n.Path())
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("net:[%d]", fi.Sys().(*syscall.Stat_t).Ino); inside != want {
		t.Fatalf("Do ran in %s, want %s (%s; caller in %s)", inside, want, n.Name, before)
	}
	want := errors.New("boom")
	if err := n.Do(func() error { return want }); !errors.Is(err, want) {
		t.Errorf("Do did not return fn's error: %v", err)
	}
	// Many goroutines: none must be left in the namespace.
	for range 50 {
		if now, err := self(); err != nil || now != before {
			t.Fatalf("after Do, thread in %s (%v), want %s", now, err, before)
		}
		_ = n.Do(func() error { return nil })
	}
}

// TestRunInAndForward: a listener made in a namespace with RunIn stays
// there (it answers a connection from inside the namespace, where the
// caller's loopback is not), and Forward carries that connection to a
// server outside, both ways.
func TestRunInAndForward(t *testing.T) {
	RequirePrivileged(t)
	n := New(t, "fwd")
	n.IP("link", "set", "lo", "up")
	server, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	go func() {
		for {
			c, err := server.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	inside, err := RunIn(n.Path(), func() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") })
	if err != nil {
		t.Fatal(err)
	}
	defer inside.Close()
	go Forward(inside, server.Addr().String())
	// From the host, the namespace's listener is not reachable.
	if c, err := net.DialTimeout("tcp", inside.Addr().String(), time.Second); err == nil {
		c.Close()
		t.Fatalf("the listener made with RunIn answered outside the namespace %s", n.Name)
	}
	got, err := RunIn(n.Path(), func() (string, error) {
		c, err := net.DialTimeout("tcp", inside.Addr().String(), 5*time.Second)
		if err != nil {
			return "", err
		}
		defer c.Close()
		if _, err := c.Write([]byte("ping\n")); err != nil {
			return "", err
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 5)
		_, err = io.ReadFull(c, buf)
		return string(buf), err
	})
	if err != nil || got != "ping\n" {
		t.Fatalf("through Forward from inside %s: %q, %v; want the echo", n.Name, got, err)
	}
	want := errors.New("boom")
	if _, err := RunIn(n.Path(), func() (int, error) { return 0, want }); !errors.Is(err, want) {
		t.Errorf("RunIn did not return fn's error: %v", err)
	}
	if _, err := RunIn("/nonexistent/netns", func() (int, error) { return 0, nil }); err == nil {
		t.Error("RunIn into a missing namespace: no error")
	}
}

// TestBlogTopology checks the wiring without any proxier: the client
// reaches both pods directly over TCP and UDP on every port and both
// families, the pods see the client's own address, the node reaches them
// too, and the service addresses are not answered.
func TestBlogTopology(t *testing.T) {
	RequirePrivileged(t)
	b := Blog(t)
	for _, tc := range []struct {
		from   *NS
		src    netip.Addr
		to     netip.Addr
		server string
	}{
		{b.Client, ClientV4, PodV4, PodID},
		{b.Client, ClientV6, PodV6, PodID},
		{b.Client, ClientV4, Pod2V4, Pod2ID},
		{b.Client, ClientV6, Pod2V6, Pod2ID},
		{b.Node, GatewayV4, PodV4, PodID},
		{b.Node, GatewayV6, Pod2V6, Pod2ID},
	} {
		for _, network := range []string{"tcp", "udp"} {
			for _, port := range BlogPorts {
				dst := netip.AddrPortFrom(tc.to, port)
				a, err := tc.from.Ask(network, dst, AskOptions{})
				if err != nil {
					t.Errorf("%v", err)
					continue
				}
				if a.Server != tc.server || a.Network != network || a.Local != dst || a.Remote.Addr() != tc.src {
					t.Errorf("%s %s from %s: answer %v, want server %s on %s from %s", network, dst, tc.from, a, tc.server, dst, tc.src)
				}
			}
		}
	}
	b.ExpectNoService(t, b.Client, 500*time.Millisecond)
	b.ExpectNoService(t, b.Node, 500*time.Millisecond)
}

func TestCheckPrefix(t *testing.T) {
	for _, good := range []string{Prefix, "ci-job-", "a-"} {
		if err := CheckPrefix(good); err != nil {
			t.Errorf("CheckPrefix(%q) = %v, want nil", good, err)
		}
	}
	for _, bad := range []string{"", "-", "kpngt", "kpngt1-", "kpngt--", "-kpngt-", "Kpngt-", "a-7-", "a_b-"} {
		if err := CheckPrefix(bad); err == nil {
			t.Errorf("CheckPrefix(%q) = nil, want an error", bad)
		}
	}
}

// TestCreator checks that a name is read as a prefix's only when that
// prefix made it, also when one prefix starts another.
func TestCreator(t *testing.T) {
	for _, tc := range []struct {
		name, prefix string
		pid          int
		ok           bool
	}{
		{"kpngt-123-4-node", "kpngt-", 123, true},
		{"kpngt-123-4-pod-2", "kpngt-", 123, true},
		{"kpngt-ci-123-4-node", "kpngt-", 0, false},
		{"kpngt-ci-123-4-node", "kpngt-ci-", 123, true},
		{"kpngt-123-4-node", "kpngt-ci-", 0, false},
		{"kpngt-123-probe", "kpngt-", 0, false},
		{"kpngt-0123-4-node", "kpngt-", 0, false},
		{"kpngt-123-4-", "kpngt-", 0, false},
		{"other", "kpngt-", 0, false},
	} {
		pid, ok := creator(tc.name, tc.prefix)
		if pid != tc.pid || ok != tc.ok {
			t.Errorf("creator(%q, %q) = %d, %v; want %d, %v", tc.name, tc.prefix, pid, ok, tc.pid, tc.ok)
		}
	}
}

// TestSweepOwnPrefixOnly checks that the leftovers of a dead process are
// removed for the prefix being swept, and that the namespaces of another
// prefix (dead creator too) and of a live process are kept.
func TestSweepOwnPrefixOnly(t *testing.T) {
	RequirePrivileged(t)
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	pid := dead.Process.Pid
	if running(pid) {
		t.Skipf("pid %d was reused already", pid)
	}
	mine, other := "kpngt-sweep-", "kpngt-sweepother-"
	names := map[string]bool{ // name → kept by sweepStale(mine)
		fmt.Sprintf("%s%d-1-dead", mine, pid):         false,
		fmt.Sprintf("%s%d-1-live", mine, os.Getpid()): true,
		fmt.Sprintf("%s%d-1-dead", other, pid):        true, // starts with mine, but another prefix
	}
	for name := range names {
		if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
			t.Fatalf("ip netns add %s: %v: %s", name, err, out)
		}
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "delete", name).Run() })
	}
	sweepStale(mine)
	for name, kept := range names {
		_, err := os.Stat(RunDir + "/" + name)
		if exists := err == nil; exists != kept {
			t.Errorf("after sweeping %s: %s exists = %v, want %v", mine, name, exists, kept)
		}
	}
}
