package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/kpng/internal/controlplane"
)

// TestOutsideModuleEmbedsNFT builds, in a module of its own outside the
// repository, the blog's program with the nftables backend linked in (a
// blank import): `go mod tidy` then `go build` must succeed, which they do
// not when a package of the backend imports a package that only its tests
// should need (the outside module's go.sum then lacks what that package
// needs). It needs the module proxy (or a filled module cache): it skips
// with -short.
func TestOutsideModuleEmbedsNFT(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: go mod tidy may need the network")
	}
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	gomod := fmt.Sprintf("module example.com/kpngembed\n\ngo 1.26.0\n\nrequire sigs.k8s.io/kpng v0.0.0\n\nreplace sigs.k8s.io/kpng => %s\n", root)
	// The blog's program, with the backend's package linked in.
	program := strings.Replace(blogProgram, `"sigs.k8s.io/kpng/client"`,
		"\"sigs.k8s.io/kpng/client\"\n        _ \"sigs.k8s.io/kpng/backends/nft\"", 1)
	for name, content := range map[string]string{"go.mod": gomod, "main.go": program} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{"GOWORK=off", "GOFLAGS=", "GOOS=linux"}
	run(t, dir, env, "go", "mod", "tidy")
	run(t, dir, env, "go", "build", "-o", filepath.Join(dir, "blog-backend"), ".")
}
