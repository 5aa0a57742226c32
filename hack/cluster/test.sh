#!/usr/bin/env bash
# test.sh: the cluster's smoke test (make cluster-test). Brings the cluster
# up, deploys kpng as its only proxier, nft then iptables, and checks with
# real pods and real traffic:
#   - a pod on node-a reaches a ClusterIP service whose endpoints are all on
#     node-b;
#   - a NodePort from outside the nodes (the lan namespace), through the node
#     with no endpoint;
#   - a service with externalTrafficPolicy: Local answers on the node with an
#     endpoint and not on the other;
#   - kpng's /healthz on the node's address and /metrics on the node's
#     loopback, the DaemonSet's ports;
#   - an open connection through a cluster IP keeps working while the kpng
#     pod is deleted and the DaemonSet starts another;
# then the seeds' mode (kube-proxy as the default proxier, kpng beside it for
# its labelled services), then tears everything down and checks that nothing
# is left. Prints one closing line with what passed and each phase's time.
# A headless service through DNS is not checked: the cluster has no CoreDNS.
set -euo pipefail
here="$(dirname "${BASH_SOURCE[0]}")"
source "${here}/lib.sh"

passed=() failed=() times=()
t0=${SECONDS}
phase_start=${SECONDS}
phase() {
  times+=("$1=$((SECONDS - phase_start))s")
  phase_start=${SECONDS}
}

# check NAME CMD... runs CMD, recording NAME as passed or failed.
check() {
  local name="$1"
  shift
  if "$@"; then
    passed+=("${name}")
    kpngc_log "PASS ${name}"
  else
    failed+=("${name}")
    kpngc_log "FAIL ${name}"
  fi
}

finish() {
  local rc=$?
  if [[ -z "${KPNG_CLUSTER_KEEP:-}" ]]; then
    bash "${here}/down.sh" || failed+=("cluster-down")
    if leftovers="$(bash "${here}/leftovers.sh")"; then
      passed+=("nothing-left")
    else
      failed+=("nothing-left")
      kpngc_log "left behind: ${leftovers}"
    fi
    phase down
  fi
  ((${#failed[@]} == 0 && rc == 0)) || rc=1
  echo "cluster-test: $([[ ${rc} == 0 ]] && echo PASS || echo FAIL) passed=${#passed[@]} failed=${#failed[@]}${failed:+ (${failed[*]})} times: ${times[*]} total=$((SECONDS - t0))s"
  exit "${rc}"
}
# A cluster that is not this run's is left alone: no teardown then.
[[ ! -e "${KPNGC_DIR}" ]] || kpngc_die "${KPNGC_DIR} holds a cluster already (make cluster-down removes it)"
trap finish EXIT

k() { kpngc_kubectl "$@"; }
ns=kpngc-test

# The workload: two servers on node-b (agnhost netexec: /hostname), one
# client on node-a, and the services.
workload() {
  k create namespace "${ns}" >/dev/null
  cat <<EOF | k apply -f - >/dev/null
apiVersion: apps/v1
kind: Deployment
metadata: {name: server, namespace: ${ns}}
spec:
  replicas: 2
  selector: {matchLabels: {app: server}}
  template:
    metadata: {labels: {app: server}}
    spec:
      nodeName: node-b
      containers:
      - name: netexec
        image: ${KPNGC_AGNHOST_IMAGE}
        args: ["netexec", "--http-port=8080"]
        readinessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 1}
---
apiVersion: v1
kind: Pod
metadata: {name: client, namespace: ${ns}}
spec:
  nodeName: node-a
  terminationGracePeriodSeconds: 0
  containers:
  - name: client
    image: ${KPNGC_AGNHOST_IMAGE}
    args: ["pause"]
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: ${ns}}
spec:
  type: NodePort
  selector: {app: server}
  ports: [{port: 80, targetPort: 8080, nodePort: 30080}]
---
apiVersion: v1
kind: Service
metadata: {name: web-local, namespace: ${ns}}
spec:
  type: NodePort
  externalTrafficPolicy: Local
  selector: {app: server}
  ports: [{port: 80, targetPort: 8080, nodePort: 30081}]
EOF
  k -n "${ns}" rollout status deployment/server --timeout=180s >/dev/null
  k -n "${ns}" wait --for=condition=Ready pod/client --timeout=180s >/dev/null
}

# get_from_pod URL: an HTTP GET from the client pod (node-a), with bash's
# /dev/tcp (the test image has no curl).
get_from_pod() {
  local hostport="${1%%/*}" path="/${1#*/}"
  k -n "${ns}" exec client -- timeout 5 bash -c \
    'exec 3<>"/dev/tcp/${0%:*}/${0#*:}"; printf "GET %s HTTP/1.0\r\n\r\n" "$1" >&3; cat <&3' "${hostport}" "${path}" 2>/dev/null |
    tail -n 1
}

# server_name prints whether OUTPUT is one of the server pods' names.
is_server() {
  [[ "$1" == server-* ]]
}

clusterip_other_node() {
  local vip out
  vip="$(k -n "${ns}" get service web -o jsonpath='{.spec.clusterIP}')"
  out="$(get_from_pod "${vip}:80/hostname")"
  is_server "${out}" || { kpngc_log "cluster IP ${vip}: got '${out}'"; return 1; }
}

nodeport_from_outside() {
  local out
  # Through node-a, which has no endpoint of its own.
  out="$(kpngc_in lan curl -s --max-time 5 "http://${KPNGC_NODE_IP[node-a]}:30080/hostname")"
  is_server "${out}" || { kpngc_log "NodePort via node-a: got '${out}'"; return 1; }
}

etp_local() {
  local out
  out="$(kpngc_in lan curl -s --max-time 5 "http://${KPNGC_NODE_IP[node-b]}:30081/hostname")"
  is_server "${out}" || { kpngc_log "eTP Local via node-b: got '${out}'"; return 1; }
  # node-a has no local endpoint: the connection must fail.
  if kpngc_in lan curl -s --max-time 3 "http://${KPNGC_NODE_IP[node-a]}:30081/hostname" >/dev/null; then
    kpngc_log "eTP Local via node-a answered"
    return 1
  fi
}

# healthz_metrics HEALTHZ_PORT METRICS_PORT: kpng's /healthz on each node's
# address (from the lan), its /metrics on each node's loopback.
healthz_metrics() {
  local node metrics
  for node in "${KPNGC_NODES[@]}"; do
    kpngc_in lan curl -sf --max-time 5 "http://${KPNGC_NODE_IP[${node}]}:$1/healthz" >/dev/null ||
      { kpngc_log "no /healthz on ${node}:$1"; return 1; }
    # Read whole, then matched: grep -q would close the pipe early, and
    # curl's failure to write the rest would fail the pipeline.
    metrics="$(kpngc_in "${node}" curl -sf --max-time 5 "http://127.0.0.1:$2/metrics")" &&
      grep -q '^kpng_' <<<"${metrics}" ||
      { kpngc_log "no kpng metrics on ${node} 127.0.0.1:$2"; return 1; }
  done
}

# connection_survives DAEMONSET: one HTTP/1.1 connection through the cluster
# IP, a request before and one after the kpng pod of node-a is deleted and
# replaced by the DaemonSet.
connection_survives() {
  local ds="$1" vip old
  vip="$(k -n "${ns}" get service web -o jsonpath='{.spec.clusterIP}')"
  k -n "${ns}" exec client -- rm -f /tmp/go /tmp/out
  k -n "${ns}" exec client -- timeout 240 bash -c '
    exec 3<>"/dev/tcp/$0/80"
    req() { printf "GET /hostname HTTP/1.1\r\nHost: web\r\n\r\n" >&3; head -c "$(
      while read -r l; do l="${l%$'"'\r'"'}"; [[ -z "$l" ]] && break; [[ "$l" == [Cc]ontent-[Ll]ength:* ]] && n="${l#*: }"; done <&3; echo "$n")" <&3; echo; }
    req >/tmp/out
    until [[ -e /tmp/go ]]; do sleep 0.2; done
    req >>/tmp/out
    echo done >>/tmp/out' "${vip}" &
  local client=$!
  kpngc_wait "the first request" 30 k -n "${ns}" exec client -- grep -q server- /tmp/out || return 1
  old="$(k -n kube-system get pods -l "app.kubernetes.io/name=${ds}" --field-selector spec.nodeName=node-a -o name)"
  [[ -n "${old}" ]] || { kpngc_log "no pod of ${ds} on node-a"; return 1; }
  k -n kube-system delete "${old}" --wait=true --timeout=120s >/dev/null || return 1
  # Another pod of the DaemonSet on node-a, ready: it has synced (its
  # readiness is /healthz).
  replaced() {
    k -n kube-system get pods -l "app.kubernetes.io/name=${ds}" --field-selector spec.nodeName=node-a \
      -o jsonpath='{range .items[*]}pod/{.metadata.name} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' |
      awk -v old="${old}" '$1 != old && $2 == "True" { found = 1 } END { exit !found }'
  }
  kpngc_wait "a new ready pod of ${ds} on node-a" 180 replaced || return 1
  k -n "${ns}" exec client -- touch /tmp/go || return 1
  wait "${client}" || true
  local out
  out="$(k -n "${ns}" exec client -- cat /tmp/out)"
  [[ "$(grep -c '^server-' <<<"${out}")" == 2 && "${out}" == *done ]] ||
    { kpngc_log "connection across the restart of ${old}: '${out}'"; return 1; }
}

# proxier_checks NAME DAEMONSET: the checks with the proxier NAME deployed.
proxier_checks() {
  local name="$1" ds="$2"
  check "${name}:clusterip-other-node" kpngc_wait "the cluster IP through ${name}" 60 clusterip_other_node
  check "${name}:nodeport-from-outside" kpngc_wait "the NodePort through ${name}" 60 nodeport_from_outside
  check "${name}:etp-local" kpngc_wait "eTP Local through ${name}" 60 etp_local
  check "${name}:healthz-metrics" healthz_metrics 10256 10249
  check "${name}:connection-survives-restart" connection_survives "${ds}"
}

kpngc_binaries
bash "${here}/up.sh"
phase up
workload
phase workload

for backend in nft iptables; do
  bash "${here}/proxier.sh" deploy "kpng-${backend}"
  phase "deploy-kpng-${backend}"
  proxier_checks "kpng-${backend}" "kpng-default-${backend}"
  bash "${here}/proxier.sh" remove "kpng-${backend}"
  phase "kpng-${backend}"
done

# The seeds' mode: kube-proxy the default proxier; kpng-nft and the blog's
# all-IP proxier for the services labelled with their names. The service web
# is kube-proxy's, web-kpng kpng-nft's, web-allip kpng-example's.
bash "${here}/proxier.sh" deploy seeds
phase deploy-seeds
cat <<EOF | k apply -f - >/dev/null
apiVersion: v1
kind: Service
metadata:
  name: web-kpng
  namespace: ${ns}
  labels: {service.kubernetes.io/service-proxy-name: kpng-nft}
spec:
  selector: {app: server}
  ports: [{port: 80, targetPort: 8080}]
EOF
seeds_kpng() {
  local vip out
  vip="$(k -n "${ns}" get service web-kpng -o jsonpath='{.spec.clusterIP}')"
  out="$(get_from_pod "${vip}:80/hostname")"
  is_server "${out}" || return 1
  # It is kpng's table that has it, not kube-proxy's.
  grep -qwF "${vip}" <<<"$(kpngc_in node-a nft list table inet kpng-kpng-nft)"
}
seeds_kube_proxy() {
  local vip out
  vip="$(k -n "${ns}" get service web -o jsonpath='{.spec.clusterIP}')"
  out="$(get_from_pod "${vip}:80/hostname")"
  is_server "${out}" || return 1
  ! grep -qwF "${vip}" <<<"$(kpngc_in node-a nft list table inet kpng-kpng-nft)"
}
# The blog's all-IP proxier: every port of the external IP DNATed to the
# service's endpoint on the node the IP is routed to (node-b, from the lan).
cat <<EOF | k apply -f - >/dev/null
apiVersion: v1
kind: Service
metadata:
  name: web-allip
  namespace: ${ns}
  labels: {service.kubernetes.io/service-proxy-name: kpng-example}
spec:
  selector: {app: server}
  ports: [{port: 80, targetPort: 8080}]
  externalIPs: [10.250.100.1]
EOF
ip -n "${KPNGC_LAN}" route replace 10.250.100.1/32 via "${KPNGC_NODE_IP[node-b]}"
seeds_allip() {
  local out
  out="$(kpngc_in lan curl -s --max-time 5 "http://10.250.100.1:8080/hostname")"
  is_server "${out}"
}
check "seeds:allip-external-ip" kpngc_wait "the all-IP proxier's external IP" 60 seeds_allip
check "seeds:kpng-nft-labelled" kpngc_wait "web-kpng through kpng-nft" 60 seeds_kpng
check "seeds:kube-proxy-unlabelled" kpngc_wait "web through kube-proxy" 60 seeds_kube_proxy
phase seeds
