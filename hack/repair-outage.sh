#!/usr/bin/env bash
# Measures the outage of service traffic after another program changes a
# proxier's rules (nft flush ruleset, iptables -t nat -F, the table
# deleted, a base chain or jump removed), for kpng (to-nft, to-iptables
# with both variants) and kube-proxy v1.36.3 (nftables, iptables with both
# variants), and prints the table recorded in docs/reliability.md
# ("Outage after a foreign change"). Needs root (network namespaces), nft,
# iptables (both variants), iproute2. kube-proxy is built from the Go
# module proxy at the version pinned in hack/tools/go.mod, and cached with
# the control plane.
#
#   hack/repair-outage.sh [kpng-outage flags]
#
# e.g. --services=1000 --reps=10 --kube-proxy-reps=10 --limit=70s
# --proxiers=kpng-nft,kube-proxy-nftables
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"
dir="$(bash hack/build-controlplane.sh --with-kube-proxy | tail -n 1)"
export KPNG_CONTROLPLANE_DIR="${dir}"
bin="$(mktemp -d)"
trap 'rm -rf "${bin}"' EXIT
go build -o "${bin}/kpng" ./cmd/kpng
go build -o "${bin}/kpng-outage" ./hack/cmd/kpng-outage
echo "machine: $(nproc) cores, kernel $(uname -r), $(nft --version), $(iptables-nft --version)" >&2
"${bin}/kpng-outage" --kube-proxy="${dir}/kube-proxy" --kpng="${bin}/kpng" "$@"
