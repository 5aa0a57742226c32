//go:build !linux

package controlplane

import "syscall"

// sysProcAttr returns nil: only Linux can kill children on parent death, so
// elsewhere an aborted test may leave etcd and kube-apiserver running.
func sysProcAttr() *syscall.SysProcAttr {
	return nil
}
