#!/usr/bin/env bash
# Measures what each shard of the nft backend costs a first packet that
# crosses its rule without matching (docs/benchmarks.md, "The shards'
# sets"): kpng's and kube-proxy's rulesets saved by a side-by-side sitting
# (REPLAY_COPIES=3 hack/bench-e2e-nft.sh --swap-rules writes them to its
# log directory), kpng's rewritten by `kpng-firstpacket shard-rules` with
# COUNT rules of each kind before the probed services' shard rule (and
# once behind the cluster-IP check kpng writes from three shards), all
# replayed interleaved in fresh namespaces (`kpng-firstpacket replay`,
# 3 copies each, 1,500 rounds), with an A/A copy of kube-proxy's.
# Needs root (network namespaces, nftables) and the nft binary.
#
#   hack/nft-shard-cost.sh [LOG_DIR]      (default: $TMPDIR/kpng-sidebyside)
#
# COUNT (default 63: 64 shards, the most a family has), SHARD (default 10:
# the benchmark's services have 10 endpoints).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"
logs="${1:-${TMPDIR:-/tmp}/kpng-sidebyside}"
kp="${logs}/kpngsbs-kube-proxy-nft.nft"
kpng="${logs}/kpngsbs-kpng-nft.nft"
for f in "${kp}" "${kpng}"; do
  [ -f "${f}" ] || { echo "nft-shard-cost: ${f} missing: run REPLAY_COPIES=3 hack/bench-e2e-nft.sh --swap-rules first" >&2; exit 1; }
done
work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT
go build -o "${work}/kpng-firstpacket" ./hack/cmd/kpng-firstpacket
count="${COUNT:-63}"
args=()
for kind in no-lookup empty sized filled; do
  "${work}/kpng-firstpacket" shard-rules --in="${kpng}" --kind="${kind}" --count="${count}" --shard="${SHARD:-10}" >"${work}/${kind}.nft"
  args+=("kpng-${count}-${kind}=${work}/${kind}.nft")
done
"${work}/kpng-firstpacket" shard-rules --in="${kpng}" --kind=guard --count=2 --shard="${SHARD:-10}" >"${work}/guard.nft"
echo "machine: $(nproc) cores, kernel $(uname -r), $(nft --version), load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
"${work}/kpng-firstpacket" replay --targets-from="${kp}" --probes=1500 --copies=3 \
  "kube-proxy=${kp}" "kpng=${kpng}" "${args[@]}" "kpng-guard-3-shards=${work}/guard.nft" "kube-proxy-again=${kp}"
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
