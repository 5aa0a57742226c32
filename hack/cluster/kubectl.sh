#!/usr/bin/env bash
# kubectl.sh ARGS... runs kubectl against the one-machine cluster, as its
# admin, from the lan namespace where the API server is.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
kpngc_binaries
kpngc_kubectl "$@"
