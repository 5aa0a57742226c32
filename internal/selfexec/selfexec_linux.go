//go:build linux

// Package selfexec runs the test binary again as a helper process of a
// test (a proxier the test kills, say), and reads the lines it prints.
package selfexec

import (
	"bufio"
	"os"
	"os/exec"
	"syscall"
	"testing"
)

// Start runs the test binary (os.Args[0]) with no test selected and env
// added to its environment: the package's TestMain decides from env what
// the process does. The process gets SIGKILL when the test's thread ends
// (Pdeathsig) and at the test's cleanup; with group, it leads a process
// group of its own, and the cleanup kills the whole group (the commands it
// runs with it: see KillGroup). Its stderr is the test's. Start returns
// the process and the lines it prints on stdout, in a channel closed when
// its stdout closes.
func Start(t testing.TB, env []string, group bool) (*exec.Cmd, <-chan string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: group}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if group {
			_ = KillGroup(cmd)
		}
		_ = cmd.Process.Kill()
	})
	lines := make(chan string, 100)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	return cmd, lines
}

// KillGroup sends SIGKILL to the process group of cmd, started by Start
// with group.
func KillGroup(cmd *exec.Cmd) error {
	return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
}
