// Command kpng-vulndb lays a folder of OSV reports (the data/osv folder of
// the golang.org/x/vulndb module) out as the vulnerability database that
// govulncheck reads with -db file://DIR, for `make vulncheck`, which cannot
// reach the online database:
//
//	DIR/index/db.json       {"modified": the latest modification of a report}
//	DIR/index/modules.json  for each module, the reports that affect it
//	DIR/ID/<id>.json        each report, as it is
//
// The module index names no fixed version: that is an optional hint,
// which govulncheck uses only to skip fetching a report; without it,
// govulncheck reads each report of a module and matches the module's
// version against the report's own ranges. vulndb's cmd/indexdb writes
// the same layout, but building it fetches and compiles vulndb's
// dependencies (some 1.4 GB of modules, minutes); this one is the
// standard library only.
//
// Usage: kpng-vulndb -osv DIR -out DIR (out must not exist).
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

func main() {
	osvDir := flag.String("osv", "", "folder of OSV JSON reports (vulndb's data/osv)")
	out := flag.String("out", "", "folder to write the database to (must not exist)")
	flag.Parse()
	if *osvDir == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "usage: kpng-vulndb -osv DIR -out DIR")
		os.Exit(2)
	}
	n, err := build(*osvDir, *out)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kpng-vulndb: %v\n", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "kpng-vulndb: %d reports in %s\n", n, *out)
}

// report is what the index needs of an OSV report.
type report struct {
	ID       string    `json:"id"`
	Modified time.Time `json:"modified"`
	Affected []struct {
		Package struct {
			Name string `json:"name"`
		} `json:"package"`
	} `json:"affected"`
}

// moduleVuln is an entry of the module index.
type moduleVuln struct {
	ID       string    `json:"id"`
	Modified time.Time `json:"modified"`
}

// module is the module index's entry of one module.
type module struct {
	Path  string       `json:"path"`
	Vulns []moduleVuln `json:"vulns"`
}

// build writes the database of the reports in osvDir to out and returns
// how many reports it holds.
func build(osvDir, out string) (int, error) {
	if _, err := os.Stat(out); err == nil {
		return 0, fmt.Errorf("%s exists", out)
	}
	files, err := filepath.Glob(filepath.Join(osvDir, "*.json"))
	if err != nil {
		return 0, err
	}
	if len(files) == 0 {
		return 0, fmt.Errorf("no report (*.json) in %s", osvDir)
	}
	for _, dir := range []string{"index", "ID"} {
		if err := os.MkdirAll(filepath.Join(out, dir), 0o755); err != nil {
			return 0, err
		}
	}
	modules := map[string]*module{}
	var latest time.Time
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return 0, err
		}
		var r report
		if err := json.Unmarshal(data, &r); err != nil {
			return 0, fmt.Errorf("report %s: %w", f, err)
		}
		if r.ID == "" || strings.ContainsAny(r.ID, `/\`) || r.ID+".json" != filepath.Base(f) {
			return 0, fmt.Errorf("report %s: id %q does not name the file", f, r.ID)
		}
		if r.Modified.After(latest) {
			latest = r.Modified
		}
		seen := map[string]bool{}
		for _, a := range r.Affected {
			path := a.Package.Name
			if path == "" || seen[path] {
				continue
			}
			seen[path] = true
			m := modules[path]
			if m == nil {
				m = &module{Path: path}
				modules[path] = m
			}
			m.Vulns = append(m.Vulns, moduleVuln{ID: r.ID, Modified: r.Modified})
		}
		if err := os.WriteFile(filepath.Join(out, "ID", r.ID+".json"), data, 0o644); err != nil {
			return 0, err
		}
	}
	index := make([]*module, 0, len(modules))
	for _, m := range modules {
		index = append(index, m)
	}
	slices.SortFunc(index, func(a, b *module) int { return strings.Compare(a.Path, b.Path) })
	if err := writeJSON(filepath.Join(out, "index", "modules.json"), index); err != nil {
		return 0, err
	}
	if err := writeJSON(filepath.Join(out, "index", "db.json"), map[string]time.Time{"modified": latest}); err != nil {
		return 0, err
	}
	return len(files), nil
}

func writeJSON(path string, v any) error {
	var b bytes.Buffer
	if err := json.NewEncoder(&b).Encode(v); err != nil {
		return errors.Join(fmt.Errorf("encode %s", path), err)
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}
