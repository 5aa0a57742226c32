#!/usr/bin/env bash
# The soak of docs/reliability.md: `kpng kube … to-local to-nft` against
# the test control plane under continuous churn (10,000 services × 10
# endpoints, 15 API changes a second, one hour, by default), sampling its
# heap, RSS, goroutines, open files and latency histograms; at the end, its
# table is compared with a fresh kpng's (backends/nft
# compareTables, run with KPNG_COMPARE_NETNS). Needs root (network namespaces, nftables) and
# iproute2. Results (samples.csv, windows.csv, summary.md, kpng's logs) go
# to --out (default soak-out); the exit status says whether it passed.
#
#   hack/soak.sh [kpng-soak flags]
#
# e.g. --duration=3m --window=1m --services=2000 for a smoke run.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"
: "${KPNG_CONTROLPLANE_DIR:=$(bash hack/build-controlplane.sh | tail -n 1)}"
export KPNG_CONTROLPLANE_DIR
bin="$(mktemp -d)"
trap 'rm -rf "${bin}"' EXIT
go build -o "${bin}/kpng" ./cmd/kpng
go build -o "${bin}/kpng-soak" ./hack/cmd/kpng-soak
go test -c -o "${bin}/nft.test" ./backends/nft
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), kernel $(uname -r), $(go version)" >&2
"${bin}/kpng-soak" --kpng="${bin}/kpng" --compare-test="${bin}/nft.test" "$@"
