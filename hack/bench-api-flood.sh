#!/usr/bin/env bash
# Measures what a flood of clients costs a controller: `kpng file … to-api`
# serving a state file of synthetic services (hack/cmd/kpng-genstate:
# SERVICES × ENDPOINTS) on 127.0.0.1:PORT with TLS and client certificates
# (a CA, the server's certificate, node-a's, CN=system:node:node-a,
# O=system:nodes, and a reader's, CN=kpng-reader, made with openssl), then hack/cmd/kpng-apiflood with the
# arguments given, which prints the controller's RSS, open files and
# goroutines before, at the peak, while held and after. docs/operating.md
# (Security) records the results.
#
#   hack/bench-api-flood.sh --attack=streams --conns=1 --streams=200
#   hack/bench-api-flood.sh --attack=stalled --conns=100
#   hack/bench-api-flood.sh --attack=idle --conns=5000 --sources=500
#
# KPNG (a kpng binary; default: built from this tree), SERVICES (default
# 5000), ENDPOINTS (default 10), PORT (default 17631), TO_API_FLAGS (more
# to-api flags, e.g. --connection-idle-timeout=30s), CLIENT (node or
# reader: the client certificate; give the reader --nodes=N and
# TO_API_FLAGS=--tls-any-node-cn=kpng-reader).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${root}"
work="$(mktemp -d)"
pid=""
cleanup() {
  if [ -n "${pid}" ]; then kill "${pid}" 2>/dev/null || true; wait "${pid}" 2>/dev/null || true; fi
  rm -rf "${work}"
}
trap cleanup EXIT
port=${PORT:-17631}
metrics=$((port + 1))
kpng=${KPNG:-}
if [ -z "${kpng}" ]; then
  go build -o "${work}/kpng" ./cmd/kpng
  kpng="${work}/kpng"
fi
go build -o "${work}/kpng-genstate" ./hack/cmd/kpng-genstate
go build -o "${work}/kpng-apiflood" ./hack/cmd/kpng-apiflood
"${work}/kpng-genstate" --services="${SERVICES:-5000}" --endpoints="${ENDPOINTS:-10}" --format=json --out="${work}/state.json"

pki="${work}/pki"
mkdir "${pki}"
cert() { # name subject ext
  openssl ecparam -genkey -name prime256v1 -out "${pki}/$1-key.pem"
  openssl req -new -key "${pki}/$1-key.pem" -subj "$2" -out "${pki}/$1.csr"
  printf '%b' "$3" > "${pki}/$1.ext"
  openssl x509 -req -in "${pki}/$1.csr" -CA "${pki}/ca.pem" -CAkey "${pki}/ca-key.pem" -CAcreateserial -days 1 \
    -extfile "${pki}/$1.ext" -out "${pki}/$1.pem" 2>/dev/null
}
openssl ecparam -genkey -name prime256v1 -out "${pki}/ca-key.pem"
openssl req -x509 -new -key "${pki}/ca-key.pem" -subj "/CN=kpng-apiflood CA" -days 1 -out "${pki}/ca.pem"
cert server "/CN=kpng" 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n'
cert node "/O=system:nodes/CN=system:node:node-a" 'extendedKeyUsage=clientAuth\n'
cert reader "/CN=kpng-reader" 'extendedKeyUsage=clientAuth\n'
client=${CLIENT:-node}

# shellcheck disable=SC2086 # TO_API_FLAGS is a list of flags
"${kpng}" file --input="${work}/state.json" --metrics-bind-address="127.0.0.1:${metrics}" \
  to-api --listen="127.0.0.1:${port}" --tls-cert="${pki}/server.pem" --tls-key="${pki}/server-key.pem" \
  --tls-client-ca="${pki}/ca.pem" ${TO_API_FLAGS:-} 2>"${work}/kpng.log" &
pid=$!
for _ in $(seq 100); do
  if curl -fsS "http://127.0.0.1:${metrics}/metrics" >/dev/null 2>&1; then break; fi
  sleep 0.1
done
sleep 2 # the state read
ulimit -n "$(ulimit -Hn)"
"${work}/kpng-apiflood" --api="127.0.0.1:${port}" --api-tls-ca="${pki}/ca.pem" --api-tls-cert="${pki}/${client}.pem" \
  --api-tls-key="${pki}/${client}-key.pem" --pid="${pid}" --metrics="http://127.0.0.1:${metrics}/metrics" "$@" 2>"${work}/flood.log"
