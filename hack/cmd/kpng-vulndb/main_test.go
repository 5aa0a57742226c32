package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestBuild lays out two reports (one affecting two modules, one affecting
// the standard library) and checks the database govulncheck reads: the
// module index lists each report under each module it names, once; the
// db's modification time is the latest; each report is copied as it is.
func TestBuild(t *testing.T) {
	osv := t.TempDir()
	reports := map[string]string{
		"GO-2026-0001": `{"id":"GO-2026-0001","modified":"2026-01-02T00:00:00Z","affected":[
			{"package":{"name":"golang.org/x/net"},"ranges":[{"type":"SEMVER","events":[{"introduced":"0"},{"fixed":"0.62.0"}]}]},
			{"package":{"name":"golang.org/x/net"},"ranges":[]},
			{"package":{"name":"example.com/m"}}]}`,
		"GO-2026-0002": `{"id":"GO-2026-0002","modified":"2026-03-04T00:00:00Z","affected":[{"package":{"name":"stdlib"}}]}`,
	}
	for id, text := range reports {
		if err := os.WriteFile(filepath.Join(osv, id+".json"), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(t.TempDir(), "db")
	n, err := build(osv, out)
	if err != nil || n != 2 {
		t.Fatalf("build: %d reports, %v", n, err)
	}
	var modules []struct {
		Path  string
		Vulns []struct{ ID string }
	}
	read(t, filepath.Join(out, "index", "modules.json"), &modules)
	got := map[string][]string{}
	for _, m := range modules {
		for _, v := range m.Vulns {
			got[m.Path] = append(got[m.Path], v.ID)
		}
	}
	want := map[string][]string{"example.com/m": {"GO-2026-0001"}, "golang.org/x/net": {"GO-2026-0001"}, "stdlib": {"GO-2026-0002"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("module index (-want +got):\n%s", diff)
	}
	var db struct{ Modified string }
	read(t, filepath.Join(out, "index", "db.json"), &db)
	if db.Modified != "2026-03-04T00:00:00Z" {
		t.Errorf("db modified %q, want the latest report's", db.Modified)
	}
	for id, text := range reports {
		if b, err := os.ReadFile(filepath.Join(out, "ID", id+".json")); err != nil || string(b) != text {
			t.Errorf("ID/%s.json: %q, %v", id, b, err)
		}
	}
	// A report whose id does not name its file is refused.
	if err := os.WriteFile(filepath.Join(osv, "GO-2026-0003.json"), []byte(`{"id":"../x"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := build(osv, filepath.Join(t.TempDir(), "db")); err == nil || !strings.Contains(err.Error(), "does not name the file") {
		t.Errorf("a report with a bad id: %v", err)
	}
}

func read(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
