# shellcheck shell=bash
# kpng_nft_listing KPNG STATE NS DIR [KPNG FILE FLAGS...]: programs the
# state file STATE (kpng-genstate's) with `KPNG file … to-local to-nft
# --name=x` into the network namespace NS (made here, deleted after), and
# writes nft's listing of its two tables, `table ip kpng-x` then `table
# ip6 kpng-x`, to DIR/kpng.nft, which `nft -f` loads whole (kpng's log:
# DIR/kpng.log). A kpng from before the two tables (a BEFORE commit)
# programs one table, `table inet kpng-x`: that one is listed then. Sourced by the scripts that measure rulesets written
# from kpng's own table (hack/first-packet-nft.sh, hack/nft-layout-cost.sh);
# the caller's cleanup kills ${pid} and deletes NS if it stops midway.
kpng_nft_listing() {
  local kpng="$1" state="$2" netns="$3" dir="$4"
  shift 4
  ip netns add "${netns}"
  "${kpng}" -v=2 file --input="${state}" "$@" to-local to-nft --name=x --netns="/run/netns/${netns}" \
    --cluster-cidr=10.0.0.0/16 --check-period=0 --monitor=false 2>"${dir}/kpng.log" &
  pid=$!
  until grep -q '"nftables table synced"' "${dir}/kpng.log"; do
    kill -0 "${pid}" 2>/dev/null || { echo "kpng exited:" >&2; tail -n 20 "${dir}/kpng.log" >&2; return 1; }
    sleep 0.1
  done
  if ip netns exec "${netns}" nft list table ip kpng-x >"${dir}/kpng.nft" 2>/dev/null; then
    ip netns exec "${netns}" nft list table ip6 kpng-x >>"${dir}/kpng.nft"
  else
    ip netns exec "${netns}" nft list table inet kpng-x >"${dir}/kpng.nft"
  fi
  kill "${pid}"
  wait "${pid}" 2>/dev/null || true
  pid=""
  ip netns del "${netns}"
}
