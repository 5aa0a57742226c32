#!/usr/bin/env bash
# images.sh builds, without a registry, the images the cluster runs, as
# docker archives that `ctr images import` loads into each node's containerd:
#
#   kpng-nft  the Dockerfile's nft image: kpng alone, built by the same
#             `make image-binaries`;
#   kpng-iptables, kpng
#             its iptables and full images: kpng, or every program, on
#             Debian bookworm with iptables and jq (the Dockerfile's iptables
#             image has no jq: one root filesystem serves both here), made by
#             debootstrap instead of pulled (cached);
#   agnhost   the e2e tests' test image (agnhost, built from the pinned
#             k8s.io/kubernetes), on the same Debian root filesystem;
#   pause     the pod sandbox: hack/cmd/kpng-pause alone, static.
#
# Images are made with buildah (from scratch, then add and commit) in a
# storage of their own under the cache, and written to ${KPNGC_CACHE}/images
# (an image is made again only when what it is made of changed).
# Usage: images.sh (after kpngc_binaries); prints nothing on stdout.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

kpngc_binaries
out="${KPNGC_CACHE}/images"
mkdir -p "${out}" "${KPNGC_CACHE}"

buildah_() {
  buildah --root "${KPNGC_CACHE}/buildah" --runroot "${KPNGC_DIR}/buildah-run" --storage-driver vfs "$@"
}

# The Debian root filesystem of the Dockerfile's runtime stage
# (debian:bookworm-slim plus iptables and jq), made once.
rootfs="${KPNGC_CACHE}/rootfs-bookworm-iptables-jq.tar"
if [[ ! -s "${rootfs}" ]]; then
  kpngc_log "debootstrap: a Debian bookworm root filesystem with iptables and jq (once; a few minutes)"
  tmp="$(mktemp -d "${KPNGC_CACHE}/rootfs.XXXXXX")"
  debootstrap --variant=minbase --include=iptables,jq bookworm "${tmp}" http://deb.debian.org/debian >"${KPNGC_CACHE}/debootstrap.log" 2>&1 ||
    kpngc_die "debootstrap failed: see ${KPNGC_CACHE}/debootstrap.log"
  # What the slim image leaves out too: the package lists and caches.
  rm -rf "${tmp}/var/lib/apt/lists/"* "${tmp}/var/cache/apt/"*.bin "${tmp}/var/cache/apt/archives/"*.deb
  tar -C "${tmp}" --numeric-owner -cf "${rootfs}.tmp" .
  rm -rf "${tmp}"
  mv "${rootfs}.tmp" "${rootfs}"
fi

# image NAME ARCHIVE CMD_JSON ENTRYPOINT_JSON ADD... commits an image from
# scratch with each ADD (SOURCE:DEST; a .tar is unpacked at DEST) and writes
# it to ARCHIVE, unless ARCHIVE was made from the same inputs (ARCHIVE.key,
# their sha256 sums).
image() {
  local name="$1" archive="$2" cmd="$3" entrypoint="$4"
  shift 4
  local key a
  key="$(for a in "$@"; do echo "${a#*:}"; sha256sum <"${a%%:*}"; done; echo "${name} ${cmd} ${entrypoint}")"
  if [[ -s "${archive}" && "$(cat "${archive}.key" 2>/dev/null)" == "${key}" ]]; then
    kpngc_log "image ${name}: unchanged"
    return 0
  fi
  local c
  c="$(buildah_ from scratch)"
  for a in "$@"; do
    buildah_ add "${c}" "${a%%:*}" "${a#*:}" >/dev/null
  done
  buildah_ config --cmd "${cmd}" --entrypoint "${entrypoint}" \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "${c}"
  buildah_ commit --quiet --rm "${c}" "${name}" >/dev/null
  rm -f "${archive}"
  buildah_ push --quiet "${name}" "docker-archive:${archive}:${name}"
  buildah_ rmi "${name}" >/dev/null
  echo "${key}" >"${archive}.key"
  kpngc_log "image ${name}: $(du -h "${archive}" | cut -f1)"
}

kpngc_log "kpng's programs: make image-binaries"
make -s -C "${KPNGC_ROOT}" image-binaries IMAGE_BIN_DIR="${out}/bin" >/dev/null
kpng_adds=("${rootfs}:/")
for p in "${out}"/bin/*; do
  kpng_adds+=("${p}:/usr/local/bin/")
done
kpng_adds+=("${KPNGC_ROOT}/examples/allip/kpng-example-allip:/usr/local/bin/")
image "${KPNGC_KPNG_IMAGE}" "${out}/kpng.tar" '["kpng","--help"]' '[]' "${kpng_adds[@]}"
image "${KPNGC_KPNG_IPTABLES_IMAGE}" "${out}/kpng-iptables.tar" '["kpng","--help"]' '[]' \
  "${rootfs}:/" "${out}/bin/kpng:/usr/local/bin/"
image "${KPNGC_KPNG_NFT_IMAGE}" "${out}/kpng-nft.tar" '["kpng","--help"]' '[]' \
  "${out}/bin/kpng:/usr/local/bin/"

image "${KPNGC_AGNHOST_IMAGE}" "${out}/agnhost.tar" '["pause"]' '["/agnhost"]' \
  "${rootfs}:/" "${KPNGC_BIN}/agnhost:/agnhost"

CGO_ENABLED=0 go build -C "${KPNGC_ROOT}" -trimpath -ldflags=-s -o "${out}/pause/kpng-pause" ./hack/cmd/kpng-pause
image "${KPNGC_PAUSE_IMAGE}" "${out}/pause.tar" '[]' '["/kpng-pause"]' \
  "${out}/pause/kpng-pause:/kpng-pause"
