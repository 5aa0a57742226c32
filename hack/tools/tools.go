//go:build tools

// Package tools pins the binaries built from the Go module proxy for the
// tests and benchmarks: the test control plane (kube-apiserver and etcd)
// and kube-proxy, the peer of the side-by-side benchmarks
// (hack/bench-iptables.sh); and the rest of the one-machine cluster
// (hack/cluster): kubelet, kube-controller-manager, kube-scheduler,
// kubectl, and agnhost, the e2e tests' test program that the cluster's
// images are made of; and for Kubernetes' own network e2e tests
// (hack/tools/e2e, make e2e), the ginkgo program that runs them and
// regression-issue-74839, the program of one of their images. It lives in its own module so that
// k8s.io/kubernetes and its replace directives never reach the library
// module sigs.k8s.io/kpng.
package tools

import (
	_ "github.com/onsi/ginkgo/v2/ginkgo"

	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/test/images/agnhost"
	_ "k8s.io/kubernetes/test/images/regression-issue-74839"
)
