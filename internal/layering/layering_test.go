// Package layering checks that the module's imports follow its folders:
// each top-level folder is a floor, and a package imports only from its
// own folder or from folders on lower floors, so that reading the tree
// from model/ upwards never meets a package that needs one above it.
package layering

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

const module = "sigs.k8s.io/kpng"

// floors are the product's top-level folders, from the ground up: a
// package may import packages of its own folder and of lower floors.
// Folders on the same floor do not import each other.
var floors = [][]string{
	{"model"},
	{"diffstore", "localsink"},
	{"api"},
	{"client"},
	{"backends"},
	{"cmd", "examples", "deploy"},
}

// tooling are the folders that are not part of the product: test
// harnesses (internal) and development programs (hack). They may import
// anything; the product imports them only where allowed lists it.
var tooling = []string{"internal", "hack"}

// allowed are the product packages that may import a tooling package,
// and which: the conformance kit, exported for outside backends' tests,
// builds its network namespaces with internal/netns.
var allowed = map[string][]string{
	module + "/backends/conformance": {module + "/internal/netns"},
}

// pkg is what go list prints of one package.
type pkg struct {
	ImportPath string
	Imports    []string
}

// folder returns the top-level folder of a package of the module.
func folder(importPath string) string {
	rel := strings.TrimPrefix(importPath, module+"/")
	top, _, _ := strings.Cut(rel, "/")
	return top
}

// floorOf returns the floor of a product folder, or -1 for tooling and
// -2 for a folder this test does not know.
func floorOf(top string) int {
	if slices.Contains(tooling, top) {
		return -1
	}
	for i, f := range floors {
		if slices.Contains(f, top) {
			return i
		}
	}
	return -2
}

// violations returns the imports of pkgs that run up or sideways across
// the floors, or from the product into tooling, and the folders that no
// floor names.
func violations(pkgs []pkg) []string {
	var out []string
	for _, p := range pkgs {
		from := folder(p.ImportPath)
		ff := floorOf(from)
		if ff == -2 {
			out = append(out, fmt.Sprintf("%s: folder %s/ is on no floor (add it to floors or tooling)", p.ImportPath, from))
			continue
		}
		if ff == -1 {
			continue
		}
		for _, imp := range p.Imports {
			if !strings.HasPrefix(imp, module+"/") {
				continue
			}
			to := folder(imp)
			if to == from {
				continue
			}
			switch tf := floorOf(to); {
			case tf == -1:
				if !slices.Contains(allowed[p.ImportPath], imp) {
					out = append(out, fmt.Sprintf("%s imports tooling package %s", p.ImportPath, imp))
				}
			case tf >= ff:
				out = append(out, fmt.Sprintf("%s (%s/, floor %d) imports %s (%s/, floor %d): an arrow up or sideways", p.ImportPath, from, ff, imp, to, tf))
			}
		}
	}
	return out
}

// list returns the module's packages (not their tests) for goos.
func list(t *testing.T, goos string) []pkg {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	cmd := exec.Command("go", "list", "-e", "-json=ImportPath,Imports", "./...")
	cmd.Dir = root
	cmd.Env = append(cmd.Environ(), "GOOS="+goos)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list ./... (GOOS=%s): %v\n%s", goos, err, stderr.Bytes())
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) == 0 {
		t.Fatal("go list ./... listed no package")
	}
	return pkgs
}

// TestFloors checks the module's import graph against the floors, for
// each system kpng builds for (some files are Linux or Windows only).
func TestFloors(t *testing.T) {
	for _, goos := range []string{"linux", "windows", "darwin"} {
		t.Run(goos, func(t *testing.T) {
			for _, v := range violations(list(t, goos)) {
				t.Error(v)
			}
		})
	}
}

// TestViolations checks that the check sees what it must refuse.
func TestViolations(t *testing.T) {
	pkgs := []pkg{
		{ImportPath: module + "/model"},
		{ImportPath: module + "/localsink", Imports: []string{module + "/model", "fmt"}},
		{ImportPath: module + "/model/endpoints", Imports: []string{module + "/model"}},
		// Up: the model importing the client.
		{ImportPath: module + "/model/bad", Imports: []string{module + "/client"}},
		// Sideways: two folders of one floor.
		{ImportPath: module + "/localsink/x", Imports: []string{module + "/diffstore"}},
		// The product importing a test harness.
		{ImportPath: module + "/client/x", Imports: []string{module + "/internal/controlplane"}},
		// The listed exception.
		{ImportPath: module + "/backends/conformance", Imports: []string{module + "/internal/netns"}},
		// Tooling may import anything.
		{ImportPath: module + "/hack/cmd/x", Imports: []string{module + "/cmd/kpng/app"}},
		{ImportPath: module + "/newfolder"},
	}
	got := violations(pkgs)
	want := []string{
		module + "/model/bad (model/, floor 0) imports " + module + "/client (client/, floor 3): an arrow up or sideways",
		module + "/localsink/x (localsink/, floor 1) imports " + module + "/diffstore (diffstore/, floor 1): an arrow up or sideways",
		module + "/client/x imports tooling package " + module + "/internal/controlplane",
		module + "/newfolder: folder newfolder/ is on no floor (add it to floors or tooling)",
	}
	if !slices.Equal(got, want) {
		t.Errorf("violations:\n got %q\nwant %q", got, want)
	}
}
