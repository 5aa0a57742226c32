//go:build linux

package controlplane

import "syscall"

// sysProcAttr makes a child die with the test process (SIGKILL on parent
// death), so an aborted test never leaks an etcd or kube-apiserver.
//
// Pdeathsig is tied to the OS thread that started the child; the Go runtime
// only retires threads of goroutines that exit while locked with
// runtime.LockOSThread, which this package never does.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
