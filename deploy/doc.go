// Package deploy holds what runs kpng's reference proxiers in a cluster:
// the DaemonSets in this directory (kpng-nft.yaml for `kpng kube … to-local
// to-nft`, kpng-iptables.yaml for `… to-local to-iptables`, beside
// kube-proxy; kpng-default-nft.yaml, kpng-default-iptables.yaml and
// kpng-default-userspace.yaml, `… to-local to-userspace`, in its place;
// each with its ServiceAccount and least-privilege RBAC); the controller
// kpng-controller.yaml (`kpng kube … to-api`, two replicas behind a
// headless Service, with TLS) and kpng-nft-node.yaml, the node backends
// that connect to it (`kpng api … to-local to-nft`), whose certificates
// kpng-controller-certs.sh makes with openssl; and, at the repository's
// root, the Dockerfile of the images they run. docs/operating.md and
// docs/controller.md explain them.
//
// The package has no code, only tests, because Docker is not needed to
// check them: the tests build the image's programs exactly as the
// Dockerfile does (its `make image-binaries` line, run as written) and
// check the paths it copies (static, stripped executables); they decode the
// manifests strictly, dry-run every object against a real API server, run
// the watcher with the ServiceAccount's permissions, and run each backend in
// a network namespace with exactly the capabilities its DaemonSet grants,
// and with one fewer.
package deploy
