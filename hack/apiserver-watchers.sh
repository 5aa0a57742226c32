#!/usr/bin/env bash
# The API server's side of the controller at scale (issue 24 §2,
# docs/benchmarks.md): builds kpng and hack/cmd/kpng-apiwatchers, which
# starts the test control plane, loads SERVICES services × 10 endpoints,
# then runs CONTROLLERS `kpng kube … to-api` controllers and WATCHERS raw
# watchers as kube-proxy's (comma-separated counts, one configuration
# each), makes CHANGES EndpointSlice changes under each and prints one
# closing line a configuration:
#
#   watchers=N kind=raw|kpng services=S apiserver_cpu_ms_per_change=… bytes_per_change=… apiserver_cpu_s_initial=… bytes_initial=… apiserver_rss_mib=…
#
#   hack/apiserver-watchers.sh [kpng-apiwatchers flags]
#
# WATCHERS (default 10,100,500), CONTROLLERS (default 1,3; set empty,
# either runs none), SERVICES (default 1000), CHANGES (default 100). It
# raises the open-files limit (a connection a watcher), prints the
# machine's load before and after, and runs at nice 10.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"
: "${KPNG_CONTROLPLANE_DIR:=$(bash hack/build-controlplane.sh | tail -n 1)}"
export KPNG_CONTROLPLANE_DIR
bin="$(mktemp -d)"
trap 'rm -rf "${bin}"' EXIT
go build -o "${bin}/kpng" ./cmd/kpng
go build -o "${bin}/kpng-apiwatchers" ./hack/cmd/kpng-apiwatchers
flags=(--watchers="${WATCHERS-10,100,500}" --controllers="${CONTROLLERS-1,3}" --services="${SERVICES:-1000}" --changes="${CHANGES:-100}")
ulimit -n "$(ulimit -Hn)"
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), kernel $(uname -r), $(go version), $(date -u +%Y-%m-%dT%H:%MZ)" >&2
echo "load before: $(uptime)" >&2
nice -n 10 "${bin}/kpng-apiwatchers" --kpng="${bin}/kpng" "${flags[@]}" "$@"
echo "load after: $(uptime)" >&2
