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

# vulncheck.sh runs govulncheck on the module's packages against a
# vulnerability database built locally from the golang.org/x/vulndb module
# (its data/osv reports, laid out as govulncheck's index/ + ID/ database by
# hack/cmd/kpng-vulndb), so that no online database is needed: only the Go
# module proxy.
#
#   hack/vulncheck.sh GOVULNCHECK_VERSION VULNDB_VERSION [govulncheck args...]
#
# The database is cached in
#   ${KPNG_CACHE_DIR:-$HOME/.cache/kpng}/vulndb/<VULNDB_VERSION>/
# and only built when missing; it is built under a temporary name and
# renamed into place, so an interrupted build never looks like a cached one.
# govulncheck exits non-zero (3) when the code calls a vulnerable symbol;
# vulnerabilities only in required modules or imported packages that the
# code does not reach are listed but do not fail the run.

set -euo pipefail

log() {
  echo "vulncheck: $*" >&2
}

if [[ $# -lt 2 ]]; then
  echo "usage: $0 GOVULNCHECK_VERSION VULNDB_VERSION [govulncheck args...]" >&2
  exit 2
fi
govulncheck_version="$1"
vulndb_version="$2"
shift 2
if [[ $# -eq 0 ]]; then
  set -- ./...
fi

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache_root="${KPNG_CACHE_DIR:-${HOME}/.cache/kpng}"
db="${cache_root}/vulndb/${vulndb_version}"

start=${SECONDS}
if [[ -s "${db}/index/db.json" ]]; then
  log "using the cached database in ${db}"
else
  mkdir -p "${cache_root}/vulndb"
  tmp="${db}.tmp.$$"
  trap 'rm -rf "'"${tmp}"'"' EXIT
  trap 'rm -rf "'"${tmp}"'"; exit 130' INT TERM
  log "building the database from golang.org/x/vulndb@${vulndb_version}"
  # Downloaded outside this module (the vulndb module is data here, not a
  # dependency): only its zip is fetched, nothing of it is built.
  src="$(cd "${cache_root}" && GOWORK=off go mod download -json "golang.org/x/vulndb@${vulndb_version}" | jq -r .Dir)"
  (cd "${root}" && go run ./hack/cmd/kpng-vulndb -osv "${src}/data/osv" -out "${tmp}")
  rm -rf "${db}"
  mv "${tmp}" "${db}"
  trap - EXIT INT TERM
  log "database built in $((SECONDS - start))s"
fi

cd "${root}"
log "govulncheck ${govulncheck_version} $*"
go run "golang.org/x/vuln/cmd/govulncheck@${govulncheck_version}" -db "file://${db}" "$@"
log "no reachable vulnerability ($((SECONDS - start))s)"
