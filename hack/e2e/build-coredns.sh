#!/usr/bin/env bash
# build-coredns.sh builds CoreDNS, the cluster DNS that Kubernetes' e2e
# tests reach services by name through (make e2e), from the Go module proxy
# at the version below, static, into
#   ${KPNG_CACHE_DIR:-$HOME/.cache/kpng}/coredns/<version>/coredns
# once (a cold build takes several minutes); the last line on stdout is the
# binary's path.
set -euo pipefail
version=v1.15.0
dir="${KPNG_CACHE_DIR:-${HOME}/.cache/kpng}/coredns/${version}"
bin="${dir}/coredns"
if [[ -x "${bin}" ]]; then
  echo "${bin}"
  exit 0
fi
mkdir -p "${dir}"
echo "build-coredns: building github.com/coredns/coredns@${version} (once; several minutes)" >&2
tmp="$(mktemp -d "${dir}/.build.XXXXXX")"
trap 'rm -rf "${tmp}"' EXIT
# Outside any module, so that no go.mod or go.work around is used.
(cd "${tmp}" && GOWORK=off GOFLAGS= CGO_ENABLED=0 GOBIN="${tmp}" go install -trimpath -ldflags=-s "github.com/coredns/coredns@${version}")
mv "${tmp}/coredns" "${bin}"
echo "${bin}"
