package app

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"sigs.k8s.io/kpng/api/kpngv1"
	"sigs.k8s.io/kpng/client/remote"
	"sigs.k8s.io/kpng/internal/controlplane"
	"sigs.k8s.io/kpng/internal/manifests"
	"sigs.k8s.io/kpng/internal/promtest"
	"sigs.k8s.io/kpng/internal/testio"
)

var (
	cp      *controlplane.ControlPlane
	root    string
	kpngBin string // kpng-json, built once
)

func TestMain(m *testing.M) { controlplane.Main(m, &cp) }

// setup applies the blog's manifests once and builds kpng-json.
var setupOnce sync.Once

func setup(t *testing.T) {
	t.Helper()
	setupOnce.Do(func() {
		var err error
		if root, err = controlplane.RepoRoot(); err != nil {
			t.Fatal(err)
		}
		for _, m := range []string{"kpng-example.yaml", "kpng-example-endpointslices.yaml"} {
			if err := manifests.ApplyFile(context.Background(), cp.Client(), filepath.Join(root, "examples", "manifests", m)); err != nil {
				t.Fatal(err)
			}
		}
		kpngBin = filepath.Join(os.TempDir(), "kpng-json-app-test")
		out, err := exec.Command("go", "build", "-o", kpngBin, filepath.Join(root, "examples", "json")).CombinedOutput()
		if err != nil {
			t.Fatalf("build kpng-json: %v\n%s", err, out)
		}
	})
	if kpngBin == "" {
		t.Fatal("setup failed")
	}
}

func golden(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "examples", "json", "testdata", "kpng-example.golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// startKpng runs kpng with args until the test ends.
func startKpng(t *testing.T, stdout *testio.SyncBuffer, args ...string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var stderr testio.SyncBuffer
	if stdout == nil {
		stdout = &testio.SyncBuffer{}
	}
	go func() { done <- Exec(ctx, args, stdout, &stderr, JSONBackend(stdout)) }()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("kpng %s: exit status %d\n%s", strings.Join(args, " "), code, stderr.String())
			}
		case <-time.After(15 * time.Second):
			t.Errorf("kpng %s did not stop", strings.Join(args, " "))
		}
	})
}

// jsonBackend runs kpng-json once against the controller at addr. It
// returns an error rather than failing the test: it runs in goroutines of
// its own.
func jsonBackend(addr, node string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, kpngBin, "--api="+addr, "--once")
	cmd.Env = append(os.Environ(), "NODE_NAME="+node)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("kpng-json --api=%s (node %s): %w\n%s", addr, node, err, stderr.String())
	}
	return stdout.String(), nil
}

// scrape returns the kpng_ samples of addr's /metrics, parsed with
// Prometheus' text parser, by name (summed over labels).
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	families := promtest.Scrape(t, addr)
	out := map[string]float64{}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			out[name] += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return out
}

// TestKubeToAPIServesSeveralBackends: two backends watch a controller,
// each seeing its node's view; the controller's metrics count them.
func TestKubeToAPIServesSeveralBackends(t *testing.T) {
	cp.Require(t)
	setup(t)
	sock := "unix://" + filepath.Join(t.TempDir(), "kpng.sock")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := ln.Addr().String()
	ln.Close()
	startKpng(t, nil, "kube", "--kubeconfig="+cp.KubeconfigPath(), "--service-proxy-name=kpng-example",
		"--node-name=controller", "--metrics-bind-address="+metricsAddr, "to-api", "--listen="+sock)

	var wg sync.WaitGroup
	outs := map[string]string{}
	var errs []error
	var mu sync.Mutex
	for _, node := range []string{"node-a", "node-b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := jsonBackend(sock, node)
			mu.Lock()
			outs[node] = out
			errs = append(errs, err)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	// node-a sees exactly what the in-process kpng-json prints for it.
	if outs["node-a"] != golden(t) {
		t.Errorf("kpng-json --api for node-a:\n%s\nwant the in-process output:\n%s", outs["node-a"], golden(t))
	}
	// node-b sees its own endpoints as local.
	wantB := strings.NewReplacer(`"Local":true,`, ``).Replace(golden(t))
	for _, ip := range []string{"11.0.1.2", "1100::102"} {
		wantB = strings.Replace(wantB, `["`+ip+`"]},`, `["`+ip+`"]},"Local":true,`, 1)
	}
	if outs["node-b"] != wantB {
		t.Errorf("kpng-json --api for node-b:\n%s\nwant:\n%s", outs["node-b"], wantB)
	}
	// Both backends came and went (--once).
	var m map[string]float64
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if m = scrape(t, metricsAddr); m["kpng_api_backends"] == 0 {
			break
		}
	}
	if m["kpng_api_backend_connections_total"] != 2 || m["kpng_api_backends"] != 0 || m["kpng_api_backends_dropped_total"] != 0 ||
		m["kpng_api_sent_batches_total"] < 2 || m["kpng_api_sent_bytes_total"] < float64(len(golden(t))/2) || m["kpng_api_snapshots_total"] < 1 {
		t.Errorf("to-api metrics: %d connections, %d connected, %d dropped, %d batches, %d bytes, %d snapshots; want 2, 0, 0, at least 2, the state's size and at least 1",
			int(m["kpng_api_backend_connections_total"]), int(m["kpng_api_backends"]), int(m["kpng_api_backends_dropped_total"]),
			int(m["kpng_api_sent_batches_total"]), int(m["kpng_api_sent_bytes_total"]), int(m["kpng_api_snapshots_total"]))
	}
}

// TestKubeToAPIReadyWithoutItsNode: a controller (kube to-api) is ready,
// its /healthz 200, once it holds a state, although no Node has the name
// it runs under (a Deployment's pod, as deploy/kpng-controller.yaml's,
// whose readiness probe is /healthz): the Node's eligibility for
// load-balancer traffic is a node proxier's business, not the
// controller's. Without it, the replicas were never ready, and the
// headless Service the node backends find them through had no address.
func TestKubeToAPIReadyWithoutItsNode(t *testing.T) {
	cp.Require(t)
	setup(t)
	healthAddr := testio.FreeAddr(t)
	sock := "unix://" + filepath.Join(t.TempDir(), "kpng.sock")
	startKpng(t, nil, "kube", "--kubeconfig="+cp.KubeconfigPath(), "--service-proxy-name=kpng-example",
		"--node-name=kpng-controller-6d4f9c7b8-x2x7q", "--healthz-bind-address="+healthAddr, "to-api", "--listen="+sock)
	// A backend's first state: the controller's informers have synced, and
	// it has looked for its Node (before its first state; /healthz is 200
	// before that, as kube-proxy's).
	if _, err := jsonBackend(sock, "node-a"); err != nil {
		t.Fatal(err)
	}
	var code int
	var body string
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		resp, err := http.Get("http://" + healthAddr + "/healthz")
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		code, body = resp.StatusCode, string(b)
		if code == http.StatusOK {
			break
		}
	}
	if code != http.StatusOK || strings.Contains(body, "nodeEligible") {
		t.Errorf("the controller's /healthz: %d %s; want 200, without nodeEligible", code, body)
	}
}

// TestKubeToAPIStopEndsStreams: a controller told to stop (SIGTERM ends
// its context) ends its backends' streams at once, with Unavailable "the
// controller is stopping", and they move to another controller. Before,
// gRPC's graceful stop waited for the streams, which never end by
// themselves, until its 5 s timeout cut the connections: a backend kept
// watching, that long, a controller whose input had stopped (found
// deleting a replica of deploy/kpng-controller.yaml in the one-machine
// cluster).
func TestKubeToAPIStopEndsStreams(t *testing.T) {
	cp.Require(t)
	setup(t)
	sock := "unix://" + filepath.Join(t.TempDir(), "kpng.sock")
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan int, 1)
	var stderr testio.SyncBuffer
	go func() {
		done <- Exec(ctx, []string{"kube", "--kubeconfig=" + cp.KubeconfigPath(), "--service-proxy-name=kpng-example",
			"--node-name=controller", "to-api", "--listen=" + sock}, io.Discard, &stderr, JSONBackend(io.Discard))
	}()
	defer func() {
		stop()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("kpng did not stop")
		}
	}()

	target, opts, err := (&remote.Config{Address: sock, NodeName: "node-a"}).DialOptions()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	wctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stream, err := kpngv1.NewControllerClient(conn).Watch(wctx, &kpngv1.WatchRequest{NodeName: "node-a", NodeIndependent: true}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	// The first state, up to its sync.
	for synced := false; !synced; {
		batch, err := stream.Recv()
		if err != nil {
			t.Fatalf("before the first sync: %v\n%s", err, stderr.String())
		}
		for _, op := range batch.GetOps() {
			synced = synced || op.GetSync() != nil
		}
	}
	stop()
	for {
		if _, err = stream.Recv(); err != nil {
			break
		}
	}
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "the controller is stopping") {
		t.Errorf("the stream of a stopping controller ended with %v, want Unavailable: the controller is stopping", err)
	}
}

func TestToFileAndFileInputRoundTrip(t *testing.T) {
	cp.Require(t)
	setup(t)
	dir := t.TempDir()
	recorded := filepath.Join(dir, "state.yaml")
	startKpng(t, nil, "kube", "--kubeconfig="+cp.KubeconfigPath(), "--service-proxy-name=kpng-example",
		"--node-name=node-a", "to-file", "--output="+recorded)
	first := waitFile(t, recorded)

	// The file replays through another kpng to a file again, unchanged...
	replayed := filepath.Join(dir, "replayed.yaml")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := ln.Addr().String()
	ln.Close()
	startKpng(t, nil, "file", "--input="+recorded, "--metrics-bind-address="+metricsAddr, "to-file", "--output="+replayed)
	if second := waitFile(t, replayed); second != first {
		t.Errorf("file → to-file changed the state:\n%s\nwant:\n%s", second, first)
	}
	// The file input serves the metrics of its rounds too.
	var m map[string]float64
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if m = scrape(t, metricsAddr); m["kpng_services"] > 0 {
			break
		}
	}
	if m["kpng_services"] != 1 || m["kpng_rounds_total"] < 1 {
		t.Errorf("kpng file's metrics: kpng_services %v, kpng_rounds_total %v; want 1 service (the blog's) and a round", m["kpng_services"], m["kpng_rounds_total"])
	}
	// ...and served to a backend, gives the in-process output.
	sock := "unix://" + filepath.Join(dir, "kpng.sock")
	startKpng(t, nil, "file", "--input="+recorded, "to-api", "--listen="+sock)
	out, err := jsonBackend(sock, "whatever")
	if err != nil {
		t.Fatal(err)
	}
	if out != golden(t) {
		t.Errorf("kpng file to-api → kpng-json:\n%s\nwant:\n%s", out, golden(t))
	}
}

func TestToLocalJSON(t *testing.T) {
	cp.Require(t)
	setup(t)
	var stdout testio.SyncBuffer
	startKpng(t, &stdout, "kube", "--kubeconfig="+cp.KubeconfigPath(), "--service-proxy-name=kpng-example",
		"--node-name=node-a", "to-local", "to-json")
	deadline := time.Now().Add(20 * time.Second)
	for stdout.String() == "" && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if got := stdout.String(); got != golden(t) {
		t.Errorf("to-local to-json printed:\n%s\nwant:\n%s", got, golden(t))
	}
}

func waitFile(t *testing.T, path string) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
			return string(b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s was not written", path)
	return ""
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "missing input"},
		{[]string{"bogus"}, `unknown input "bogus"`},
		{[]string{"kube", "--bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"kube"}, "missing output"},
		{[]string{"kube", "to-nowhere"}, `unknown output "to-nowhere"`},
		{[]string{"kube", "to-file"}, "to-file: --output is required"},
		{[]string{"kube", "to-local"}, "to-local: missing backend"},
		{[]string{"kube", "to-local", "to-nothing"}, `unknown backend "to-nothing"`},
		{[]string{"kube", "to-api", "--listen=0.0.0.0:9000", "--insecure"}, "refusing --insecure on a non-loopback address"},
		{[]string{"kube", "to-api", "--listen=127.0.0.1:9000"}, "TCP needs --tls-cert and --tls-key"},
		{[]string{"kube", "to-api", "--listen=127.0.0.1:9000", "--insecure", "--insecure-no-client-auth"}, "are exclusive"},
		{[]string{"kube", "to-api", "--tls-any-node-cn=reader"}, "--tls-any-node-cn needs --tls-client-ca"},
		{[]string{"kube", "to-api", "--max-concurrent-first-states=0"}, "--max-concurrent-first-states must be at least 1"},
		{[]string{"kube", "to-api", "--max-streams-per-node=0"}, "--max-streams-per-node must be at least 1"},
		{[]string{"kube", "to-api", "--http2-max-streams-per-connection=1"}, "1 streams per connection: a backend needs 2"},
		{[]string{"kube", "to-api", "--peers-service=kpng-controller"}, `--peers-service="kpng-controller": want NAMESPACE/NAME`},
		{[]string{"kube", "to-api", "--peers-service=a/b/c"}, "want NAMESPACE/NAME"},
		{[]string{"file", "--input=/tmp/x", "to-api", "--peers-service=kube-system/kpng-controller"}, "to-api --peers-service needs the kube input"},
		{[]string{"api", "--api=unix:///tmp/x", "to-api", "--peers-service=kube-system/kpng-controller"}, "to-api --peers-service needs the kube input"},
		{[]string{"file", "to-api"}, "--input is required"},
		{[]string{"api", "to-api"}, "--api is required"},
		{[]string{"api", "--api=10.1.2.3:1", "--api-insecure", "to-api"}, "refusing --api-insecure"},
		{[]string{"kube", "--kubeconfig=/nonexistent", "to-file", "--output=/tmp/x"}, "kubeconfig /nonexistent"},
	} {
		var stdout, stderr bytes.Buffer
		code := Exec(context.Background(), tc.args, &stdout, &stderr)
		out := stderr.String()
		last := out[strings.LastIndex(strings.TrimSuffix(out, "\n"), "\n")+1:]
		if code != 2 || !strings.Contains(last, tc.want) || !strings.HasPrefix(last, "kpng: ") {
			t.Errorf("kpng %s: exit %d, last stderr line %q; want exit 2 and %q", strings.Join(tc.args, " "), code, last, tc.want)
		}
	}
}

func TestHelpAndVersion(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"kube", "--help"}, {"kube", "to-api", "--help"}, {"file", "to-local", "--help"}} {
		var stdout, stderr bytes.Buffer
		if code := Exec(context.Background(), args, &stdout, &stderr, JSONBackend(&stdout)); code != 0 {
			t.Errorf("kpng %s: exit %d", strings.Join(args, " "), code)
		}
		if !strings.Contains(stderr.String(), "Usage") && !strings.Contains(stderr.String(), "to-api:") {
			t.Errorf("kpng %s printed no help:\n%s", strings.Join(args, " "), stderr.String())
		}
	}
	var stdout bytes.Buffer
	if code := Exec(context.Background(), []string{"version"}, &stdout, &stdout); code != 0 || !strings.HasPrefix(stdout.String(), "kpng ") {
		t.Errorf("kpng version: exit %d, %q", code, stdout.String())
	}
}
