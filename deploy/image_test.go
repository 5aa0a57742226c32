package deploy_test

import (
	"bytes"
	"debug/buildinfo"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
)

// root is the repository's root, the Docker build context.
const root = ".."

// imagePrograms are the programs the image must hold (the controller, the
// blog's programs, the reference backends' own programs).
var imagePrograms = []string{"kpng", "kpng-json", "kpng-callout", "kpng-userspace", "kpng-allip"}

// imageBuild is the build stage of the Dockerfile, run here.
type imageBuild struct {
	df *dockerfile
	// out is the local directory standing for the build stage's output
	// directory outDir (IMAGE_BIN_DIR in its make line).
	out, outDir string
	// makeArgs are the arguments of the make line, as run.
	makeArgs []string
}

// local returns the local path of a path in the build stage's output.
func (b *imageBuild) local(p string) (string, bool) {
	rel, ok := strings.CutPrefix(path.Clean(p), b.outDir+"/")
	if !ok {
		return "", false
	}
	return filepath.Join(b.out, filepath.FromSlash(rel)), true
}

var (
	buildOnce sync.Once
	built     *imageBuild
	buildErr  error
)

// buildImage runs the Dockerfile's build stage as it is written, once per
// test process: its `make image-binaries …` line, with the build
// platform's architecture for ${TARGETARCH} and bin/image-test for its
// output directory. The output is kept in bin/ (ignored by git), so that
// nothing is left in the temporary directory.
func buildImage(t *testing.T) *imageBuild {
	t.Helper()
	buildOnce.Do(func() { built, buildErr = runBuildStage() })
	if buildErr != nil {
		t.Fatalf("the Dockerfile's build stage: %v", buildErr)
	}
	return built
}

func runBuildStage() (*imageBuild, error) {
	df, err := parseDockerfile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		return nil, err
	}
	build := df.stage("build")
	if build == nil {
		return nil, fmt.Errorf("no stage named build")
	}
	vars := map[string]string{"TARGETARCH": runtime.GOARCH, "TARGETOS": "linux"}
	for k, v := range df.args {
		vars[k] = v
	}
	var line []string
	for _, run := range build.all("RUN") {
		if i := slices.Index(run.args, "make"); i >= 0 && slices.Contains(run.args[i+1:], "image-binaries") {
			if line != nil {
				return nil, fmt.Errorf("two RUN lines run make image-binaries")
			}
			line = run.args[i+1:]
		}
	}
	if line == nil {
		return nil, fmt.Errorf("the build stage does not RUN make image-binaries")
	}
	b := &imageBuild{df: df}
	if b.out, err = filepath.Abs(filepath.Join(root, "bin", "image-test")); err != nil {
		return nil, err
	}
	for _, a := range line {
		a, err := expand(a, vars)
		if err != nil {
			return nil, fmt.Errorf("make line: %w", err)
		}
		if dir, ok := strings.CutPrefix(a, "IMAGE_BIN_DIR="); ok {
			b.outDir = path.Clean(dir)
			a = "IMAGE_BIN_DIR=" + b.out
		}
		b.makeArgs = append(b.makeArgs, a)
	}
	if b.outDir == "" || !path.IsAbs(b.outDir) {
		return nil, fmt.Errorf("make line %q: want IMAGE_BIN_DIR=<absolute directory>", strings.Join(line, " "))
	}
	if err := os.RemoveAll(b.out); err != nil {
		return nil, err
	}
	cmd := exec.Command("make", append([]string{"-C", root}, b.makeArgs...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("make %s: %v\n%s", strings.Join(b.makeArgs, " "), err, out)
	}
	return b, nil
}

// goVersion returns the Go that builds kpng: go.mod's toolchain line
// ("1.27.3"), or else its go directive, major.minor ("1.26").
func goVersion(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if m := regexp.MustCompile(`(?m)^toolchain go(\d+\.\d+\.\d+)$`).FindSubmatch(data); m != nil {
		return string(m[1])
	}
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(data)
	if m == nil {
		t.Fatal("go.mod: no go directive")
	}
	return string(m[1])
}

// imageStages are the Dockerfile's images after its build stage: the stage
// name (empty for the last, the default target), the image's name in the
// manifests, its base, the Debian packages it installs, the programs it
// holds.
var imageStages = []struct {
	stage, image, base string
	packages, programs []string
}{
	{"nft", "registry.example/kpng-nft", "scratch", nil, []string{"kpng"}},
	{"iptables", "registry.example/kpng-iptables", "debian-slim", []string{"iptables"}, []string{"kpng"}},
	{"", "registry.example/kpng", "debian-slim", []string{"iptables", "jq"}, imagePrograms},
}

// stageOf returns the stage that builds the image named image (a manifest's
// image: without its tag).
func stageOf(t *testing.T, df *dockerfile, image string) *stage {
	t.Helper()
	for i, is := range imageStages {
		if is.image == image {
			return df.stages[i+1]
		}
	}
	t.Fatalf("image %s: no stage of the Dockerfile builds it", image)
	return nil
}

func TestDockerfileStages(t *testing.T) {
	df, err := parseDockerfile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	if len(df.stages) != 1+len(imageStages) {
		t.Fatalf("%d stages, want %d: build, then the images nft, iptables and the full one", len(df.stages), 1+len(imageStages))
	}
	build := df.stages[0]
	if build.name != "build" {
		t.Errorf("first stage named %q, want build", build.name)
	}
	if want := "golang:" + goVersion(t) + "-"; !strings.HasPrefix(build.base, want) {
		t.Errorf("build stage FROM %s, want %s… (go.mod's toolchain)", build.base, want)
	}
	for i, is := range imageStages {
		st := df.stages[i+1]
		if st.name != is.stage {
			t.Errorf("stage %d named %q, want %q", i+1, st.name, is.stage)
		}
		// The base: nothing, or Debian (its iptables package), slim.
		switch is.base {
		case "scratch":
			if st.base != "scratch" {
				t.Errorf("stage %q FROM %s, want scratch: it runs no program but kpng", is.stage, st.base)
			}
		case "debian-slim":
			if !regexp.MustCompile(`^debian:[a-z]+-slim(@sha256:[0-9a-f]{64})?$`).MatchString(st.base) {
				t.Errorf("stage %q FROM %s, want debian:<release>-slim", is.stage, st.base)
			}
		}
		var installed []string
		for _, run := range st.all("RUN") {
			if i := slices.Index(run.args, "install"); i > 0 && run.args[i-1] == "apt-get" {
				for _, w := range run.args[i+1:] {
					if w == "&&" {
						break
					}
					if !strings.HasPrefix(w, "-") {
						installed = append(installed, w)
					}
				}
			}
		}
		// iptables: the binaries to-local to-iptables runs; jq: what
		// kpng-example-allip (and the blog's CALLOUT=jq) runs. Nothing
		// else.
		slices.Sort(installed)
		if !slices.Equal(installed, is.packages) {
			t.Errorf("stage %q installs %v, want %v", is.stage, installed, is.packages)
		}
		var copied []string
		for _, cp := range st.all("COPY") {
			for _, src := range cp.args[:len(cp.args)-1] {
				copied = append(copied, path.Base(src))
			}
		}
		for _, p := range is.programs {
			if !slices.Contains(copied, p) {
				t.Errorf("stage %q does not copy %s (copies %v)", is.stage, p, copied)
			}
		}
		if len(copied) != len(is.programs) && is.stage != "" {
			t.Errorf("stage %q copies %v, want only %v", is.stage, copied, is.programs)
		}
	}
}

func TestImageBinaries(t *testing.T) {
	b := buildImage(t)
	final := b.df.stages[len(b.df.stages)-1]
	copied := map[string]string{} // name in /usr/local/bin → local path
	for _, cp := range final.all("COPY") {
		if len(cp.args) < 2 {
			t.Fatalf("line %d: COPY %v: want sources and a destination", cp.line, cp.args)
		}
		srcs, dst := cp.args[:len(cp.args)-1], cp.args[len(cp.args)-1]
		for _, src := range srcs {
			var local string
			switch from := cp.flags["from"]; from {
			case "build":
				l, ok := b.local(src)
				if !ok {
					t.Errorf("line %d: COPY --from=build %s: not in the build's output %s", cp.line, src, b.outDir)
					continue
				}
				local = l
			case "":
				local = filepath.Join(root, filepath.FromSlash(src))
			default:
				t.Errorf("line %d: COPY --from=%s: no such stage", cp.line, from)
				continue
			}
			fi, err := os.Stat(local)
			if err != nil {
				t.Errorf("line %d: COPY %s: %v", cp.line, src, err)
				continue
			}
			if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 != 0o111 {
				t.Errorf("line %d: COPY %s: mode %v, want an executable file", cp.line, src, fi.Mode())
			}
			if path.Clean(dst) != "/usr/local/bin" && path.Dir(dst) != "/usr/local/bin" {
				t.Errorf("line %d: COPY %s to %s, want /usr/local/bin (in $PATH)", cp.line, src, dst)
			}
			name := path.Base(src)
			if !strings.HasSuffix(dst, "/") && path.Clean(dst) != "/usr/local/bin" {
				name = path.Base(dst)
			}
			copied[name] = local
		}
	}

	// Every program built is copied, and the image has every program.
	entries, err := os.ReadDir(b.out)
	if err != nil {
		t.Fatal(err)
	}
	var builtNames []string
	for _, e := range entries {
		builtNames = append(builtNames, e.Name())
		if l, ok := copied[e.Name()]; !ok || filepath.Dir(l) != b.out {
			t.Errorf("make image-binaries builds %s, which the Dockerfile does not copy", e.Name())
		}
	}
	sort.Strings(builtNames)
	for _, p := range imagePrograms {
		if _, ok := copied[p]; !ok {
			t.Errorf("the image has no %s (copied: %v)", p, keys(copied))
		}
	}

	for _, name := range builtNames {
		t.Run(name, func(t *testing.T) {
			file := filepath.Join(b.out, name)
			checkStaticStripped(t, file)
			bi := checkBuildInfo(t, file)
			checkMethodElimination(t, bi.Path)
			// It runs: its usage, exit status 0.
			out, err := exec.Command(file, "--help").CombinedOutput()
			if err != nil {
				t.Errorf("%s --help: %v\n%s", name, err, out)
			}
			if fi, err := os.Stat(file); err == nil {
				t.Logf("%s: %.1f MB", name, float64(fi.Size())/1e6)
			}
		})
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// checkStaticStripped checks that file is an ELF executable for this
// machine, statically linked (no program interpreter, no dynamic section)
// and stripped (no symbol table, no DWARF).
func checkStaticStripped(t *testing.T, file string) {
	t.Helper()
	f, err := elf.Open(file)
	if err != nil {
		t.Fatalf("%s: not ELF: %v", file, err)
	}
	defer f.Close()
	machines := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64, "386": elf.EM_386, "arm": elf.EM_ARM, "riscv64": elf.EM_RISCV, "ppc64le": elf.EM_PPC64, "s390x": elf.EM_S390}
	if want, ok := machines[runtime.GOARCH]; ok && f.Machine != want {
		t.Errorf("machine %v, want %v", f.Machine, want)
	}
	if f.Type != elf.ET_EXEC {
		t.Errorf("ELF type %v, want ET_EXEC (a static, non-PIE executable)", f.Type)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("program header %v: dynamically linked, want static", p.Type)
		}
	}
	for _, s := range f.Sections {
		if s.Name == ".symtab" || strings.HasPrefix(s.Name, ".debug_") || strings.HasPrefix(s.Name, ".zdebug_") {
			t.Errorf("section %s: not stripped", s.Name)
		}
	}
	if libs, err := f.ImportedLibraries(); err == nil && len(libs) > 0 {
		t.Errorf("needs shared libraries %v", libs)
	}
}

// checkBuildInfo checks the build settings recorded in file against the
// image's: no cgo, -trimpath, -tags grpcnotrace, linux. (-ldflags is not
// recorded with -trimpath: checkStaticStripped sees its -s -w.)
func checkBuildInfo(t *testing.T, file string) *buildinfo.BuildInfo {
	t.Helper()
	bi, err := buildinfo.ReadFile(file)
	if err != nil {
		t.Fatalf("build info: %v", err)
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	for k, ok := range map[string]func(string) bool{
		"CGO_ENABLED": func(v string) bool { return v == "0" },
		"-trimpath":   func(v string) bool { return v == "true" },
		"GOOS":        func(v string) bool { return v == "linux" },
		"-tags":       func(v string) bool { return slices.Contains(strings.Split(v, ","), "grpcnotrace") },
	} {
		if !ok(settings[k]) {
			t.Errorf("build setting %s=%q, not the image's", k, settings[k])
		}
	}
	return bi
}

// checkMethodElimination checks that the program imports neither
// text/template nor html/template: their calls of reflect's
// Value.MethodByName make the linker keep every exported method of every
// type (gRPC's golang.org/x/net/trace, left out by -tags grpcnotrace, cost
// 13 MB a program that way: docs/operating.md).
func checkMethodElimination(t *testing.T, pkg string) {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-tags=grpcnotrace", pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOOS=linux", "CGO_ENABLED=0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v: %s", pkg, err, stderr.String())
	}
	for _, dep := range strings.Fields(string(out)) {
		if dep == "text/template" || dep == "html/template" {
			t.Errorf("%s imports %s: the linker then keeps every exported method (see the Makefile's image-binaries)", pkg, dep)
		}
	}
}
