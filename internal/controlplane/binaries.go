package controlplane

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
)

const (
	// EnvBinaryDir names the environment variable that points at a directory
	// holding prebuilt kube-apiserver and etcd binaries. When it is set and
	// the directory holds both binaries, Binaries uses it instead of running
	// hack/build-controlplane.sh.
	EnvBinaryDir = "KPNG_CONTROLPLANE_DIR"

	// APIServerBinary is the file name of the kube-apiserver binary.
	APIServerBinary = "kube-apiserver"

	// EtcdBinary is the file name of the etcd binary.
	EtcdBinary = "etcd"

	// modulePath is the module whose root holds hack/build-controlplane.sh.
	modulePath = "sigs.k8s.io/kpng"

	// buildScript is the path of the build script relative to the root.
	buildScript = "hack/build-controlplane.sh"
)

var (
	binariesMu  sync.Mutex
	binariesDir string
)

// Binaries returns the directory that holds the kube-apiserver and etcd
// binaries of the test control plane.
//
// If $KPNG_CONTROLPLANE_DIR is set and holds both binaries, that directory
// is used. Otherwise Binaries runs hack/build-controlplane.sh of the
// sigs.k8s.io/kpng repository (found by walking up from the working
// directory, then from this source file) and returns the directory it
// prints. The script only builds when its cache is cold, which can take
// several minutes; its progress is copied to os.Stderr. A successful result
// is remembered for the life of the process.
func Binaries() (dir string, err error) {
	binariesMu.Lock()
	defer binariesMu.Unlock()
	if binariesDir != "" {
		return binariesDir, nil
	}

	if env := os.Getenv(EnvBinaryDir); env != "" {
		if err := checkBinaries(env); err == nil {
			binariesDir = env
			return env, nil
		} else {
			fmt.Fprintf(os.Stderr, "controlplane: ignoring $%s: %v; building with %s\n", EnvBinaryDir, err, buildScript)
		}
	}

	root, err := RepoRoot()
	if err != nil {
		return "", fmt.Errorf("locating %s: %w", buildScript, err)
	}
	dir, err = runBuildScript(root)
	if err != nil {
		return "", err
	}
	if err := checkBinaries(dir); err != nil {
		return "", fmt.Errorf("%s printed %q: %w", buildScript, dir, err)
	}
	binariesDir = dir
	return dir, nil
}

// checkBinaries reports whether dir holds both executables.
func checkBinaries(dir string) error {
	for _, name := range []string{APIServerBinary, EtcdBinary} {
		p := filepath.Join(dir, name)
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("checking control plane binary: %w", err)
		}
		if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			return fmt.Errorf("control plane binary %s is not an executable file", p)
		}
	}
	return nil
}

// runBuildScript runs the build script of the repository at root and returns
// the last line it prints on stdout.
func runBuildScript(root string) (string, error) {
	script := filepath.Join(root, buildScript)
	var stdout bytes.Buffer
	cmd := exec.Command("bash", script)
	cmd.Dir = root
	cmd.Stdout = &stdout
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("running %s: %w", script, err)
	}
	var last string
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); line != "" {
			last = line
		}
	}
	if last == "" {
		return "", fmt.Errorf("running %s: it printed no directory on stdout", script)
	}
	return last, nil
}

// RepoRoot returns the root directory of the sigs.k8s.io/kpng module: the
// closest directory, walking up from the working directory (and then from
// this source file, for builds without -trimpath), whose go.mod declares
// module sigs.k8s.io/kpng.
func RepoRoot() (string, error) {
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		starts = append(starts, filepath.Dir(file))
	}
	for _, start := range starts {
		if root, ok := findModuleRoot(start); ok {
			return root, nil
		}
	}
	return "", fmt.Errorf("no go.mod declaring module %s above %s", modulePath, strings.Join(starts, " or "))
}

// findModuleRoot walks up from dir to the directory whose go.mod declares
// modulePath.
func findModuleRoot(dir string) (string, bool) {
	dir = filepath.Clean(dir)
	for {
		if declaresModule(filepath.Join(dir, "go.mod")) {
			return dir, true
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", false
		}
		dir = parent
	}
}

// declaresModule reports whether the go.mod file at path declares modulePath.
func declaresModule(path string) bool {
	data, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	for line := range strings.Lines(string(data)) {
		fields := strings.Fields(line)
		if len(fields) >= 2 && fields[0] == "module" {
			return strings.Trim(fields[1], `"`) == modulePath
		}
	}
	return false
}
