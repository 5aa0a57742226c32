#!/usr/bin/env bash
# Measures what one small nftables transaction costs the kernel in a table
# laid out as kpng's IPv4 table, `table ip` (a NAT base chain dispatching
# through a verdict map to CHAINS regular chains, each with one DNAT rule
# whose endpoint comes from a numgen-keyed interval map, 64 chains a map;
# the figures in docs/benchmarks.md were taken with the same table in the
# `inet` family, kpng's one table then), by kind of change: the time of the
# sendmsg that carries the batch (the kernel processes a batch, commit
# included, within it), read with strace -T. It shows why a service added
# costs tens of milliseconds at 50,000 services while an endpoint change
# costs a fraction of one: any transaction that adds a jump or goto (a
# rule or a verdict map element) or a rule with a NAT expression makes the
# kernel validate every chain reachable from the base chains at commit
# (docs/benchmarks.md, "50,000 services × 10 endpoints, third pass").
# Needs root (a network namespace), nft and strace.
#
#   hack/nft-commit-cost.sh [CHAINS]      (default 50000)
set -euo pipefail
chains=${1:-50000}
ns="kpng-commit-cost-$$"
work="$(mktemp -d)"
cleanup() { ip netns del "${ns}" 2>/dev/null || true; rm -rf "${work}"; }
trap cleanup EXIT
for tool in nft strace; do
  command -v "${tool}" >/dev/null || { echo "nft-commit-cost: needs ${tool}" >&2; exit 1; }
done
ip netns add "${ns}"

{
  echo "table ip t {"
  echo "  map svc { type ipv4_addr . inet_proto . inet_service : verdict; }"
  for ((m = 0; m <= chains / 64; m++)); do
    echo "  map eps${m} { typeof numgen random mod 10000000 : ip daddr . tcp dport; flags interval; }"
  done
  echo "  chain pre { type nat hook prerouting priority dstnat; ip daddr . meta l4proto . th dport vmap @svc; }"
  for ((i = 0; i < chains; i++)); do
    echo "  chain s${i} { meta l4proto tcp dnat ip to numgen random mod 10000000 offset $((i % 64 * 10000000)) map @eps$((i / 64)); }"
  done
  echo "}"
  printf "add element ip t svc { "
  for ((i = 0; i < chains; i++)); do
    [ "${i}" -gt 0 ] && printf ", "
    printf "10.%d.%d.%d . tcp . 80 : goto s%d" $((96 + i / 65536)) $((i / 256 % 256)) $((i % 256)) "${i}"
  done
  echo " }"
} >"${work}/table.nft"
ip netns exec "${ns}" nft -f "${work}/table.nft"

# cost DESCRIPTION COMMANDS: the duration of the batch's sendmsg, in ms
# (the last sendmsg nft makes; the ones before read its cache).
cost() {
  local t
  t=$(echo "$2" | ip netns exec "${ns}" strace -e trace=sendmsg -T nft -f - 2>&1 | awk '/sendmsg/ {v=$NF} END {print v}' | tr -d '<>')
  printf "| %s | %.2f ms |\n" "$1" "$(echo "${t} * 1000" | bc -l)"
}
echo "machine: $(nproc) cores, kernel $(uname -r), $(nft --version), load $(cut -d' ' -f1-3 /proc/loadavg); ${chains} service chains"
echo "| change (one transaction) | kernel time |"
echo "|---|---|"
cost "an element of a numgen-keyed data map (an endpoint change)" "add element ip t eps0 { 900000000-900000099 : 10.1.0.1 . 80 }"
cost "a data element deleted" "delete element ip t eps0 { 900000000-900000099 : 10.1.0.1 . 80 }"
cost "a regular chain, empty" "add chain ip t new1"
cost "a regular chain with a counter rule" "add chain ip t new2; add rule ip t new2 counter"
cost "a DNAT rule in a chain nothing reaches" "add rule ip t new1 meta l4proto tcp dnat ip to numgen random mod 10000000 offset 5 map @eps0"
cost "a verdict map element: goto an existing chain" "add element ip t svc { 10.200.0.1 . tcp . 80 : goto s5 }"
cost "a verdict map element: drop" "add element ip t svc { 10.200.0.2 . tcp . 80 : drop }"
cost "a counter rule in a reached chain" "add rule ip t s7 counter"
