//go:build linux

// Command kpng-pause is the pod sandbox of the one-machine cluster
// (hack/cluster, docs/cluster.md): the process that holds a pod's
// namespaces while its containers come and go. It waits for SIGTERM or
// SIGINT and exits 0, and as the first process of a pod that shares its
// process namespace, it reaps the orphans that are given to it; other
// signals are ignored. Built
// static, it is the whole of the cluster's pause image.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	// The kernel drops the signals a namespace's first process has no
	// handler for, but Go handles every signal, and would exit on SIGHUP
	// or SIGQUIT (or SIGUSR1, SIGPIPE...) sent from the pod or the host:
	// ignore them, as a sandbox must outlive anything but a stop.
	signal.Ignore(syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGPIPE, syscall.SIGALRM)
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
