package doccheck

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// repoRoot is the module's root, two levels above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil || !strings.HasPrefix(string(gomod), "module sigs.k8s.io/kpng\n") {
		t.Fatalf("%s is not the root of sigs.k8s.io/kpng (go.mod: %v)", root, err)
	}
	return root
}

// packageDirs returns the directories of the module's packages, relative
// to root, as `go list ./...` lists them: every directory holding a .go
// file, but testdata, directories starting with . or _, and other modules
// (hack/tools).
func packageDirs(root string) ([]string, error) {
	seen := map[string]bool{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			name := d.Name()
			if rel != "." && (name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			if rel != "." {
				if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
					return filepath.SkipDir // another module
				}
			}
			return nil
		}
		if strings.HasSuffix(rel, ".go") && path.Dir(rel) != "." {
			seen[path.Dir(rel)] = true
		}
		return nil
	})
	dirs := make([]string, 0, len(seen))
	for d := range seen {
		dirs = append(dirs, d)
	}
	sort.Strings(dirs)
	return dirs, err
}

// mdFiles returns README.md and the Markdown files under docs/, relative
// to root.
func mdFiles(t *testing.T, root string) []string {
	t.Helper()
	files := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, _ := filepath.Rel(root, p)
			files = append(files, filepath.ToSlash(rel))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// line is one line of a Markdown file outside its fenced code blocks.
type line struct {
	n    int
	text string
}

// proseLines returns the lines of a Markdown file outside fenced code
// blocks (their links and code spans are not links and paths).
func proseLines(data string) []line {
	var out []line
	fenced := false
	sc := bufio.NewScanner(strings.NewReader(data))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		text := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(text), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			out = append(out, line{n, text})
		}
	}
	return out
}

var (
	linkRE     = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	codeSpanRE = regexp.MustCompile("`([^`]+)`")
	anchorRE   = regexp.MustCompile(`<a (?:id|name)="([^"]+)"`)
	// repoPathRE is what a repository path in a code span looks like:
	// slash-separated names, at least two of them.
	repoPathRE = regexp.MustCompile(`^(?:\./)?[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)+/?$`)
	identRE    = regexp.MustCompile(`\.[A-Z][A-Za-z0-9_]*$`)
)

// anchors returns the anchors of a Markdown file's headings, as GitHub
// makes them, and its explicit <a id> anchors.
func anchors(data string) map[string]bool {
	out := map[string]bool{}
	count := map[string]int{}
	for _, l := range proseLines(data) {
		for _, m := range anchorRE.FindAllStringSubmatch(l.text, -1) {
			out[m[1]] = true
		}
		if !strings.HasPrefix(l.text, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(l.text, "#"))
		slug := githubSlug(h)
		if c := count[slug]; c > 0 {
			out[fmt.Sprintf("%s-%d", slug, c)] = true
		} else {
			out[slug] = true
		}
		count[slug]++
	}
	return out
}

// githubSlug is GitHub's anchor of a heading: lower case, markup and
// punctuation dropped (but - and _), spaces made hyphens.
func githubSlug(h string) string {
	h = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`).ReplaceAllString(h, "$1") // links: their text
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_':
			b.WriteRune(r)
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r > 127 && isLetterOrDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func isLetterOrDigit(r rune) bool {
	return strings.ContainsRune("éèàçüöäñ", r) // the few non-ASCII letters headings may hold
}

// TestLinks: every relative link in README.md and docs/ points to a file
// or directory that exists, and its #anchor, into a Markdown file, to a
// heading or <a id> of that file.
func TestLinks(t *testing.T) {
	root := repoRoot(t)
	anchorCache := map[string]map[string]bool{}
	for _, f := range mdFiles(t, root) {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range proseLines(string(data)) {
			for _, m := range linkRE.FindAllStringSubmatch(l.text, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				file, frag, _ := strings.Cut(target, "#")
				resolved := f
				if file != "" {
					resolved = path.Join(path.Dir(f), file)
					if _, err := os.Stat(filepath.Join(root, resolved)); err != nil {
						t.Errorf("%s:%d: link %s: %s does not exist", f, l.n, target, resolved)
						continue
					}
				}
				if frag == "" || !strings.HasSuffix(resolved, ".md") {
					continue
				}
				a, ok := anchorCache[resolved]
				if !ok {
					d, err := os.ReadFile(filepath.Join(root, resolved))
					if err != nil {
						t.Fatal(err)
					}
					a = anchors(string(d))
					anchorCache[resolved] = a
				}
				if !a[frag] {
					t.Errorf("%s:%d: link %s: %s has no heading or anchor #%s", f, l.n, target, resolved, frag)
				}
			}
		}
	}
}

// TestCodeSpanPaths: a code span of README.md or docs/ that looks like a
// path of this repository (its first name is a top-level directory, or it
// starts with the module path) names a file or directory that exists. A
// trailing .Identifier (localsink/sinktest.Checker) is a Go name in that
// package.
func TestCodeSpanPaths(t *testing.T) {
	root := repoRoot(t)
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	topDirs := map[string]bool{}
	for _, e := range entries {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			topDirs[e.Name()] = true
		}
	}
	exists := func(p string) bool {
		_, err := os.Stat(filepath.Join(root, filepath.FromSlash(p)))
		return err == nil
	}
	for _, f := range mdFiles(t, root) {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range proseLines(string(data)) {
			for _, m := range codeSpanRE.FindAllStringSubmatch(l.text, -1) {
				p := strings.TrimPrefix(m[1], "sigs.k8s.io/kpng/")
				if !repoPathRE.MatchString(p) {
					continue
				}
				p = strings.TrimSuffix(strings.TrimPrefix(p, "./"), "/")
				if !topDirs[strings.SplitN(p, "/", 2)[0]] {
					continue
				}
				if exists(p) || exists(identRE.ReplaceAllString(p, "")) {
					continue
				}
				t.Errorf("%s:%d: `%s` names %s, which does not exist", f, l.n, m[1], p)
			}
		}
	}
}

// layoutTable returns the first column of each row of README.md's table
// under "## Layout".
func layoutTable(t *testing.T, root string) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n## Layout\n")
	if !ok {
		t.Fatal(`README.md has no "## Layout" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var cells []string
	for _, l := range strings.Split(section, "\n") {
		if !strings.HasPrefix(l, "|") || strings.HasPrefix(l, "|---") {
			continue
		}
		cells = append(cells, strings.Split(l, "|")[1])
	}
	if len(cells) < 2 {
		t.Fatal(`README.md's "## Layout" has no table`)
	}
	return cells[1:] // the header row
}

// TestLayoutTableListsEveryPackage: README.md's layout table names every
// package directory of the module (in a code span of a row's first
// column).
func TestLayoutTableListsEveryPackage(t *testing.T) {
	root := repoRoot(t)
	listed := map[string]bool{}
	for _, cell := range layoutTable(t, root) {
		for _, m := range codeSpanRE.FindAllStringSubmatch(cell, -1) {
			listed[strings.TrimSuffix(m[1], "/")] = true
		}
	}
	dirs, err := packageDirs(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) < 20 {
		t.Fatalf("found only %d package directories: %v", len(dirs), dirs)
	}
	for _, d := range dirs {
		if !listed[d] {
			t.Errorf("README.md's layout table does not list the package %s", d)
		}
	}
}

// TestGithubSlug pins the anchors the link check computes.
func TestGithubSlug(t *testing.T) {
	for h, want := range map[string]string{
		"The nftables backend":                    "the-nftables-backend",
		"1. Full state: `client.Run`":             "1-full-state-clientrun",
		"kpng kube, 10,000 services (2026-11-20)": "kpng-kube-10000-services-2026-11-20",
		"Side by side with kube-proxy":            "side-by-side-with-kube-proxy",
		"A [link](x.md) in a heading":             "a-link-in-a-heading",
	} {
		if got := githubSlug(h); got != want {
			t.Errorf("githubSlug(%q) = %q, want %q", h, got, want)
		}
	}
}
