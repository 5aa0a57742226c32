// Package state_test checks the sample state file of `kpng file`
// (blog.yaml): it parses, and it is the state the README's blog example
// shows and the watcher gives for the blog's manifests on node-a.
package state_test

import (
	"bytes"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"sigs.k8s.io/kpng/localsink/statefile"
	"sigs.k8s.io/kpng/model"
)

// readmeBlogJSON returns the first ```json block of README.md's section
// "The blog's example": the state kpng-json prints for the blog's Service.
func readmeBlogJSON(t *testing.T) []byte {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := bytes.Cut(readme, []byte("\n## The blog's example\n"))
	if !ok {
		t.Fatal(`README.md has no section "The blog's example"`)
	}
	_, block, ok := bytes.Cut(section, []byte("\n```json\n"))
	if !ok {
		t.Fatal(`README.md's "The blog's example" has no json block`)
	}
	block, _, ok = bytes.Cut(block, []byte("\n```"))
	if !ok {
		t.Fatal("README.md: unterminated json block")
	}
	return block
}

// parseObjects parses a stream of JSON objects (kpng-json's output) as a
// state.
func parseObjects(t *testing.T, name string, data []byte) []*model.ServiceEndpoints {
	t.Helper()
	items, err := statefile.Parse([]byte("[" + strings.TrimSpace(string(data)) + "]"))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return items
}

func TestBlogStateFile(t *testing.T) {
	got, err := statefile.Read("blog.yaml")
	if err != nil {
		t.Fatalf("blog.yaml: %v", err)
	}
	if len(got) != 1 || len(got[0].Endpoints) != 4 {
		t.Fatalf("blog.yaml holds %d services, want the blog's one with 4 endpoints", len(got))
	}
	golden, err := os.ReadFile(filepath.Join("..", "json", "testdata", "kpng-example.golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	opts := []cmp.Option{cmpopts.EquateComparable(netip.Prefix{}), cmpopts.EquateEmpty()}
	for _, want := range []struct {
		name  string
		items []*model.ServiceEndpoints
	}{
		{"README.md's blog JSON", parseObjects(t, "README.md", readmeBlogJSON(t))},
		// What the watcher gives for examples/manifests on node-a
		// (examples/json's test checks it against a real API server).
		{"examples/json/testdata/kpng-example.golden.json", parseObjects(t, "golden", golden)},
	} {
		if diff := cmp.Diff(want.items, got, opts...); diff != "" {
			t.Errorf("blog.yaml differs from %s (-want +got):\n%s", want.name, diff)
		}
	}
}
