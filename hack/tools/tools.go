//go:build tools

// Package tools pins the binaries of the test control plane (kube-apiserver
// and etcd). It lives in its own module so that k8s.io/kubernetes and its
// replace directives never reach the library module sigs.k8s.io/kpng.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
