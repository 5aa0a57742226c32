#!/usr/bin/env bash
# Measures `kpng file … to-local to-nft` as a user runs it, on a state file
# of synthetic services (hack/cmd/kpng-genstate: ClusterIP services of
# one TCP port, ENDPOINTS endpoints each), in a network namespace of its
# own: the first sync (process start → the log line of the first full
# transaction), the whole process's peak RSS (VmHWM) and its RSS, Go heap
# and CPU time after it, then one endpoint removed, one service added and
# that service deleted, each by replacing the file (atomically, as
# statefile.Write does), with the transaction's netlink messages and
# duration from the nftables sink's log line and the time from the
# replacement to that line (which includes kpng noticing the change, up to
# its --interval of 1 s and 100 ms to see that the file settled, and
# reading and parsing the whole file again). The service is added and
# deleted SAMPLES times (default 1); with more, the add and delete columns
# give the sync's median and its range. Prints one markdown table row per
# number of services.
# Needs root (network namespaces, nftables). docs/benchmarks.md records
# the results.
#
#   hack/bench-file-nft.sh [SERVICES...]      (default: 1000 10000 50000)
#
# ENDPOINTS (default 10), FORMAT (yaml, as to-file writes, or json),
# NFT_FLAGS (more flags of to-nft, e.g. --monitor=false).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"
endpoints=${ENDPOINTS:-10}
format=${FORMAT:-yaml}
work="$(mktemp -d)"
ns="kpngbench-file-$$"
pid=""
cleanup() {
  if [ -n "${pid}" ]; then kill "${pid}" 2>/dev/null || true; wait "${pid}" 2>/dev/null || true; fi
  ip netns del "${ns}" 2>/dev/null || true
  rm -rf "${work}"
}
trap cleanup EXIT
go build -o "${work}/kpng" ./cmd/kpng
go build -o "${work}/kpng-genstate" ./hack/cmd/kpng-genstate
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), kernel $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg)" >&2

now() { date +%s.%N; }
ms() { echo "($2 - $1) * 1000" | bc | cut -d. -f1; }
status() { awk -v f="$2:" '$1 == f {print int($2/1024)}' "/proc/$1/status"; }
cpu() { awk '{printf "%.1f", ($14 + $15) / 100}' "/proc/$1/stat"; }
# synced N: waits for the Nth "nftables table synced" line of the log and
# prints its messages and duration.
synced() {
  local n=$1
  until [ "$(grep -c '"nftables table synced"' "${work}/log")" -ge "${n}" ]; do
    kill -0 "${pid}" 2>/dev/null || { echo "kpng exited:" >&2; tail -n 20 "${work}/log" >&2; exit 1; }
    sleep 0.01
  done
  grep '"nftables table synced"' "${work}/log" | sed -n "${n}p" | sed -E 's/.*messages=([0-9]+).*duration="([^"]+)".*/\1 \2/'
}
# spread DURATION...: the median and range of Go durations (1.2ms, 800µs)
# in ms, as "median X ms (min–max, N samples)".
spread() {
  printf '%s\n' "$@" | awk '
    /ms$/ {v = $1 + 0} /µs$/ {v = ($1 + 0) / 1000} /[0-9]s$/ && !/ms$/ && !/µs$/ {v = ($1 + 0) * 1000}
    {print v}' | sort -g | awk '{a[NR] = $1} END {
      m = (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2
      printf "median %.2f ms (%.2f–%.2f, %d samples)", m, a[1], a[NR], NR}'
}
gen() { "${work}/kpng-genstate" --services="$1" --endpoints="${endpoints}" --format="${format}" --out="$2" ${3:+--without-first-endpoint=$3}; }

echo "| services | state file | first sync | messages | peak RSS | RSS after | heap after | CPU to first sync | endpoint removed: messages, sync, file → synced | service added | service deleted |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
sizes=("$@")
[ "${#sizes[@]}" -gt 0 ] || sizes=(1000 10000 50000)
for n1 in "${sizes[@]}"; do
  {
    state="${work}/state.${format}"
    gen "${n1}" "${work}/base"
    gen "${n1}" "${work}/change" 7
    gen "$((n1 + 1))" "${work}/add"
    cp "${work}/base" "${state}"
    ip netns del "${ns}" 2>/dev/null || true
    ip netns add "${ns}"
    metrics="127.0.0.1:$((20000 + RANDOM % 20000))"
    start=$(now)
    "${work}/kpng" -v=2 file --input="${state}" --max-size-mib=4096 --metrics-bind-address="${metrics}" \
      to-local to-nft ${NFT_FLAGS:-} --netns="/run/netns/${ns}" 2> "${work}/log" &
    pid=$!
    read -r msgs _ < <(synced 1)
    first=$(ms "${start}" "$(now)")
    cpu_first=$(cpu "${pid}")
    sleep 5
    peak=$(status "${pid}" VmHWM) rss=$(status "${pid}" VmRSS)
    heap=$(curl -s "http://${metrics}/metrics" | awk '$1 == "go_memstats_heap_alloc_bytes" {printf "%d", $2 / 1048576}')
    row=()
    k=2
    # replace VARIANT: replaces the state file with VARIANT's and sets
    # msgs_, dur_ and took_: the sync's messages and duration and the time
    # from the replacement to it.
    replace() {
      cp "${work}/$1" "${state}.new"
      local t0
      t0=$(now)
      mv "${state}.new" "${state}"
      read -r msgs_ dur_ < <(synced "${k}")
      took_=$(ms "${t0}" "$(now)")
      k=$((k + 1))
      sleep 2
    }
    replace change
    row+=("${msgs_} msgs, ${dur_}, ${took_} ms")
    adds=() dels=() add_row="" del_row=""
    for _ in $(seq "${SAMPLES:-1}"); do
      replace add
      adds+=("${dur_}") add_row="${msgs_} msgs, ${dur_}, ${took_} ms"
      replace base
      dels+=("${dur_}") del_row="${msgs_} msgs, ${dur_}, ${took_} ms"
    done
    if [ "${#adds[@]}" -gt 1 ]; then
      add_row="${add_row%%,*}, $(spread "${adds[@]}")" del_row="${del_row%%,*}, $(spread "${dels[@]}")"
    fi
    row+=("${add_row}" "${del_row}")
    size=$(du -m "${work}/base" | cut -f1)
    echo "| ${n1} | ${size} MB ${format} | $(echo "scale=2; ${first} / 1000" | bc) s | ${msgs} | ${peak} MiB | ${rss} MiB | ${heap} MiB | ${cpu_first} s | ${row[0]} | ${row[1]} | ${row[2]} |"
    kill "${pid}"; wait "${pid}" 2>/dev/null || true; pid=""
    ip netns del "${ns}"
  }
done
