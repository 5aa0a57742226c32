//go:build linux

package controlplane

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"syscall"
)

// sysProcAttr makes a child die with the test process (SIGKILL on parent
// death), so an aborted test never leaks an etcd or kube-apiserver.
//
// Pdeathsig is tied to the OS thread that started the child; the Go runtime
// only retires threads of goroutines that exit while locked with
// runtime.LockOSThread, which this package never does.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// processAlive reports whether a process with the given pid exists and is
// not a zombie (a killed test binary may stay one for a while when its parent
// does not reap it).
func processAlive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// The state follows the command name, which is in parentheses.
	i := bytes.LastIndexByte(stat, ')')
	fields := bytes.Fields(stat[i+1:])
	return i < 0 || len(fields) == 0 || string(fields[0]) != "Z"
}
