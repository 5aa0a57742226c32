//go:build linux

// Command kpng-pause is the pod sandbox of the one-machine cluster
// (hack/cluster, docs/cluster.md): the process that holds a pod's
// namespaces while its containers come and go. It waits for SIGTERM or
// SIGINT and exits 0, and as the first process of a pod that shares its
// process namespace, it reaps the orphans that are given to it. Built
// static, it is the whole of the cluster's pause image.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	children := make(chan os.Signal, 1)
	signal.Notify(children, syscall.SIGCHLD)
	for {
		select {
		case s := <-stop:
			fmt.Fprintf(os.Stderr, "kpng-pause: %v, exiting\n", s)
			os.Exit(0)
		case <-children:
			reap()
		}
	}
}

// reap waits for every child that has exited, without blocking.
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
