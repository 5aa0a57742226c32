#!/usr/bin/env bash
# The controller at scale (issue 24 §2, docs/benchmarks.md): builds kpng
# and hack/cmd/kpng-scale, which starts the test control plane, loads
# SERVICES services × 10 endpoints spread over NODES nodes, runs
# `kpng kube … to-api` and NODES lightweight backends against it, makes
# CHANGES EndpointSlice changes and prints the closing line
#
#   nodes=N services=S first_state_all_s=… change_p50_ms=… change_p99_ms=… controller_rss_mib=… bytes_per_change_per_node=…
#
#   hack/scale-controller.sh [kpng-scale flags]
#
# NODES (default 100), SERVICES (default 10000), CHANGES (default 100),
# CHANGE_GAP (default 0: back to back; e.g. 3s: each change after a pause);
# PROFILE_DIR, when set, keeps the controller's log and its profiles
# there (--profile --dir); TCP, when set, serves the backends on TCP
# loopback instead of a unix socket (--tcp); TLS, when set, on TCP
# loopback with TLS and client certificates, each backend its node's, as
# deploy/ runs the controller (--tls); CONTROLLER_ENV adds NAME=VALUE
# pairs to the controller's environment (e.g. GOMEMLIMIT=800MiB, as
# deploy/kpng-controller.yaml sets it); PLAIN, when set, has the
# backends not ask for deflated first states (--plain), which
# client/remote asks for; PEERS, when set, gives the controller its
# replicas' Service and has every backend follow them on a Peers stream,
# as deploy/'s node backends do (--peers). It raises the open-files
# limit (a connection a backend) and runs at nice 10.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"
: "${KPNG_CONTROLPLANE_DIR:=$(bash hack/build-controlplane.sh | tail -n 1)}"
export KPNG_CONTROLPLANE_DIR
bin="$(mktemp -d)"
trap 'rm -rf "${bin}"' EXIT
go build -o "${bin}/kpng" ./cmd/kpng
go build -o "${bin}/kpng-scale" ./hack/cmd/kpng-scale
flags=(--nodes="${NODES:-100}" --services="${SERVICES:-10000}" --changes="${CHANGES:-100}" --change-gap="${CHANGE_GAP:-0}")
if [ -n "${PROFILE_DIR:-}" ]; then flags+=(--profile --dir="${PROFILE_DIR}"); fi
if [ -n "${TCP:-}" ]; then flags+=(--tcp); fi
if [ -n "${TLS:-}" ]; then flags+=(--tls); fi
if [ -n "${CONTROLLER_ENV:-}" ]; then flags+=(--controller-env="${CONTROLLER_ENV}"); fi
if [ -n "${PLAIN:-}" ]; then flags+=(--plain); fi
if [ -n "${PEERS:-}" ]; then flags+=(--peers); fi
ulimit -n "$(ulimit -Hn)"
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), kernel $(uname -r), $(go version), $(date -u +%Y-%m-%dT%H:%MZ)" >&2
nice -n 10 "${bin}/kpng-scale" --kpng="${bin}/kpng" "${flags[@]}" "$@"
