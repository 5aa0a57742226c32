// Command kpng-demo is `make demo`: it starts a local kube-apiserver and etcd
// on loopback, applies the blog post's Service, application and
// EndpointSlices, runs kpng-json against them with its metrics and health
// served on loopback ports, pretty-prints what it says, shows where to look
// at the metrics (and a few of them), and cleans everything up.
//
// With --serve (make serve) it starts the control plane and applies the
// same manifests, prints the `export KUBECONFIG=…` line and the
// service-proxy-name and node name for a program of your own, and keeps
// serving until SIGINT or SIGTERM, then stops the control plane and
// removes its data.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sigs.k8s.io/kpng/client/metrics"
	"sigs.k8s.io/kpng/internal/controlplane"
	"sigs.k8s.io/kpng/internal/manifests"
)

// localNode is the node the demo's proxier runs for; the manifests place one
// IPv4 and one IPv6 endpoint on it.
const localNode = "node-a"

// serviceProxyName is the proxy name of the blog's Service.
const serviceProxyName = "kpng-example"

func main() {
	serve := flag.Bool("serve", false, "keep the control plane with the blog's Service running for a program of yours until SIGINT or SIGTERM, instead of running kpng-json")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "kpng-demo: unexpected argument %q\n", flag.Arg(0))
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	if *serve {
		err = serveUntilDone(ctx, os.Stdout)
	} else {
		err = run(ctx, os.Stdout)
	}
	if err != nil {
		stop()
		fmt.Fprintf(os.Stderr, "kpng-demo: %v\n", err)
		os.Exit(1)
	}
}

// startBlog starts the control plane and applies the blog's Service,
// application and EndpointSlices; the caller stops the control plane,
// which is also returned (stopped) on error.
func startBlog(ctx context.Context, out io.Writer) (root string, cp *controlplane.ControlPlane, err error) {
	root, err = controlplane.RepoRoot()
	if err != nil {
		return "", nil, err
	}
	step(out, "Starting kube-apiserver and etcd on loopback")
	cp, err = controlplane.Start()
	if err != nil {
		return "", nil, fmt.Errorf("start control plane: %w", err)
	}
	fmt.Fprintf(out, "    API server %s, kubeconfig %s\n", cp.Host(), cp.KubeconfigPath())

	for _, m := range []string{"kpng-example.yaml", "kpng-example-app.yaml", "kpng-example-endpointslices.yaml"} {
		step(out, "Applying examples/manifests/"+m)
		if err := manifests.ApplyFile(ctx, cp.Client(), filepath.Join(root, "examples", "manifests", m)); err != nil {
			stopControlPlane(out, cp)
			return "", nil, err
		}
	}
	return root, cp, nil
}

// stopControlPlane stops cp and removes its data, saying so.
func stopControlPlane(out io.Writer, cp *controlplane.ControlPlane) {
	step(out, "Stopping the control plane and removing its data")
	if err := cp.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "kpng-demo: stop control plane: %v\n", err)
	}
}

// createNode creates the demo's Node: /healthz requires this node to exist
// (as kube-proxy's), and the demo has no kubelet to register it.
func createNode(ctx context.Context, out io.Writer, cp *controlplane.ControlPlane) error {
	step(out, "Creating the Node "+localNode)
	if _, err := cp.Client().CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: localNode}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create node %s: %w", localNode, err)
	}
	return nil
}

// serveUntilDone is --serve: the control plane with the blog's Service,
// its endpoints and its Node, served until ctx ends; then it is stopped
// and its data removed. The `export KUBECONFIG=` line is printed once
// everything is in place.
func serveUntilDone(ctx context.Context, out io.Writer) error {
	_, cp, err := startBlog(ctx, out)
	if err != nil {
		return err
	}
	defer stopControlPlane(out, cp)
	if err := createNode(ctx, out, cp); err != nil {
		return err
	}
	step(out, fmt.Sprintf("Serving the blog's Service (service-proxy-name %s; node %s holds two of its endpoints) until interrupted (Ctrl-C, SIGTERM). In another shell:", serviceProxyName, localNode))
	fmt.Fprintf(out, "export KUBECONFIG=%s\n", cp.KubeconfigPath())
	fmt.Fprintf(out, "    NODE_NAME=%s go run ./examples/json --service-proxy-name=%s   # or your program\n", localNode, serviceProxyName)
	<-ctx.Done()
	fmt.Fprintln(out)
	return nil
}

func run(ctx context.Context, out io.Writer) error {
	root, cp, err := startBlog(ctx, out)
	if err != nil {
		return err
	}
	defer stopControlPlane(out, cp)

	bin := filepath.Join(cp.Dir(), "kpng-json")
	step(out, "Building kpng-json (examples/json)")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./examples/json")
	build.Dir, build.Stdout, build.Stderr = root, os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("build kpng-json: %w", err)
	}

	if err := createNode(ctx, out, cp); err != nil {
		return err
	}

	metricsAddr, err := freeLoopback()
	if err != nil {
		return err
	}
	healthAddr, err := freeLoopback()
	if err != nil {
		return err
	}
	args := []string{"--kubeconfig=" + cp.KubeconfigPath(), "--service-proxy-name=" + serviceProxyName,
		"--metrics-bind-address=" + metricsAddr, "--healthz-bind-address=" + healthAddr, "--debug-bind-address=" + metricsAddr}
	step(out, fmt.Sprintf("Running NODE_NAME=%s kpng-json %s", localNode, strings.Join(args, " ")))
	var stdout, stderr syncBuffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "NODE_NAME="+localNode)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("kpng-json: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	metricsText, err := waitApplied(metricsAddr, exited)
	if err != nil {
		_ = cmd.Process.Kill()
		<-exited
		return fmt.Errorf("kpng-json: %w\n%s", err, stderr.String())
	}
	health := fetch("http://" + healthAddr + "/healthz")
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		_ = cmd.Process.Kill() // no SIGTERM (Windows)
	}
	if err := <-exited; err != nil {
		return fmt.Errorf("kpng-json after SIGTERM: %w\n%s", err, stderr.String())
	}
	if stdout.Len() == 0 {
		return fmt.Errorf("kpng-json printed nothing\n%s", stderr.String())
	}
	// kpng-json prints one compact object per line, like the blog's
	// `kpng-json | jq`, show them indented.
	dec := json.NewDecoder(&stdout)
	for dec.More() {
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return fmt.Errorf("kpng-json output: %w", err)
		}
		var pretty bytes.Buffer
		if err := json.Indent(&pretty, v, "", "  "); err != nil {
			return fmt.Errorf("kpng-json output: %w", err)
		}
		fmt.Fprintln(out, pretty.String())
	}

	step(out, "While it ran, kpng-json served its metrics and health (docs/operating.md):")
	fmt.Fprintf(out, "    http://%s/metrics              Prometheus metrics (kube-proxy's names, kpng_ prefix)\n", metricsAddr)
	fmt.Fprintf(out, "    http://%s%s  what the backend holds and what it refused (JSON)\n", metricsAddr, metrics.DebugPath)
	fmt.Fprintf(out, "    http://%s/healthz and /livez   health, as kube-proxy's\n", healthAddr)
	fmt.Fprintf(out, "    (a program of yours gets them with --metrics-bind-address, --healthz-bind-address and\n")
	fmt.Fprintf(out, "    --debug-bind-address; the debug endpoint is off unless asked for)\n")
	fmt.Fprintf(out, "  Some of the metrics:\n")
	for _, l := range strings.Split(metricsText, "\n") {
		for _, name := range []string{"kpng_services{", "kpng_endpoints{", "kpng_rounds_total{", "kpng_sync_proxy_rules_service_changes_total{", "kpng_sync_proxy_rules_duration_seconds_count{"} {
			if strings.HasPrefix(l, name) {
				fmt.Fprintf(out, "    %s\n", l)
			}
		}
	}
	fmt.Fprintf(out, "  /healthz: %s\n", strings.TrimSpace(health))
	return nil
}

func step(out io.Writer, msg string) { fmt.Fprintf(out, "==> %s\n", msg) }

// freeLoopback returns a loopback address with a port free a moment ago.
func freeLoopback() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// waitApplied waits until the metrics at addr say that a round was applied
// (kpng-json printed the state), and returns them; it gives up when the
// program exits or after 60 s.
func waitApplied(addr string, exited <-chan error) (string, error) {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return "", fmt.Errorf("exited before its first state: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
		text := fetch("http://" + addr + "/metrics")
		for _, l := range strings.Split(text, "\n") {
			if strings.HasPrefix(l, "kpng_sync_proxy_rules_last_timestamp_seconds{") && !strings.HasSuffix(l, " 0") {
				return text, nil
			}
		}
	}
	return "", fmt.Errorf("no state applied within 60s")
}

// fetch returns the body at url, or the error's text.
func fetch(url string) string {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// syncBuffer is a bytes.Buffer safe for the writes of a command and the
// reads of the demo.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Read(p)
}

func (b *syncBuffer) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Len()
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
