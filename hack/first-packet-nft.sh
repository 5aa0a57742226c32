#!/usr/bin/env bash
# Times the first packet of new TCP connections to cluster IPs through
# kpng's nft table, a kube-proxy-shaped table and variants of kpng's
# table that each remove or replace one suspect, side by side in one run
# (hack/cmd/kpng-firstpacket: each ruleset in a "node" namespace of its
# own between a "pod" and an "endpoint" namespace, probes interleaved A B
# A B …), and prints one table per number of services: median exchange
# (connect, a line each way) and connect, and the ratio to kube-proxy's.
# docs/benchmarks.md ("nft layout: where the first packet goes, and what
# a service add costs") records the results.
#
# kpng's table is kpng's own: `kpng file` on a state file of synthetic
# services (hack/cmd/kpng-genstate, ENDPOINTS endpoints each) programs a
# scratch namespace, and the listing of its tables (`nft list table ip`,
# then `ip6`; hack/lib/kpng-nft-listing.sh) is the ruleset; the variants
# are rewrites of that listing (kpng-firstpacket variant). The
# kube-proxy table is written by kpng-firstpacket kube-proxy, in the shape
# kube-proxy v1.36.3 programs (one DNAT through an anonymous numgen map
# per service chain), and in the shape of earlier versions (a numgen
# verdict map to per-endpoint chains).
# Needs root (network namespaces) and nft; run it while nothing
# else measures (the probes take /tmp/kpng-bench.lock, flock(2)).
#
#   hack/first-packet-nft.sh [SERVICES...]     (default: 100 10000)
#
# BEFORE=COMMIT adds kpng's table as that commit writes it (built from a
# worktree of it), so that a change of the layout is measured against
# the one before it in the same interleaving (BEFORE=a12c194: the
# per-service chains before the shard maps).
#
# VARIANTS and LAYOUTS rewrite kpng's table: the BEFORE table if given,
# else the current one. The changes of the per-service chains (pick-map,
# pick-vmap, no-masq-jump) and the layouts find none in the current table
# (plain services have no chain since the shard maps, 0d1ab17): they
# need BEFORE (a12c194). The variants are listed below;
# the candidate layouts of hack/nft-layout-cost.sh ("sharded pool";
# "shared" takes minutes to load at 10,000: kpng-firstpacket variant
# --layout) run in the same interleaving.
#
# PROBES (default 1000), FROM (pod or node), VARIANTS (default: none; all:
# "pick-map pick-vmap no-nodeport-fib no-filter filter-every no-hairpin
# no-masq-jump no-v6 pick-map,no-nodeport-fib,no-filter,no-hairpin,no-masq-jump,no-v6"),
# EPCHAINS=no leaves out the kube-proxy table with endpoint chains,
# KEEP=DIR keeps the rulesets in DIR. The rulesets are loaded before the
# lock is taken; only the probes run under it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"
source hack/lib/kpng-nft-listing.sh
endpoints=${ENDPOINTS:-10}
probes=${PROBES:-1000}
from=${FROM:-pod}
variants=${VARIANTS:-}
layouts=${LAYOUTS:-}
before=${BEFORE:-}
if [ -z "${before}" ] && [ -n "${layouts}" ]; then
  echo "first-packet-nft: LAYOUTS rewrite the per-service chains of the BEFORE table: set BEFORE (a12c194)" >&2
  exit 2
fi
work="${KEEP:-$(mktemp -d)}"
mkdir -p "${work}"
ns="kpngfp-gen-$$"
pid=""
cleanup() {
  if [ -n "${pid}" ]; then kill "${pid}" 2>/dev/null || true; wait "${pid}" 2>/dev/null || true; fi
  ip netns del "${ns}" 2>/dev/null || true
  [ -n "${KEEP:-}" ] || rm -rf "${work}"
}
trap cleanup EXIT
for tool in nft; do
  command -v "${tool}" >/dev/null || { echo "first-packet-nft: needs ${tool}" >&2; exit 1; }
done
go build -o "${work}/kpng" ./cmd/kpng
go build -o "${work}/kpng-genstate" ./hack/cmd/kpng-genstate
go build -o "${work}/kpng-firstpacket" ./hack/cmd/kpng-firstpacket
if [ -n "${before}" ]; then
  git worktree add --detach "${work}/before-src" "${before}" >/dev/null 2>&1
  (cd "${work}/before-src" && go build -o "${work}/kpng-before" ./cmd/kpng)
  git worktree remove --force "${work}/before-src"
fi
echo "machine: $(nproc) cores, kernel $(uname -r), $(nft --version), load $(cut -d' ' -f1-3 /proc/loadavg); ${probes} probes from the ${from}" >&2

sizes=("$@")
[ "${#sizes[@]}" -gt 0 ] || sizes=(100 10000)
for n in "${sizes[@]}"; do
  dir="${work}/${n}"
  mkdir -p "${dir}"
  "${work}/kpng-genstate" --services="${n}" --endpoints="${endpoints}" --format=json --out="${dir}/state.json"
  kpng_nft_listing "${work}/kpng" "${dir}/state.json" "${ns}" "${dir}"
  "${work}/kpng-firstpacket" kube-proxy --services="${n}" --endpoints="${endpoints}" >"${dir}/kube-proxy.nft"
  args=("kube-proxy=${dir}/kube-proxy.nft" "kpng=${dir}/kpng.nft")
  # The variants and layouts rewrite the table before the shard maps.
  base="${dir}/kpng.nft"
  if [ -n "${before}" ]; then
    mkdir -p "${dir}/before"
    kpng_nft_listing "${work}/kpng-before" "${dir}/state.json" "${ns}" "${dir}/before"
    base="${dir}/before/kpng.nft"
    args+=("kpng@${before}=${base}")
  fi
  if [ "${EPCHAINS:-yes}" = yes ]; then
    "${work}/kpng-firstpacket" kube-proxy --services="${n}" --endpoints="${endpoints}" --endpoint-chains >"${dir}/kube-proxy-epchains.nft"
    args+=("kube-proxy-epchains=${dir}/kube-proxy-epchains.nft")
  fi
  for v in ${variants}; do
    name="kpng${before:+@${before}}+${v//,/+}"
    [ "${v}" = "pick-map,no-nodeport-fib,no-filter,no-hairpin,no-masq-jump,no-v6" ] && name="kpng${before:+@${before}}+all"
    "${work}/kpng-firstpacket" variant --in="${base}" --endpoints="${endpoints}" --change="${v}" >"${dir}/${v}.nft"
    args+=("${name}=${dir}/${v}.nft")
  done
  for l in ${layouts}; do
    "${work}/kpng-firstpacket" variant --in="${base}" --endpoints="${endpoints}" --layout="${l}" >"${dir}/layout-${l}.nft"
    args+=("layout-${l}=${dir}/layout-${l}.nft")
  done
  echo "${n} services × ${endpoints} endpoints:"
  "${work}/kpng-firstpacket" probe --services="${n}" --endpoints="${endpoints}" \
    --probes="${probes}" --from="${from}" --lock=/tmp/kpng-bench.lock "${args[@]}"
done
