package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/kpng/internal/controlplane"
	"sigs.k8s.io/kpng/internal/manifests"
)

var (
	cp     *controlplane.ControlPlane
	update = flag.Bool("update", false, "rewrite the golden files")
)

func TestMain(m *testing.M) { controlplane.Main(m, &cp) }

// blogProgram is the backend from the blog post, verbatim.
const blogProgram = `package main
import (
        "os"
        "encoding/json"
        "sigs.k8s.io/kpng/client"
)
func main() {
        client.Run(jsonPrint)
}
func jsonPrint(items []*client.ServiceEndpoints) {
        enc := json.NewEncoder(os.Stdout)
        for _, item := range items {
                _ = enc.Encode(item)
        }
}
`

// TestBlogExample builds the blog's program in a module of its own that
// requires sigs.k8s.io/kpng, runs it and kpng-json against the blog's
// Service on a real API server, and checks the output: the golden file, the
// blog's JSON (every field the blog shows, with the same value), and the
// blog's jq expressions.
func TestBlogExample(t *testing.T) {
	cp.Require(t)
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, m := range []string{"kpng-example.yaml", "kpng-example-endpointslices.yaml"} {
		if err := manifests.ApplyFile(ctx, cp.Client(), filepath.Join(root, "examples", "manifests", m)); err != nil {
			t.Fatal(err)
		}
	}

	outside := buildOutsideModule(t, root)
	kpngJSON := filepath.Join(t.TempDir(), "kpng-json")
	run(t, root, nil, "go", "build", "-o", kpngJSON, "./examples/json")

	var outputs []string
	for _, bin := range []string{outside, kpngJSON} {
		out := run(t, "", []string{"NODE_NAME=node-a"}, bin,
			"--kubeconfig="+cp.KubeconfigPath(), "--service-proxy-name=kpng-example", "--once")
		outputs = append(outputs, out)
	}
	if outputs[0] != outputs[1] {
		t.Errorf("the blog's program and kpng-json differ:\n%s\n%s", outputs[0], outputs[1])
	}
	out := outputs[0]
	if strings.Count(out, "\n") != 1 {
		t.Fatalf("want one JSON line (one service), got:\n%s", out)
	}

	golden := filepath.Join("testdata", "kpng-example.golden.json")
	if *update {
		if err := os.WriteFile(golden, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if out != string(want) {
		t.Errorf("output differs from %s (run with -update if intended):\ngot:  %s\nwant: %s", golden, out, want)
	}

	var got, blog any
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	blogJSON, err := os.ReadFile(filepath.Join("testdata", "blog-post.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(blogJSON, &blog); err != nil {
		t.Fatal(err)
	}
	if path := missing(got, blog, "$"); path != "" {
		t.Errorf("output lacks the blog's %s:\n%s", path, out)
	}

	jq, err := exec.LookPath("jq")
	if err != nil {
		t.Fatalf("jq is needed to check the blog's jq expressions: %v (apt-get install jq)", err)
	}
	for expr, want := range map[string]string{
		".Service.IPs.ExternalIPs.V6[0]":                                         "1000::55",
		".Endpoints[]|select(.Local == true)|select(.IPs.V6 != null)|.IPs.V6[0]": "1100::202",
		".Endpoints[]|select(.Local == true)|select(.IPs.V4 != null)|.IPs.V4[0]": "11.0.2.2",
	} {
		cmd := exec.Command(jq, "-r", expr)
		cmd.Stdin = strings.NewReader(out)
		res, err := cmd.Output()
		if err != nil {
			t.Errorf("jq %s: %v", expr, err)
			continue
		}
		if got := strings.TrimSpace(string(res)); got != want {
			t.Errorf("jq -r '%s' = %q, want %q", expr, got, want)
		}
	}
}

// buildOutsideModule writes the blog's program into a fresh module that
// requires sigs.k8s.io/kpng (replaced by this checkout) and builds it.
func buildOutsideModule(t *testing.T, root string) string {
	t.Helper()
	dir := t.TempDir()
	gomod := fmt.Sprintf("module example.com/kpngblog\n\ngo 1.26.0\n\nrequire sigs.k8s.io/kpng v0.0.0\n\nreplace sigs.k8s.io/kpng => %s\n", root)
	for name, content := range map[string]string{"go.mod": gomod, "main.go": blogProgram} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{"GOWORK=off", "GOFLAGS=-mod=mod"}
	run(t, dir, env, "go", "mod", "tidy")
	bin := filepath.Join(dir, "blog-backend")
	run(t, dir, env, "go", "build", "-o", bin, ".")
	return bin
}

func run(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String()
}

// missing returns the path of the first part of want that got lacks, or ""
// when got holds all of want. Lists match whatever the order.
func missing(got, want any, path string) string {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return path
		}
		for k, wv := range w {
			gv, ok := g[k]
			if !ok {
				return path + "." + k
			}
			if p := missing(gv, wv, path+"."+k); p != "" {
				return p
			}
		}
		return ""
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return path
		}
		used := make([]bool, len(g))
	next:
		for i, wv := range w {
			for j, gv := range g {
				if !used[j] && missing(gv, wv, "") == "" {
					used[j] = true
					continue next
				}
			}
			return fmt.Sprintf("%s[%d]", path, i)
		}
		return ""
	default:
		if !reflect.DeepEqual(got, want) {
			return path
		}
		return ""
	}
}
