//go:build unix

package callout

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
)

// inNewProcessGroup makes cmd start in a process group of its own (its pgid
// is its pid), so that killProcessGroup reaches the children it starts too.
func inNewProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}

// killProcessGroup sends SIGKILL to the process group that cmd leads. It
// returns os.ErrProcessDone when the group no longer exists.
func killProcessGroup(cmd *exec.Cmd) error {
	if cmd.Process == nil {
		return os.ErrProcessDone
	}
	err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	if errors.Is(err, syscall.ESRCH) {
		return os.ErrProcessDone
	}
	return err
}
