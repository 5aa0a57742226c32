#!/usr/bin/env bash
# Copyright The Kubernetes Authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.

# build-controlplane.sh builds the kube-apiserver and etcd binaries used by
# the integration tests (package sigs.k8s.io/kpng/internal/controlplane) from
# the Go module proxy, using the versions pinned in hack/tools/go.mod.
#
# The binaries are cached in
#   ${KPNG_CACHE_DIR:-$HOME/.cache/kpng}/controlplane/k8s-<version>-etcd-<version>/
# and only built when missing, so a second run takes well under a second.
# Each binary is built under a temporary name and renamed into place, so an
# interrupted build never looks like a cached one. Concurrent runs (for
# example several test packages of `go test ./...`) are serialized with
# flock(1) when it is available, so the expensive build happens only once.
#
# With --with-kube-proxy, kube-proxy (the peer of the side-by-side
# benchmarks, hack/bench-iptables.sh) is built into the same directory.
# With --with-cluster, so are kube-proxy and what the one-machine cluster
# (hack/cluster/up.sh) runs besides: kubelet, kube-controller-manager,
# kube-scheduler, kubectl, and agnhost (the e2e tests' test program, which
# the cluster's test image is made of).
# With --with-e2e, also Kubernetes' own network e2e tests
# (hack/tools/e2e, as e2e-network.test), the ginkgo program that runs them
# in parallel, and regression-issue-74839 (the program of the conntrack
# test's image), for make e2e (hack/e2e/run.sh). Like every binary here it
# is cached by the pinned versions only: after editing hack/tools/e2e,
# delete e2e-network.test from the cache directory to rebuild it.
#
# Progress goes to stderr; the last line on stdout is the cache directory.
# A cold build of kube-apiserver takes several minutes on a small machine.

set -euo pipefail

log() {
  echo "build-controlplane: $*" >&2
}

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools="${root}/hack/tools"

# hack/tools is its own module; never let a go.work file pull it elsewhere.
export GOWORK=off

version_of() {
  (cd "${tools}" && go list -m -f '{{.Version}}' "$1")
}

k8s_version="$(version_of k8s.io/kubernetes)"
etcd_version="$(version_of go.etcd.io/etcd/server/v3)"

cache_root="${KPNG_CACHE_DIR:-${HOME}/.cache/kpng}"
dir="${cache_root}/controlplane/k8s-${k8s_version}-etcd-${etcd_version}"

with_kube_proxy=false
with_cluster=false
with_e2e=false
for arg in "$@"; do
  case "${arg}" in
    --with-kube-proxy) with_kube_proxy=true ;;
    --with-cluster) with_kube_proxy=true; with_cluster=true ;;
    --with-e2e) with_kube_proxy=true; with_cluster=true; with_e2e=true ;;
    *) log "unknown argument ${arg} (--with-kube-proxy, --with-cluster, --with-e2e)"; exit 2 ;;
  esac
done
cluster_binaries=(kubelet kube-controller-manager kube-scheduler kubectl agnhost)
e2e_binaries=(e2e-network.test ginkgo regression-issue-74839)

have_binaries() {
  [[ -x "${dir}/kube-apiserver" && -x "${dir}/etcd" ]] &&
    { ! ${with_kube_proxy} || [[ -x "${dir}/kube-proxy" ]]; } &&
    { ! ${with_cluster} || all_executable "${cluster_binaries[@]}"; } &&
    { ! ${with_e2e} || all_executable "${e2e_binaries[@]}"; }
}

all_executable() {
  local name
  for name in "$@"; do
    [[ -x "${dir}/${name}" ]] || return 1
  done
}

if have_binaries; then
  log "using cached binaries in ${dir}"
  echo "${dir}"
  exit 0
fi

mkdir -p "${dir}"

if command -v flock >/dev/null 2>&1; then
  exec 9>"${dir}/.lock"
  if ! flock -n 9; then
    log "waiting for another build-controlplane.sh to finish (${dir}/.lock)"
    flock 9
  fi
  # Another run may have built everything while we waited for the lock.
  if have_binaries; then
    log "using cached binaries in ${dir}"
    echo "${dir}"
    exit 0
  fi
  # We hold the lock: temporary files left here were abandoned by an
  # interrupted run.
  rm -f "${dir}"/.*.tmp.*
fi

# build NAME PACKAGE [go build flags...] builds PACKAGE from hack/tools into
# ${dir}/NAME unless that file already exists.
build() {
  local name="$1" pkg="$2"
  shift 2
  local out="${dir}/${name}"
  if [[ -x "${out}" ]]; then
    log "${name}: cached"
    return 0
  fi
  local tmp="${dir}/.${name}.tmp.$$"
  # Never leave a half-written binary behind, even when interrupted.
  trap 'rm -f "'"${tmp}"'"' EXIT
  trap 'rm -f "'"${tmp}"'"; exit 130' INT TERM
  log "${name}: building ${pkg} (this can take several minutes on a cold Go build cache)"
  local start=${SECONDS}
  if [[ "${name}" == *.test ]]; then
    (cd "${tools}" && go test -c -trimpath "$@" -o "${tmp}" "${pkg}")
  else
    (cd "${tools}" && go build -trimpath "$@" -o "${tmp}" "${pkg}")
  fi
  mv -f "${tmp}" "${out}"
  trap - EXIT INT TERM
  log "${name}: built in $((SECONDS - start))s"
}

semver="${k8s_version#v}"
major="${semver%%.*}"
minor="${semver#*.}"
minor="${minor%%.*}"
component_base="k8s.io/component-base/version"
k8s_ldflags="-X ${component_base}.gitVersion=${k8s_version}"
k8s_ldflags+=" -X ${component_base}.gitMajor=${major}"
k8s_ldflags+=" -X ${component_base}.gitMinor=${minor}"
k8s_ldflags+=" -X ${component_base}.gitTreeState=clean"

build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver -ldflags="${k8s_ldflags}"
build etcd ./etcd
if ${with_kube_proxy}; then
  build kube-proxy k8s.io/kubernetes/cmd/kube-proxy -ldflags="${k8s_ldflags}"
fi
if ${with_cluster}; then
  for name in "${cluster_binaries[@]}"; do
    case "${name}" in
      # Built as the others (with cgo: the build shares their cache), for
      # an image with a C library.
      agnhost) build agnhost k8s.io/kubernetes/test/images/agnhost ;;
      *) build "${name}" "k8s.io/kubernetes/cmd/${name}" -ldflags="${k8s_ldflags}" ;;
    esac
  done
fi

if ${with_e2e}; then
  # The suite is a test binary (hack/tools/e2e, behind the e2e build tag);
  # the version it prints comes from the same linker flags.
  build e2e-network.test ./e2e -tags=e2e -ldflags="${k8s_ldflags}"
  build ginkgo github.com/onsi/ginkgo/v2/ginkgo
  # Static: its image has nothing else.
  CGO_ENABLED=0 build regression-issue-74839 k8s.io/kubernetes/test/images/regression-issue-74839
fi

log "binaries ready in ${dir}"
echo "${dir}"
