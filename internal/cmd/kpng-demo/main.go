// Command kpng-demo is `make demo`: it starts a local kube-apiserver and etcd
// on loopback, applies the blog post's Service, application and
// EndpointSlices, runs kpng-json against them once, pretty-prints what it
// says, and cleans everything up.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"sigs.k8s.io/kpng/internal/controlplane"
	"sigs.k8s.io/kpng/internal/manifests"
)

// localNode is the node the demo's proxier runs for; the manifests place one
// IPv4 and one IPv6 endpoint on it.
const localNode = "node-a"

func main() {
	if err := run(context.Background(), os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "kpng-demo: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out io.Writer) error {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return err
	}
	step(out, "Starting kube-apiserver and etcd on loopback")
	cp, err := controlplane.Start()
	if err != nil {
		return fmt.Errorf("start control plane: %w", err)
	}
	defer func() {
		step(out, "Stopping the control plane and removing its data")
		if err := cp.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "kpng-demo: stop control plane: %v\n", err)
		}
	}()
	fmt.Fprintf(out, "    API server %s, kubeconfig %s\n", cp.Host(), cp.KubeconfigPath())

	for _, m := range []string{"kpng-example.yaml", "kpng-example-app.yaml", "kpng-example-endpointslices.yaml"} {
		step(out, "Applying examples/manifests/"+m)
		if err := manifests.ApplyFile(ctx, cp.Client(), filepath.Join(root, "examples", "manifests", m)); err != nil {
			return err
		}
	}

	bin := filepath.Join(cp.Dir(), "kpng-json")
	step(out, "Building kpng-json (examples/json)")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./examples/json")
	build.Dir, build.Stdout, build.Stderr = root, os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("build kpng-json: %w", err)
	}

	args := []string{"--kubeconfig=" + cp.KubeconfigPath(), "--service-proxy-name=kpng-example", "--once"}
	step(out, fmt.Sprintf("Running NODE_NAME=%s kpng-json %s", localNode, strings.Join(args, " ")))
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "NODE_NAME="+localNode)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("kpng-json: %w\n%s", err, stderr.String())
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
	return nil
}

func step(out io.Writer, msg string) { fmt.Fprintf(out, "==> %s\n", msg) }
