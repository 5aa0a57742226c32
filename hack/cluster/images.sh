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
#             k8s.io/kubernetes), on the same Debian root filesystem with
#             the tools the tests run in it;
#   pause     the pod sandbox: hack/cmd/kpng-pause alone, static;
#   coredns   CoreDNS (built from the Go module proxy by
#             hack/e2e/build-coredns.sh, once) alone: the cluster's DNS, for
#             make e2e and for the node backends that find the controller
#             by its Service's name (proxier.sh deploy controller).
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

# rootfs_plus NAME PACKAGES [COMMAND] prints the path of a tar of the
# bookworm root filesystem with PACKAGES installed by apt-get in a copy of
# it, then COMMAND run in it; made once (about a minute) for each NAME,
# PACKAGES and COMMAND (their hash is in the file's name).
rootfs_plus() {
  local name="$1" packages="$2" command="${3:-true}"
  local tar
  tar="${KPNGC_CACHE}/rootfs-bookworm-${name}-$(echo "${packages}|${command}|$(stat -c '%s %Y' "${rootfs}")" | sha256sum | cut -c1-12).tar"
  if [[ ! -s "${tar}" ]]; then
    kpngc_log "root filesystem with ${packages}: apt-get in a copy of the bookworm one (once)"
    local tmp
    tmp="$(mktemp -d "${KPNGC_CACHE}/rootfs.XXXXXX")"
    # Never a root filesystem's copy left behind (this runs in $(...)).
    trap 'rm -rf "${tmp:-}"' EXIT
    tar -C "${tmp}" -xf "${rootfs}"
    cp /etc/resolv.conf "${tmp}/etc/resolv.conf"
    chroot "${tmp}" /bin/sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ${packages} && ${command}" \
      >"${tar}.log" 2>&1 || { rm -rf "${tmp}"; kpngc_die "apt-get install ${packages} failed: see ${tar}.log"; }
    rm -rf "${tmp}/var/lib/apt/lists/"* "${tmp}/var/cache/apt/"*.bin "${tmp}/var/cache/apt/archives/"*.deb
    : >"${tmp}/etc/resolv.conf"
    tar -C "${tmp}" --numeric-owner -cf "${tar}.tmp" .
    rm -rf "${tmp}"
    mv "${tar}.tmp" "${tar}"
  fi
  echo "${tar}"
}

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

# agnhost's image as its Dockerfile makes it (test/images/agnhost, on
# Alpine there): the tools the tests run in it (nc, curl, dig, ip, iperf,
# bash), the user and group the tests look for, the porter's certificate,
# /uploads; for make e2e (KPNGC_E2E=1) also CoreDNS as /coredns, which a
# DNS test runs (the one hack/e2e/build-coredns.sh builds: the upstream
# image has an older one).
# Alpine's busybox gives the rest (ping, ...): Debian's static busybox,
# linked for each applet Debian has no program for. Not its wget: with a
# timeout (-T, which the tests give) it crashes (busybox 1.35.0-4+deb12u1).
agnhost_root="$(rootfs_plus agnhost "dnsutils curl wget netcat-openbsd iproute2 iperf bash procps busybox-static" \
  'groupadd -g 50000 group-defined-in-image && useradd -u 1000 -M user-defined-in-image && usermod -aG group-defined-in-image user-defined-in-image && mkdir -p /uploads && ln -s agnhost /agnhost-2 && for a in $(busybox --list); do command -v "$a" >/dev/null || ln -s /bin/busybox "/usr/local/bin/$a"; done')"
agnhost_src="$(GOWORK=off go -C "${KPNGC_ROOT}/hack/tools" list -f '{{.Dir}}' k8s.io/kubernetes/test/images/agnhost)"
agnhost_adds=("${agnhost_root}:/" "${KPNGC_BIN}/agnhost:/agnhost"
  "${agnhost_src}/porter/localhost.crt:/localhost.crt" "${agnhost_src}/porter/localhost.key:/localhost.key")
coredns="$(bash "${KPNGC_ROOT}/hack/e2e/build-coredns.sh" | tail -n 1)"
[[ "${KPNGC_E2E:-}" != 1 ]] || agnhost_adds+=("${coredns}:/coredns")
image "${KPNGC_AGNHOST_IMAGE}" "${out}/agnhost.tar" '["pause"]' '["/agnhost"]' "${agnhost_adds[@]}"

CGO_ENABLED=0 go build -C "${KPNGC_ROOT}" -trimpath -ldflags=-s -o "${out}/pause/kpng-pause" ./hack/cmd/kpng-pause
image "${KPNGC_PAUSE_IMAGE}" "${out}/pause.tar" '[]' '["/kpng-pause"]' \
  "${out}/pause/kpng-pause:/kpng-pause"

image "${KPNGC_COREDNS_IMAGE}" "${out}/coredns.tar" '[]' '["/coredns"]' "${coredns}:/coredns"
# (make e2e's images were once in e2e/, CoreDNS's with them.)
rm -f "${out}/e2e/coredns.tar" "${out}/e2e/coredns.tar.key"

# With KPNGC_E2E=1 (make e2e), the other images Kubernetes' network e2e
# tests run, under the names they ask for, in ${out}/e2e:
#   busybox      Debian's static busybox, with a link for each applet;
#   nginx        Debian's nginx-light on the bookworm root filesystem,
#                serving its default page on port 80 in the foreground;
#   distroless-iptables
#                the root filesystem with conntrack added (the KubeProxy
#                test reads the node's connection tracking table with it);
#   regression-issue-74839
#                its program alone, built from the pinned k8s.io/kubernetes;
#   glibc-dns-testing
#                Debian with dig, and CoreDNS, for the DNS tests.
[[ "${KPNGC_E2E:-}" == 1 ]] || exit 0
e2e="${out}/e2e"
mkdir -p "${e2e}"

# busybox: a tree with the binary and its applets' links, as a tar.
bb="${e2e}/busybox-root.tar"
[[ -x /bin/busybox ]] || kpngc_die "no /bin/busybox: install busybox-static (up.sh does)"
if [[ ! -s "${bb}" || /bin/busybox -nt "${bb}" ]]; then
  tmp="$(mktemp -d)"
  mkdir -p "${tmp}/bin" "${tmp}/tmp" "${tmp}/etc"
  cp /bin/busybox "${tmp}/bin/busybox"
  for applet in $(/bin/busybox --list); do
    [[ -e "${tmp}/bin/${applet}" ]] || ln -s busybox "${tmp}/bin/${applet}"
  done
  echo "root:x:0:0:root:/root:/bin/sh" >"${tmp}/etc/passwd"
  echo "root:x:0:" >"${tmp}/etc/group"
  tar -C "${tmp}" --numeric-owner -cf "${bb}" .
  rm -rf "${tmp}"
fi
image registry.k8s.io/e2e-test-images/busybox:1.37.0-1 "${e2e}/busybox.tar" '["sh"]' '[]' "${bb}:/"

nginx_root="$(rootfs_plus nginx nginx-light)"
image registry.k8s.io/e2e-test-images/nginx:1.15-4 "${e2e}/nginx.tar" '["nginx","-g","daemon off;"]' '[]' "${nginx_root}:/"

conntrack_root="$(rootfs_plus conntrack conntrack)"
image registry.k8s.io/build-image/distroless-iptables:v0.9.6 "${e2e}/distroless-iptables.tar" '[]' '[]' "${conntrack_root}:/"

image registry.k8s.io/e2e-test-images/regression-issue-74839:1.4 "${e2e}/regression-issue-74839.tar" '[]' '["/regression-issue-74839"]' \
  "${KPNGC_BIN}/regression-issue-74839:/regression-issue-74839"

# glibc-dns-testing: Debian with dig, and CoreDNS as /coredns, as its
# Dockerfile makes it (test/images/glibc-dns-testing); the DNS tests query
# with it.
dnstest_root="$(rootfs_plus dnstest dnsutils)"
image registry.k8s.io/e2e-test-images/glibc-dns-testing:2.0.0 "${e2e}/glibc-dns-testing.tar" '[]' '[]' \
  "${dnstest_root}:/" "${coredns}:/coredns"

