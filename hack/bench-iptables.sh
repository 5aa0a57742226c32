#!/usr/bin/env bash
# Runs kube-proxy v1.36.3 (--proxy-mode=iptables) and
# `kpng kube … to-local to-iptables` side by side on the same state in
# the test control plane, for both iptables variants, and prints the
# table recorded in docs/benchmarks.md ("iptables backend: side by side
# with kube-proxy"). Needs root (network namespaces), iptables (both
# variants), iproute2. kube-proxy is built from the Go module proxy at the
# version pinned in hack/tools/go.mod, and cached with the control plane.
#
#   hack/bench-iptables.sh [kpng-sidebyside flags]
#
# e.g. --services=10000 --endpoints=10 --variants=legacy,nft
# --cold-timeout=10m (the default: 10,000 services, both variants).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"
dir="$(bash hack/build-controlplane.sh --with-kube-proxy | tail -n 1)"
export KPNG_CONTROLPLANE_DIR="${dir}"
bin="$(mktemp -d)"
trap 'rm -rf "${bin}"' EXIT
go build -o "${bin}/kpng" ./cmd/kpng
go build -o "${bin}/kpng-sidebyside" ./hack/cmd/kpng-sidebyside
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), kernel $(uname -r), $(iptables-legacy --version), $(iptables-nft --version)" >&2
"${bin}/kpng-sidebyside" --kube-proxy="${dir}/kube-proxy" --kpng="${bin}/kpng" --mode=iptables "$@"
