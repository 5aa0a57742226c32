#!/usr/bin/env bash
# Measures, for kube-proxy v1.36.3 (--proxy-mode=nftables) and
# `kpng kube … to-local to-nft`, one after the other on the same state in
# the test control plane, the time from an EndpointSlice update's API call
# to the new endpoint's map element being committed in the kernel (read
# back from the proxier's network namespace as nftables netlink
# notifications), with kpng's breakdown (watch event, coalescing, round,
# transaction), and prints the tables recorded in docs/benchmarks.md
# ("End to end: API call to the kernel"). Needs root (network namespaces,
# nftables), the nft binary (kube-proxy runs it), iproute2. kube-proxy is
# built from the Go module proxy at the version pinned in hack/tools/go.mod,
# and cached with the control plane.
#
#   hack/bench-e2e-nft.sh [kpng-sidebyside flags]
#
# Defaults: 10,000 services × 10 endpoints (loaded once, 3–6 minutes),
# 300 endpoint changes with kpng and 30 with kube-proxy, each after 1.5 s
# without changes (--quiet), kpng first (--proxiers=kpng,kube-proxy).
# kube-proxy's syncs take seconds each at this size (300 changes would take
# about an hour): pass --kube-proxy-changes=300 for as many as kpng's, or
# e.g. --changes=50 for a quicker look at kpng. The proxiers' logs and each
# change's points (CSV) go to --log-dir (default $TMPDIR/kpng-sidebyside).
#
# With --swap-rules the proxiers' rulesets are saved to the log directory
# and probed swapped between their namespaces; REPLAY_COPIES=N (with
# --swap-rules and the default log directory) then probes the two saved
# rulesets again, each in N fresh namespaces of the same topology,
# interleaved and pooled (kpng-firstpacket replay, 1,500 rounds): one
# namespace differs from another with the same rules by up to 2% here,
# which the copies average out.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"
dir="$(bash hack/build-controlplane.sh --with-kube-proxy | tail -n 1)"
export KPNG_CONTROLPLANE_DIR="${dir}"
bin="$(mktemp -d)"
trap 'rm -rf "${bin}"' EXIT
go build -o "${bin}/kpng" ./cmd/kpng
go build -o "${bin}/kpng-sidebyside" ./hack/cmd/kpng-sidebyside
go build -o "${bin}/kpng-firstpacket" ./hack/cmd/kpng-firstpacket
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), kernel $(uname -r), $(nft --version), $(go version | cut -d' ' -f3), load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
"${bin}/kpng-sidebyside" --kube-proxy="${dir}/kube-proxy" --kpng="${bin}/kpng" --mode=nftables --changes=300 --kube-proxy-changes=30 "$@"
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
logs="${TMPDIR:-/tmp}/kpng-sidebyside"
if [ "${REPLAY_COPIES:-0}" -gt 0 ] && [ -f "${logs}/kpngsbs-kube-proxy-nft.nft" ] && [ -f "${logs}/kpngsbs-kpng-nft.nft" ]; then
  echo "the saved rulesets replayed, ${REPLAY_COPIES} namespaces each (kpng-firstpacket replay):" >&2
  "${bin}/kpng-firstpacket" replay --targets-from="${logs}/kpngsbs-kube-proxy-nft.nft" --probes=1500 \
    --copies="${REPLAY_COPIES}" \
    "kube-proxy=${logs}/kpngsbs-kube-proxy-nft.nft" "kpng=${logs}/kpngsbs-kpng-nft.nft" "kube-proxy-again=${logs}/kpngsbs-kube-proxy-nft.nft"
fi
