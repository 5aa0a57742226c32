#!/usr/bin/env bash
# kubectl.sh ARGS... runs kubectl against the one-machine cluster, as its
# admin, from the lan namespace where the API server is.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
KPNGC_BIN="$(bash "${KPNGC_ROOT}/hack/build-controlplane.sh" --with-cluster 2>/dev/null | tail -n 1)"
kpngc_kubectl "$@"
