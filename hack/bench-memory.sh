#!/usr/bin/env bash
# Measures the memory a proxier's container needs: `kpng file … to-local
# <backend>` on a state file of synthetic services (hack/cmd/kpng-genstate:
# SERVICES ClusterIP services × ENDPOINTS endpoints), in a network
# namespace of its own, three processes one after the other; for each, the
# peak RSS of kpng (VmHWM) and its RSS and Go heap 3 s after the first
# sync, and, for to-iptables, the peak RSS of the iptables-restore and
# -save runs (each run under /usr/bin/time, through wrappers first in
# PATH), which run in the same container. Needs root. docs/benchmarks.md
# ("Memory limits of the DaemonSets") records the results, and the
# DaemonSets' memory requests and limits follow them.
#
#   hack/bench-memory.sh [BACKEND...]      (default: to-nft to-iptables)
#
# SERVICES (default 10000), ENDPOINTS (default 10), RUNS (default 3).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"
services=${SERVICES:-10000}
endpoints=${ENDPOINTS:-10}
runs=${RUNS:-3}
work="$(mktemp -d)"
ns=""
pid=""
cleanup() {
  if [ -n "${pid}" ]; then kill "${pid}" 2>/dev/null || true; wait "${pid}" 2>/dev/null || true; fi
  if [ -n "${ns}" ]; then ip netns del "${ns}" 2>/dev/null || true; fi
  rm -rf "${work}"
}
trap cleanup EXIT
go build -o "${work}/kpng" ./cmd/kpng
go build -o "${work}/kpng-genstate" ./hack/cmd/kpng-genstate
"${work}/kpng-genstate" --services="${services}" --endpoints="${endpoints}" --out="${work}/state.yaml"
mkdir "${work}/wrap"
for t in iptables ip6tables; do
  for s in restore save; do
    b="${t}-nft-${s}"
    printf '#!/bin/sh\nexec /usr/bin/time -a -o %s -f "%%M" %s "$@"\n' "${work}/children" "$(command -v "${b}")" > "${work}/wrap/${b}"
    chmod +x "${work}/wrap/${b}"
  done
done
echo "machine: $(nproc) cores, kernel $(uname -r), $(go version | cut -d' ' -f3), load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
echo "| backend | run | kpng peak RSS | kpng RSS after | Go heap after | iptables-restore/-save peak RSS |"
echo "|---|---|---|---|---|---|"
status() { awk -v f="$2:" '$1 == f {print int($2/1024)}' "/proc/$1/status"; }
backends=("$@")
[ "${#backends[@]}" -gt 0 ] || backends=(to-nft to-iptables)
for backend in "${backends[@]}"; do
  for run in $(seq "${runs}"); do
    : > "${work}/children"
    ns="kpngmem-$$-${run}"
    ip netns add "${ns}"
    metrics="127.0.0.1:$((20000 + RANDOM % 20000))"
    extra=()
    [ "${backend}" = to-iptables ] && extra=(--iptables=nft)
    PATH="${work}/wrap:${PATH}" "${work}/kpng" file --input="${work}/state.yaml" --metrics-bind-address="${metrics}" \
      to-local "${backend}" --netns="/run/netns/${ns}" "${extra[@]}" 2> "${work}/log" &
    pid=$!
    until curl -s "http://${metrics}/metrics" 2>/dev/null | grep -q '^kpng_sync_proxy_rules_duration_seconds_count{.*} [1-9]'; do
      kill -0 "${pid}" 2>/dev/null || { echo "kpng exited:" >&2; tail -n 20 "${work}/log" >&2; exit 1; }
      sleep 0.2
    done
    sleep 3
    peak=$(status "${pid}" VmHWM) rss=$(status "${pid}" VmRSS)
    heap=$(curl -s "http://${metrics}/metrics" | awk '$1 == "go_memstats_heap_alloc_bytes" {printf "%d", $2 / 1048576}')
    child=$(sort -n "${work}/children" | tail -n 1)
    echo "| ${backend} | ${run} | ${peak} MiB | ${rss} MiB | ${heap} MiB | ${child:+$((child / 1024)) MiB} |"
    kill "${pid}"; wait "${pid}" 2>/dev/null || true; pid=""
    ip netns del "${ns}"; ns=""
  done
done
