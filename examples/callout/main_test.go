package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sigs.k8s.io/kpng/client"
	"sigs.k8s.io/kpng/internal/controlplane"
	"sigs.k8s.io/kpng/internal/kubetest"
	"sigs.k8s.io/kpng/internal/manifests"
	"sigs.k8s.io/kpng/internal/proc"
	"sigs.k8s.io/kpng/internal/promtest"
	"sigs.k8s.io/kpng/internal/racebuild"
	"sigs.k8s.io/kpng/internal/testio"
)

var cp *controlplane.ControlPlane

func TestMain(m *testing.M) { controlplane.Main(m, &cp) }

// patience bounds every wait for something that should happen; it is a
// failure limit, not an assertion on timing.
const patience = 30 * time.Second

// TestUsageErrors checks that bad flags, a bad $CALLOUT and a bad
// configuration make kpng-callout exit with status 2 and one line on
// stderr, before it runs anything.
func TestUsageErrors(t *testing.T) {
	cp.Require(t)
	t.Setenv("KUBECONFIG", "")
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	kubeconfig := "--kubeconfig=" + cp.KubeconfigPath()
	for _, tc := range []struct {
		name    string
		callout string
		args    []string
		want    string
	}{
		{"no CALLOUT", "", nil, "$CALLOUT is not set"},
		{"blank CALLOUT", " \t ", nil, "$CALLOUT is not set"},
		{"unterminated quote", `jq '.Service`, nil, "$CALLOUT: unterminated single quote at offset 3"},
		{"unterminated double quote", `jq ".Service`, nil, "$CALLOUT: unterminated double quote at offset 3"},
		{"shell operator", `jq . | tee out`, nil, `$CALLOUT: unquoted '|' needs a shell`},
		{"program not found", `kpng-no-such-program --flag`, nil, `$CALLOUT: exec: "kpng-no-such-program": executable file not found in $PATH`},
		{"unknown flag", "cat", []string{"--bogus"}, "flag provided but not defined: -bogus"},
		{"extra argument", "cat", []string{"extra"}, `unexpected argument "extra"`},
		{"bad duration", "cat", []string{"--timeout=soon"}, `invalid value "soon" for flag -timeout`},
		{"zero timeout", "cat", []string{"--timeout=0"}, "--timeout=0s: must be positive"},
		{"zero retry-min", "cat", []string{"--retry-min=0"}, "--retry-min=0s: must be positive"},
		{"retry-max below retry-min", "cat", []string{"--retry-min=2s", "--retry-max=1s"}, "--retry-max=1s: must not be less than --retry-min=2s"},
		{"no attempts", "cat", []string{"--once-attempts=0"}, "--once-attempts=0: must be at least 1"},
		{"missing kubeconfig", "cat", []string{"--kubeconfig=/nonexistent/kubeconfig"}, "kubeconfig /nonexistent/kubeconfig:"},
		{"no kubeconfig at all", "cat", nil, "no kubeconfig: pass --kubeconfig or set $KUBECONFIG"},
		{"bad proxy name", "cat", []string{kubeconfig, "--service-proxy-name=not valid!"}, `invalid service-proxy-name "not valid!"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(tc.args, tc.callout, &stdout, &stderr)
			if code != 2 {
				t.Errorf("exit status %d, want 2", code)
			}
			out := stderr.String()
			if strings.Count(out, "\n") != 1 || !strings.HasPrefix(out, "kpng-callout: ") || !strings.Contains(out, tc.want) {
				t.Errorf("stderr = %q, want one line containing %q", out, tc.want)
			}
			if stdout.Len() > 0 {
				t.Errorf("stdout = %q, want nothing", stdout.String())
			}
		})
	}
}

func TestHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"--help"}, "", &stdout, &stderr); code != 0 {
		t.Errorf("exit status %d, want 0", code)
	}
	for _, want := range []string{"CALLOUT=", "-timeout", "-retry-min", "-retry-max", "-once-attempts", "-service-proxy-name", "-kubeconfig"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("--help lacks %q:\n%s", want, stderr.String())
		}
	}
}

// TestKpngCallout runs the kpng-callout binary against the test control
// plane.
func TestKpngCallout(t *testing.T) {
	cp.Require(t)
	bin := build(t)
	t.Run("each state reaches the callout", func(t *testing.T) { testStates(t, bin) })
	t.Run("the blog's CALLOUT=jq with --once", func(t *testing.T) { testBlogOnce(t, bin) })
	t.Run("--once with a failing callout", func(t *testing.T) { testOnceFailing(t, bin) })
	t.Run("a callout that hangs, then crashes", func(t *testing.T) { testHangThenCrash(t, bin) })
	t.Run("health follows the callout's success", func(t *testing.T) { testHealth(t, bin) })
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String()+" kills a hanging callout", func(t *testing.T) { testSignal(t, bin, sig) })
	}
	t.Run("no CALLOUT", func(t *testing.T) {
		cmd := exec.Command(bin, "--kubeconfig="+cp.KubeconfigPath())
		cmd.Env = withoutCallout(os.Environ())
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 {
			t.Errorf("kpng-callout without $CALLOUT: %v, want exit status 2", err)
		}
		if out := stderr.String(); out != "kpng-callout: $CALLOUT is not set: set it to the program to run on each state, e.g. CALLOUT=jq\n" {
			t.Errorf("stderr = %q", out)
		}
	})
}

// build builds kpng-callout (with the race detector when the tests have it).
func build(t *testing.T) string {
	t.Helper()
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "kpng-callout")
	args := []string{"build", "-o", bin}
	if racebuild.Enabled {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, "./examples/callout")...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// testStates runs kpng-callout with a callout that copies its input to a
// file, changes the services of its proxy name, and checks that the file
// follows, in kpng-json's format. Then SIGTERM stops it with status 0.
func testStates(t *testing.T, bin string) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state file.json") // a space: the path is quoted in $CALLOUT
	sh := writeScript(t, `cat > "$1.tmp" && mv "$1.tmp" "$1"
echo "ran"
echo "callout stderr" >&2`)
	kc := kubetest.Client{T: t, C: cp.Client()}
	ns := kubetest.Namespace(t, cp.Client())
	name := kubetest.UniqueName("callout")

	metricsAddr := testio.FreeAddr(t)
	p := startCallout(t, bin, sh+` '`+state+`'`, "--service-proxy-name="+name, "--node-name=me", "--metrics-bind-address="+metricsAddr)

	// The first state is empty: the callout runs with an empty input.
	waitForFile(t, state, func(s string) bool { return s == "" })

	svc := kc.CreateService(kubetest.Service(ns, "web", name))
	kc.CreateSlice(kubetest.Slice(svc, "web-1", kubetest.EP{IP: "10.9.0.2", Node: "other"}, kubetest.EP{IP: "10.9.0.1", Node: "me"}))
	want := []*client.ServiceEndpoints{{
		Service: &client.Service{
			Namespace: ns, Name: "web", Type: "ClusterIP",
			Labels: map[string]string{kubetest.ProxyNameLabel: name},
			IPs:    client.ServiceIPs{ClusterIPs: client.IPSet{V4: []string{svc.Spec.ClusterIP}}},
			Ports:  []*client.PortMapping{{Name: "http", Protocol: client.TCP, Port: 80, TargetPort: 8080}},
		},
		Endpoints: []*client.Endpoint{
			{IPs: client.IPSet{V4: []string{"10.9.0.1"}}, Local: true, Ready: true, Serving: true, NodeName: "me"},
			{IPs: client.IPSet{V4: []string{"10.9.0.2"}}, Ready: true, Serving: true, NodeName: "other"},
		},
	}}
	got := waitForFile(t, state, func(s string) bool { return strings.Contains(s, "10.9.0.2") })
	if diff := cmp.Diff(want, decode(t, got)); diff != "" {
		t.Errorf("the callout's input (-want +got):\n%s", diff)
	}
	if wantBytes := encodeLines(t, want); got != wantBytes {
		t.Errorf("the callout's input is not kpng-json's output:\ngot:  %q\nwant: %q", got, wantBytes)
	}

	kc.DeleteService(ns, "web")
	waitForFile(t, state, func(s string) bool { return s == "" })

	// Three runs (empty, web, empty again), each counted once it ended.
	// A run's duration and its outcome are two metrics, updated one after
	// the other: a scrape between them (a fourth run ending) sees one more
	// duration than outcomes, so the scrape is taken again until they
	// agree (a CI run failed on 4 durations for 3 successes).
	var m map[string]float64
	ok := func() bool {
		return m["kpng_callout_runs_total/success"] >= 3 && m["kpng_callout_duration_seconds"] == m["kpng_callout_runs_total/success"] && m["kpng_callout_runs_total/failure"] == 0
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if m = scrapeCallout(t, metricsAddr); ok() {
			break
		}
	}
	if !ok() {
		t.Errorf("callout metrics: %v, want at least 3 successful runs, each timed, no failure", m)
	}

	p.stop(t, syscall.SIGTERM)
	if n := strings.Count(p.stdout.String(), "ran\n"); n < 3 {
		t.Errorf("kpng-callout's stdout has %d lines of the callout's output, want at least 3:\n%s", n, p.stdout.String())
	}
	if !strings.Contains(p.stderr.String(), "callout stderr\n") {
		t.Errorf("kpng-callout's stderr lacks the callout's:\n%s", p.stderr.String())
	}
}

// testHangThenCrash runs kpng-callout with a callout whose first run hangs
// (with a child) and whose second dies of SIGSEGV, while the services
// change: the hanging run is killed after --timeout with its child, the
// crash is retried after the backoff, a later run gets the latest state,
// and kpng-callout goes on: a later change reaches the callout too.
func testHangThenCrash(t *testing.T, bin string) {
	dir := t.TempDir()
	state, count, child := filepath.Join(dir, "state"), filepath.Join(dir, "count"), filepath.Join(dir, "child")
	sh := writeScript(t, `n=$(( $(cat "$2" 2>/dev/null || echo 0) + 1 ))
echo $n > "$2"
case $n in
1) sleep 1000 & echo $! > "$3"; wait ;;
2) cat > /dev/null; kill -SEGV $$ ;;
esac
cat > "$1.tmp" && mv "$1.tmp" "$1"
echo "ran:$n"`)
	kc := kubetest.Client{T: t, C: cp.Client()}
	ns := kubetest.Namespace(t, cp.Client())
	name := kubetest.UniqueName("crash")
	p := startCallout(t, bin, sh+" "+state+" "+count+" "+child, "--service-proxy-name="+name, "--timeout=1s", "--retry-min=100ms", "--retry-max=200ms")

	// While the first run hangs, a service comes.
	waitForFile(t, count, func(s string) bool { return s == "1\n" })
	svc := kc.CreateService(kubetest.Service(ns, "web", name))
	kc.CreateSlice(kubetest.Slice(svc, "web-1", kubetest.EP{IP: "10.9.1.1"}))
	waitForFile(t, state, func(s string) bool { return strings.Contains(s, "10.9.1.1") })
	// The third run or a later one: the service and its slice may come
	// as two states.
	if n, err := strconv.Atoi(strings.TrimSpace(readFile(t, count))); err != nil || n < 3 {
		t.Errorf("the state reached the callout on run %d (%v), want the third or later (hung, crashed, ran)", n, err)
	}
	var pid int
	if _, err := fmt.Sscan(readFile(t, child), &pid); err != nil {
		t.Fatal(err)
	}
	if proc.Alive(pid) {
		t.Errorf("the hanging callout's child %d is still running", pid)
	}
	// kpng-callout goes on.
	kc.DeleteService(ns, "web")
	waitForFile(t, state, func(s string) bool { return s == "" })
	p.stop(t, syscall.SIGTERM)
	stderr := p.stderr.String()
	for _, want := range []string{"timed out after 1s and was killed", "signal: segmentation fault"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("kpng-callout's log lacks %q:\n%s", want, stderr)
		}
	}
}

// testHealth runs kpng-callout with a callout that fails while a file
// exists: /healthz and /livez answer 200 while the callout succeeds, 503
// once a state has waited longer than --healthz-timeout for a successful
// run of the callout (its rounds, handed to the runner, all end well),
// and 200 again after the next success;
// kpng_sync_proxy_rules_last_queued_timestamp_seconds is set while the
// state waits, 0 once it is applied.
func testHealth(t *testing.T, bin string) {
	dir := t.TempDir()
	state, fail := filepath.Join(dir, "state"), filepath.Join(dir, "fail")
	sh := writeScript(t, `if [ -e "$2" ]; then cat > /dev/null; echo "failing on purpose" >&2; exit 3; fi
cat > "$1.tmp" && mv "$1.tmp" "$1"`)
	kc := kubetest.Client{T: t, C: cp.Client()}
	ns := kubetest.Namespace(t, cp.Client())
	name := kubetest.UniqueName("health")
	node := createNode(t)
	metricsAddr, healthAddr := testio.FreeAddr(t), testio.FreeAddr(t)
	p := startCallout(t, bin, sh+" "+state+" "+fail, "--service-proxy-name="+name, "--node-name="+node,
		"--metrics-bind-address="+metricsAddr, "--healthz-bind-address="+healthAddr, "--healthz-timeout=1s",
		"--retry-min=50ms", "--retry-max=200ms")

	waitForFile(t, state, func(s string) bool { return s == "" })
	waitForHealth(t, healthAddr, http.StatusOK)

	// The callout fails from now on, and a service comes: its state is
	// handed to the callout, never applied.
	if err := os.WriteFile(fail, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	svc := kc.CreateService(kubetest.Service(ns, "web", name))
	kc.CreateSlice(kubetest.Slice(svc, "web-1", kubetest.EP{IP: "10.9.2.1"}))
	waitForHealth(t, healthAddr, http.StatusServiceUnavailable)
	if m := scrapeCallout(t, metricsAddr); m["kpng_callout_runs_total/failure"] < 1 || m["kpng_sync_proxy_rules_last_queued_timestamp_seconds"] == 0 {
		t.Errorf("while the callout fails: %v, want failures counted and a last queued time", m)
	}
	if s := readFile(t, state); s != "" {
		t.Errorf("the callout, failing, applied a state: %q", s)
	}

	// It succeeds again: the service's state is applied, health is back.
	if err := os.Remove(fail); err != nil {
		t.Fatal(err)
	}
	waitForHealth(t, healthAddr, http.StatusOK)
	if s := readFile(t, state); !strings.Contains(s, "10.9.2.1") {
		t.Errorf("healthy again, but the callout has not applied the service's state: %q", s)
	}
	if m := scrapeCallout(t, metricsAddr); m["kpng_sync_proxy_rules_last_queued_timestamp_seconds"] != 0 {
		t.Errorf("last queued after the success: %v, want 0", m["kpng_sync_proxy_rules_last_queued_timestamp_seconds"])
	}
	p.stop(t, syscall.SIGTERM)
	if !strings.Contains(p.stderr.String(), "failing on purpose") {
		t.Errorf("kpng-callout's log lacks the callout's failure:\n%s", p.stderr.String())
	}
}

// waitForHealth waits until both /healthz and /livez at addr answer code.
func waitForHealth(t *testing.T, addr string, code int) {
	t.Helper()
	var got [2]int
	for deadline := time.Now().Add(patience); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		for i, path := range []string{"/healthz", "/livez"} {
			got[i] = 0
			if resp, err := http.Get("http://" + addr + path); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				got[i] = resp.StatusCode
			}
		}
		if got == [2]int{code, code} {
			return
		}
	}
	t.Fatalf("/healthz and /livez still %v after %v, want %d", got, patience, code)
}

// createNode creates a Node, so that /healthz finds this node eligible,
// and deletes it when the test ends.
func createNode(t *testing.T) string {
	t.Helper()
	name := kubetest.UniqueName("node")
	nodes := cp.Client().CoreV1().Nodes()
	if _, err := nodes.Create(context.Background(), &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nodes.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	return name
}

var (
	blogOnce sync.Once
	blogErr  error
)

// applyBlogManifests creates the blog's Service and EndpointSlices, once
// for all the tests of this process (-count=N reuses the control plane).
func applyBlogManifests(t *testing.T) {
	t.Helper()
	blogOnce.Do(func() {
		root, err := controlplane.RepoRoot()
		if err != nil {
			blogErr = err
			return
		}
		for _, m := range []string{"kpng-example.yaml", "kpng-example-endpointslices.yaml"} {
			if err := manifests.ApplyFile(context.Background(), cp.Client(), filepath.Join(root, "examples", "manifests", m)); err != nil {
				blogErr = err
				return
			}
		}
	})
	if blogErr != nil {
		t.Fatal(blogErr)
	}
}

// testBlogOnce runs the blog's CALLOUT=jq (and the blog's jq expressions)
// with --once against the blog's Service.
func testBlogOnce(t *testing.T, bin string) {
	applyBlogManifests(t)
	golden, err := os.ReadFile(filepath.Join("..", "json", "testdata", "kpng-example.golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	blogArgs := []string{"--service-proxy-name=kpng-example", "--node-name=node-a", "--once"}

	// CALLOUT=cat shows that the input is byte for byte kpng-json's
	// output (the golden file of kpng-json's own test).
	if out := runOnce(t, bin, "cat", blogArgs...); out != string(golden) {
		t.Errorf("CALLOUT=cat printed\n%s\nwant kpng-json's output\n%s", out, golden)
	}

	// The blog's command: jq pretty-prints the same objects.
	out := runOnce(t, bin, "jq", blogArgs...)
	if !strings.HasPrefix(out, "{\n  \"Service\": {\n") {
		t.Errorf("CALLOUT=jq did not print jq's indented output:\n%s", out)
	}
	if diff := cmp.Diff(decode(t, string(golden)), decode(t, out)); diff != "" {
		t.Errorf("CALLOUT=jq printed the wrong service (-want +got):\n%s", diff)
	}

	// The blog's jq expressions, quoted in $CALLOUT as in a shell.
	for callout, want := range map[string]string{
		`jq -r .Service.IPs.ExternalIPs.V6[0]`:                                           "1000::55\n",
		`jq -r '.Endpoints[]|select(.Local == true)|select(.IPs.V6 != null)|.IPs.V6[0]'`: "1100::202\n",
		`jq -r ".Endpoints[]|select(.Local == true)|select(.IPs.V4 != null)|.IPs.V4[0]"`: "11.0.2.2\n",
		`jq --arg node node-b -r '.Endpoints[]|select(.NodeName == $node)|.IPs.V4[]?'`:   "11.0.1.2\n",
	} {
		if out := runOnce(t, bin, callout, blogArgs...); out != want {
			t.Errorf("CALLOUT=%s printed %q, want %q", callout, out, want)
		}
	}
}

// runOnce runs kpng-callout to completion and returns its stdout; it must
// exit with status 0.
func runOnce(t *testing.T, bin, callout string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"--kubeconfig=" + cp.KubeconfigPath()}, args...)...)
	cmd.Env = append(withoutCallout(os.Environ()), "CALLOUT="+callout)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := runWithin(t, cmd); err != nil {
		t.Fatalf("CALLOUT=%s kpng-callout %s: %v\n%s", callout, strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String()
}

// testOnceFailing checks that --once exits with status 1 after
// --once-attempts failures, having logged each with its exit status and
// stderr.
func testOnceFailing(t *testing.T, bin string) {
	cmd := exec.Command(bin, "--kubeconfig="+cp.KubeconfigPath(), "--service-proxy-name="+kubetest.UniqueName("nobody"),
		"--node-name=me", "--once", "--once-attempts=2", "--retry-min=10ms")
	cmd.Env = append(withoutCallout(os.Environ()), `CALLOUT=sh -c 'echo "no luck" >&2; exit 4'`)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := runWithin(t, cmd)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("kpng-callout --once with a failing callout: %v, want exit status 1\n%s", err, stderr.String())
	}
	out := stderr.String()
	for _, want := range []string{
		`"Callout failed, will retry" err="callout sh: exit status 4" command="sh" exitStatus=4 stderr=<`,
		`"Callout failed, giving up" err="callout sh: exit status 4" command="sh" exitStatus=4 stderr=<`,
		"kpng-callout: callout failed 2 times, giving up: callout sh: exit status 4\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("stderr lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "no luck\n"); n < 4 { // passed through, and in the log
		t.Errorf("the callout's stderr appears %d times, want 2 passed through and 2 in the log:\n%s", n, out)
	}
}

// testSignal checks that a signal stops kpng-callout with status 0 while
// the callout hangs, killing the callout and its child.
func testSignal(t *testing.T, bin string, sig syscall.Signal) {
	pidFile := filepath.Join(t.TempDir(), "pids")
	sh := writeScript(t, `cat > /dev/null
sleep 1000 &
echo "$$ $!" > "$1.tmp" && mv "$1.tmp" "$1"
wait`)
	p := startCallout(t, bin, sh+" "+pidFile, "--service-proxy-name="+kubetest.UniqueName("nobody"), "--node-name=me")
	var pids []int
	for _, f := range strings.Fields(waitForFile(t, pidFile, func(s string) bool { return s != "" })) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	p.stop(t, sig)
	for _, pid := range pids {
		deadline := time.Now().Add(patience)
		for proc.Alive(pid) {
			if time.Now().After(deadline) {
				t.Errorf("callout process %d still runs after kpng-callout exited", pid)
				_ = syscall.Kill(pid, syscall.SIGKILL)
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// process is a running kpng-callout.
type process struct {
	cmd            *exec.Cmd
	stdout, stderr *testio.SyncBuffer
	done           chan error
}

// startCallout starts kpng-callout with $CALLOUT set to callout; the test's
// end kills it if it still runs.
func startCallout(t *testing.T, bin, callout string, args ...string) *process {
	t.Helper()
	p := &process{stdout: &testio.SyncBuffer{}, stderr: &testio.SyncBuffer{}, done: make(chan error, 1)}
	p.cmd = exec.Command(bin, append([]string{"--kubeconfig=" + cp.KubeconfigPath()}, args...)...)
	p.cmd.Env = append(withoutCallout(os.Environ()), "CALLOUT="+callout)
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("kpng-callout's stderr:\n%s", p.stderr.String())
		}
	})
	return p
}

// stop sends sig and expects exit status 0 promptly.
func (p *process) stop(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		p.done <- err // for the cleanup
		if err != nil {
			t.Errorf("kpng-callout after %v: %v, want exit status 0", sig, err)
		}
	case <-time.After(patience):
		t.Errorf("kpng-callout did not exit within %v of %v", patience, sig)
	}
}

// runWithin runs cmd, killing it when it takes longer than patience.
func runWithin(t *testing.T, cmd *exec.Cmd) error {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(patience):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("%s did not finish within %v", cmd, patience)
		return nil
	}
}

// waitForFile waits until path exists and its content satisfies ok, and
// returns the content.
func waitForFile(t *testing.T, path string, ok func(string) bool) string {
	t.Helper()
	deadline := time.Now().Add(patience)
	for {
		b, err := os.ReadFile(path)
		if err == nil && ok(string(b)) {
			return string(b)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still %q (%v) after %v", path, b, err, patience)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// writeScript writes a bash script to a fresh directory.
func writeScript(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "callout.sh")
	if err := os.WriteFile(path, []byte("#!/bin/bash\nset -u\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// decode reads a stream of JSON objects (one per service) as the state.
func decode(t *testing.T, s string) []*client.ServiceEndpoints {
	t.Helper()
	var items []*client.ServiceEndpoints
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	for {
		var item client.ServiceEndpoints
		if err := dec.Decode(&item); errors.Is(err, io.EOF) {
			return items
		} else if err != nil {
			t.Fatalf("decode %q: %v", s, err)
		}
		items = append(items, &item)
	}
}

// encodeLines is kpng-json's encoding of items (examples/json's jsonPrint,
// independent of kpng-callout's encode).
func encodeLines(t *testing.T, items []*client.ServiceEndpoints) string {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for _, item := range items {
		if err := enc.Encode(item); err != nil {
			t.Fatal(err)
		}
	}
	return buf.String()
}

// withoutCallout returns env without $CALLOUT.
func withoutCallout(env []string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, "CALLOUT=") {
			out = append(out, kv)
		}
	}
	return out
}

// scrapeCallout returns the callout's samples of addr's /metrics and
// kpng_sync_proxy_rules_last_queued_timestamp_seconds, parsed with
// Prometheus' text parser: name/result → value (histograms: their sample
// count).
func scrapeCallout(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	families := promtest.Scrape(t, addr)
	out := map[string]float64{}
	for name, f := range families {
		if !strings.HasPrefix(name, "kpng_callout_") && name != "kpng_sync_proxy_rules_last_queued_timestamp_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			key := name
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" {
					key += "/" + l.GetValue()
				}
			}
			out[key] = m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
	}
	return out
}

// readFile returns the content of path, failing the test if it cannot.
func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
