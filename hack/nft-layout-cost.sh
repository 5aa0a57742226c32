#!/usr/bin/env bash
# Measures, at SERVICES services (default 50,000) × ENDPOINTS endpoints,
# what the kernel takes to apply a service added, an endpoint changed and
# a service deleted, in kpng's table and in the candidate layouts without
# a chain, rule or goto element per service added
# (hack/cmd/kpng-firstpacket variant --layout: shared, sharded, pool;
# docs/benchmarks.md, "nft layout: where the first packet goes, and what a
# service add costs"). kpng's table is kpng's own (`kpng file` on a state
# file of kpng-genstate, listed with nft); the layouts are rewrites of that
# listing. For each layout: the time `nft -f` takes to load it whole, the
# kernel time of each change (the duration of the sendmsg carrying the
# batch, read with strace -T, as hack/nft-commit-cost.sh; the median of
# REPEATS changes, each on a new service), whether the change holds only
# set elements, and whether `nft list table` of it loads back with `nft -f`
# in a fresh namespace. Then, in kpng's table, which rule added to a chain
# nothing reaches makes the kernel validate the whole table at commit (a
# rule with an expression that has a validate operation), by expression.
# Needs root (network namespaces), nft, strace, flock and git (kpng is
# built from BEFORE, below); the changes are timed under
# /tmp/kpng-bench.lock.
#
#   hack/nft-layout-cost.sh [SERVICES]      (default 50000)
#
# ENDPOINTS (default 10), REPEATS (default 5), LAYOUTS (default "kpng
# sharded pool"; "shared" too takes hours at 50,000: loading a pipapo map
# costs more per element the more it holds), KEEP=DIR keeps the rulesets
# in DIR. Each layout is loaded with kpng-firstpacket load (the table,
# then each `add element` statement in a transaction of its own).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"
source hack/lib/kpng-nft-listing.sh
n=${1:-50000}
endpoints=${ENDPOINTS:-10}
repeats=${REPEATS:-5}
layouts=${LAYOUTS:-"kpng sharded pool"}
work="${KEEP:-$(mktemp -d)}"
mkdir -p "${work}"
prefix="kpnglc-$$-"
pid=""
cleanup() {
  if [ -n "${pid}" ]; then kill "${pid}" 2>/dev/null || true; wait "${pid}" 2>/dev/null || true; fi
  for ns in $(ip netns list | awk -v p="${prefix}" 'index($1, p) == 1 {print $1}'); do ip netns del "${ns}" || true; done
  [ -n "${KEEP:-}" ] || rm -rf "${work}"
}
trap cleanup EXIT
for tool in nft strace flock bc; do
  command -v "${tool}" >/dev/null || { echo "nft-layout-cost: needs ${tool}" >&2; exit 1; }
done
# The layouts rewrite kpng's per-service chains, which plain services
# have had none of since the shard maps (0d1ab17): kpng is built as
# BEFORE (default a12c194, the last commit before them) writes its table.
# The shard maps' own costs are BenchmarkServiceAddDelete's and
# BenchmarkEndpointChange's (backends/nft).
before=${BEFORE:-a12c194}
git worktree add --detach "${work}/before-src" "${before}" >/dev/null 2>&1
(cd "${work}/before-src" && go build -o "${work}/kpng" ./cmd/kpng)
git worktree remove --force "${work}/before-src"
go build -o "${work}/kpng-genstate" ./hack/cmd/kpng-genstate
go build -o "${work}/kpng-firstpacket" ./hack/cmd/kpng-firstpacket
echo "machine: $(nproc) cores, kernel $(uname -r), $(nft --version), load $(cut -d' ' -f1-3 /proc/loadavg); ${n} services × ${endpoints} endpoints, ${repeats} changes each" >&2

# kpng's own table.
"${work}/kpng-genstate" --services="${n}" --endpoints="${endpoints}" --format=json --out="${work}/state.json"
ns="${prefix}gen"
kpng_nft_listing "${work}/kpng" "${work}/state.json" "${ns}" "${work}" --max-size-mib=4096

# The addresses of kpng-genstate's service i and of its endpoint k.
cip() { echo "10.$((96 + $1 / 64000)).$((1 + $1 / 250 % 256)).$((1 + $1 % 250))"; }
eip() { local v=$((10 << 24 | 128 << 16 + $1 * endpoints + $2)); echo "$((v >> 24 & 255)).$((v >> 16 & 255)).$((v >> 8 & 255)).$((v & 255))"; }
# kernel NS TEXT: the duration of the batch's sendmsg (the last nft makes;
# the ones before read its cache), in ms.
kernel() {
  local t
  t=$(echo "$2" | ip netns exec "$1" strace -e trace=sendmsg -T nft -f - 2>&1 | awk '/sendmsg/ {v=$NF} END {print v}' | tr -d '<>')
  echo "${t} * 1000" | bc -l
}
median() { sort -g | awk '{v[NR] = $1} END {printf "%.2f", v[int((NR + 1) / 2)]}'; }
# The elements of service i's endpoints: in kpng's endpoint maps (block B
# of 10⁷ numbers), or keyed by address . port . draw (the other layouts).
block_elems() {
  local i=$1 base=$2 out="" k
  for ((k = 0; k < endpoints; k++)); do
    out+="${out:+, }$((base + k * 10000000 / endpoints))-$((base + (k + 1) * 10000000 / endpoints - 1)) : $(eip "$i" "$k") . 8080"
  done
  echo "${out}"
}
concat_elems() {
  local i=$1 out="" k
  for ((k = 0; k < endpoints; k++)); do
    out+="${out:+, }$(cip "$i") . 80 . $((k * 10000000 / endpoints))-$(((k + 1) * 10000000 / endpoints - 1)) : $(eip "$i" "$k") . 8080"
  done
  echo "${out}"
}
hairpin_elems() {
  local i=$1 out="" k
  for ((k = 0; k < endpoints; k++)); do out+="${out:+, }$(eip "$i" "$k") . $(eip "$i" "$k")"; done
  echo "${out}"
}
anon_elems() {
  local i=$1 out="" k
  for ((k = 0; k < endpoints; k++)); do out+="${out:+, }${k} : $(eip "$i" "$k") . 8080"; done
  echo "${out}"
}
# The table the changes go to: the listing's first, kpng's table holding
# IPv4 (`inet kpng-x` as BEFORE writes it; `ip kpng-x` from a kpng with
# a table per family, whose `ip6 kpng-x` the layouts copy unchanged).
T="$(head -n 1 "${work}/kpng.nft" | awk '{print $2, $3}')"
fam="${T%% *}"
# ops LAYOUT I R OP: the nft commands of OP (add, endpoint, delete) for the
# new service I, the R-th one added.
ops() {
  local l=$1 i=$2 r=$3 op=$4 c
  c=$(cip "$i")
  local slot=$((n + r)) map base chain
  map=$((slot / 64)) base=$((slot % 64 * 10000000)) chain="svc4-NEW${r}-bench/svc-new/tcp/80"
  local shard=$(( $(echo "${c}" | cut -d. -f4) % 256 ))
  local dataset
  case "${l}" in
    kpng | pool) dataset="endpoints-v4-${map}" ;;
    shared) dataset="eps-v4" ;;
    sharded) dataset="eps4-${shard}" ;;
  esac
  local elems
  case "${l}" in kpng | pool) elems=$(block_elems "$i" "${base}") ;; *) elems=$(concat_elems "$i") ;; esac
  local old new
  case "${l}" in
    kpng | pool) old="${base}-$((base + 10000000 / endpoints - 1)) : $(eip "$i" 0) . 8080"; new="${base}-$((base + 10000000 / endpoints - 1)) : 10.127.0.$((r + 1)) . 8080" ;;
    *) old="${c} . 80 . 0-$((10000000 / endpoints - 1)) : $(eip "$i" 0) . 8080"; new="${c} . 80 . 0-$((10000000 / endpoints - 1)) : 10.127.0.$((r + 1)) . 8080" ;;
  esac
  case "${op}" in
    add)
      echo "add element ${T} cluster-ips-v4 { ${c} }"
      echo "add element ${T} hairpin-v4 { $(hairpin_elems "$i") }"
      echo "add element ${T} ${dataset} { ${elems} }"
      case "${l}" in
        kpng)
          echo "add chain ${T} ${chain}"
          echo "add rule ${T} ${chain} ip daddr ${c} ip saddr != 10.0.0.0/16 jump mark-for-masquerade"
          # kpng's rule is `meta l4proto tcp dnat ip to numgen random mod
          # 10000000 offset B map @endpoints-v4-K`; nft 1.0.6 refuses to add
          # it to a loaded table ("conflicting protocols specified: tcp vs.
          # th", reading the map's typeof back), so the same expressions
          # (numgen, lookup in a data map, nat) with an anonymous map.
          echo "add rule ${T} ${chain} meta l4proto tcp dnat ip addr . port to numgen random mod ${endpoints} map { $(anon_elems "$i") }"
          echo "add element ${T} service-ips-v4 { ${c} . tcp . 80 : goto ${chain} }" ;;
        pool) echo "add element ${T} slot-v4 { ${c} . tcp . 80 : $(((slot + 1) << 16)) }" ;;
      esac ;;
    endpoint)
      echo "delete element ${T} ${dataset} { ${old} }"
      echo "add element ${T} ${dataset} { ${new} }" ;;
    delete)
      local cur
      cur="${elems/${old}/${new}}"
      case "${l}" in
        kpng) echo "delete element ${T} service-ips-v4 { ${c} . tcp . 80 }" ;;
        pool) echo "delete element ${T} slot-v4 { ${c} . tcp . 80 }" ;;
      esac
      echo "delete element ${T} ${dataset} { ${cur} }"
      echo "delete element ${T} cluster-ips-v4 { ${c} }"
      echo "delete element ${T} hairpin-v4 { $(hairpin_elems "$i") }"
      [ "${l}" = kpng ] && echo "delete chain ${T} ${chain}"
      true ;;
  esac
}

echo "| layout | objects (listing lines) | nft -f of it whole | service added | endpoint changed | service deleted | endpoint change element-only | listing reloads (nft 1.0.6) |"
echo "|---|---|---|---|---|---|---|---|"
for l in ${layouts}; do
  f="${work}/layout-${l}.nft"
  if [ "${l}" = kpng ]; then
    cp "${work}/kpng.nft" "${f}"
  else
    "${work}/kpng-firstpacket" variant --in="${work}/kpng.nft" --endpoints="${endpoints}" --layout="${l}" --spare="${repeats}" >"${f}"
  fi
  ns="${prefix}${l}"
  ip netns add "${ns}"
  start=$(date +%s.%N)
  "${work}/kpng-firstpacket" load --netns="${ns}" "${f}"
  load=$(echo "($(date +%s.%N) - ${start})" | bc -l)
  # kpng: the endpoint maps the new services' blocks fall in.
  if [ "${l}" = kpng ]; then
    for ((r = 0; r < repeats; r++)); do
      m=$(((n + r) / 64))
      ip netns exec "${ns}" nft list map ${T} "endpoints-v4-${m}" >/dev/null 2>&1 ||
        ip netns exec "${ns}" nft add map ${T} "endpoints-v4-${m}" "{ typeof numgen random mod 10000000 : ip daddr . th dport; flags interval; }"
    done
  fi
  declare -a add=() ep=() del=()
  only="yes"
  exec 9>/tmp/kpng-bench.lock
  flock 9
  for ((r = 0; r < repeats; r++)); do
    i=$((n + 1000 + r))
    add+=("$(kernel "${ns}" "$(ops "${l}" "$i" "$r" add)")")
    ep+=("$(kernel "${ns}" "$(ops "${l}" "$i" "$r" endpoint)")")
    del+=("$(kernel "${ns}" "$(ops "${l}" "$i" "$r" delete)")")
    ops "${l}" "$i" "$r" endpoint | grep -qv ' element ' && only="no"
  done
  flock -u 9
  ip netns exec "${ns}" nft list table ${T} >"${work}/${l}.listing"
  [ "${fam}" = inet ] || ip netns exec "${ns}" nft list table ip6 "${T#* }" >>"${work}/${l}.listing"
  ip netns add "${ns}-reload"
  reload="yes"
  ip netns exec "${ns}-reload" nft -f "${work}/${l}.listing" 2>"${work}/${l}.reload-err" || reload="no: $(head -n 1 "${work}/${l}.reload-err")"
  ip netns del "${ns}-reload"
  printf "| %s | %d | %.1f s | %s ms | %s ms | %s ms | %s | %s |\n" "${l}" "$(wc -l <"${f}")" "${load}" \
    "$(printf '%s\n' "${add[@]}" | median)" "$(printf '%s\n' "${ep[@]}" | median)" "$(printf '%s\n' "${del[@]}" | median)" "${only}" "${reload}"
  [ "${l}" = kpng ] || ip netns del "${ns}"
  unset add ep del
done

# Which additions make the kernel validate the whole table: one rule each
# in a chain nothing reaches, in kpng's table (if measured above).
ns="${prefix}kpng"
ip netns list | grep -q "^${ns}\b" || exit 0
ip netns exec "${ns}" nft add chain ${T} unreached
echo
echo "| added to kpng's table at ${n} services (a chain nothing reaches) | expressions | kernel time |"
echo "|---|---|---|"
row() {
  local ts=() r
  exec 9>/tmp/kpng-bench.lock
  flock 9
  for ((r = 0; r < repeats; r++)); do ts+=("$(kernel "${ns}" "$2")"); done
  flock -u 9
  printf "| \`%s\` | %s | %s ms |\n" "$(echo "$2" | sed "s/ ${T}//g; s/|/\\\\|/g")" "$1" "$(printf '%s\n' "${ts[@]}" | median)"
}
row "counter" "add rule ${T} unreached counter"
# In an inet table, nft puts a `meta nfproto` match before `ip daddr`.
nfproto=""
[ "${fam}" = inet ] && nfproto="meta (nfproto), "
row "${nfproto}payload, cmp" "add rule ${T} unreached ip daddr 10.1.2.3 counter"
row "meta, cmp" "add rule ${T} unreached meta l4proto tcp counter"
row "ct, bitwise, cmp" "add rule ${T} unreached ct state new counter"
row "numgen, cmp" "add rule ${T} unreached numgen random mod 2 0 counter"
row "meta, bitwise, meta set" "add rule ${T} unreached meta mark set meta mark | 0x1"
row "immediate (data), meta set" "add rule ${T} unreached meta mark set 0x1"
row "${nfproto}payload, lookup (a set)" "add rule ${T} unreached ip daddr @cluster-ips-v4 counter"
row "lookup (a data map), meta set" "add rule ${T} unreached meta mark set ip daddr . meta l4proto . th dport map { 10.1.2.3 . tcp . 80 : 0x1 }"
row "fib" "add rule ${T} unreached fib daddr type local counter"
row "immediate (jump)" "add rule ${T} unreached jump mark-for-masquerade"
row "immediate (data), nat" "add rule ${T} unreached meta l4proto tcp dnat ip to 10.1.2.3"
row "numgen, lookup (a data map), nat" "add rule ${T} unreached meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.1.0.1 . 80, 1 : 10.1.0.2 . 80 }"
row "element: data map" "add element ${T} endpoints-v4-0 { 900000000-900000099 : 10.1.0.1 . 80 }; delete element ${T} endpoints-v4-0 { 900000000-900000099 : 10.1.0.1 . 80 }"
row "element: verdict (drop)" "add element ${T} no-endpoint-services-v4 { 10.1.2.3 . tcp . 81 : drop }; delete element ${T} no-endpoint-services-v4 { 10.1.2.3 . tcp . 81 }"
row "element: verdict (goto)" "add element ${T} no-endpoint-services-v4 { 10.1.2.3 . tcp . 82 : goto reject-chain }; delete element ${T} no-endpoint-services-v4 { 10.1.2.3 . tcp . 82 }"
