# lib.sh: what the scripts of hack/cluster share: the cluster's layout
# (names, addresses, directories) and small helpers. Sourced, not run.
#
# The cluster, all on this machine (docs/cluster.md):
#   - a "lan" network namespace (kpngc-lan) holding the bridge that joins
#     the nodes, and the control plane: etcd, kube-apiserver (on the
#     bridge's address), kube-controller-manager, kube-scheduler;
#   - one network namespace per node (kpngc-node-a, kpngc-node-b, … as
#     KPNG_CLUSTER_NODES asks), each with its own containerd and kubelet,
#     its address on the bridge, and a pod network (CNI ptp + host-local)
#     routed to the others.
# Processes run in the namespaces with `nsenter --net` only: kubelet and
# containerd must share the mount namespace (the volumes kubelet mounts are
# bind-mounted into the containers by runc), which `ip netns exec` would
# give each its own.

KPNGC_PREFIX=kpngc
KPNGC_LAN="${KPNGC_PREFIX}-lan"
KPNGC_BRIDGE="${KPNGC_PREFIX}0"
KPNGC_LAN_IP=10.250.0.1
KPNGC_CLUSTER_CIDR=10.244.0.0/16
KPNGC_SERVICE_CIDR=10.96.0.0/16
KPNGC_KUBERNETES_IP=10.96.0.1
KPNGC_DNS_IP=10.96.0.10
KPNGC_API_PORT=6443
KPNGC_SERVER="https://${KPNGC_LAN_IP}:${KPNGC_API_PORT}"

# The sandbox image containerd runs for every pod, and the test image: both
# built here (images.sh), with the names the e2e tests ask for.
KPNGC_PAUSE_IMAGE=registry.k8s.io/pause:3.10.2
KPNGC_AGNHOST_IMAGE=registry.k8s.io/e2e-test-images/agnhost:2.63.0
# kpng's images, built here; the manifests get these names instead of their
# registry.example/kpng{,-nft,-iptables}:latest, and nothing else changes.
KPNGC_KPNG_IMAGE=localhost/kpng:cluster
KPNGC_KPNG_NFT_IMAGE=localhost/kpng-nft:cluster
KPNGC_KPNG_IPTABLES_IMAGE=localhost/kpng-iptables:cluster
KPNGC_COREDNS_IMAGE=localhost/coredns:v1.15.0

# Everything the cluster writes lives under KPNGC_DIR (state, logs, pid
# files, certificates); what is built once lives under KPNGC_CACHE.
KPNGC_DIR="${KPNG_CLUSTER_DIR:-/var/lib/kpng-cluster}"
KPNGC_CACHE="${KPNG_CACHE_DIR:-${HOME}/.cache/kpng}/cluster"
KPNGC_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

# The nodes: node-a, node-b, … (KPNG_CLUSTER_NODES of them, 2 by default,
# up to 9: the e2e tests of Traffic Distribution need 3 zones, one node
# each), node-X at 10.250.0.1N with the pod network 10.244.N.0/24. A
# cluster that is up keeps its count in KPNGC_DIR/nodes, which wins: the
# scripts run on it later (down.sh, proxier.sh) see all its nodes.
kpngc_node_count="${KPNG_CLUSTER_NODES:-2}"
if [[ -f "${KPNGC_DIR}/nodes" ]]; then
  kpngc_node_count="$(<"${KPNGC_DIR}/nodes")"
fi
[[ "${kpngc_node_count}" =~ ^[2-9]$ ]] || {
  echo "cluster: error: KPNG_CLUSTER_NODES=${kpngc_node_count}: want 2 to 9 nodes" >&2
  exit 1
}
KPNGC_NODES=()
declare -A KPNGC_NODE_IP=() KPNGC_POD_CIDR=()
for ((kpngc_i = 1; kpngc_i <= kpngc_node_count; kpngc_i++)); do
  kpngc_n="node-$(printf "\\x$(printf %x $((96 + kpngc_i)))")"
  KPNGC_NODES+=("${kpngc_n}")
  KPNGC_NODE_IP[${kpngc_n}]="10.250.0.1${kpngc_i}"
  KPNGC_POD_CIDR[${kpngc_n}]="10.244.${kpngc_i}.0/24"
done
unset kpngc_i kpngc_n

# The CNI plugins (Debian's containernetworking-plugins).
KPNGC_CNI_BIN=/usr/lib/cni

kpngc_log() {
  echo "cluster: $*" >&2
}

kpngc_die() {
  echo "cluster: error: $*" >&2
  exit 1
}

# kpngc_netns NODE prints the network namespace of NODE (or lan).
kpngc_netns() {
  echo "${KPNGC_PREFIX}-$1"
}

# kpngc_in NS CMD... runs CMD in the network namespace NS (lan or a node).
kpngc_in() {
  local ns
  ns="$(kpngc_netns "$1")"
  shift
  nsenter --net="/run/netns/${ns}" -- "$@"
}

# kpngc_kubectl ARGS... runs kubectl as the cluster's admin.
kpngc_kubectl() {
  kpngc_in lan "${KPNGC_BIN}/kubectl" --kubeconfig="${KPNGC_DIR}/pki/admin.kubeconfig" "$@"
}

# kpngc_start NAME NS CMD... starts CMD in the background in namespace NS
# (lan or a node; a node's UTS namespace too), in its own session, with its output in logs/NAME.log and
# its pid in run/NAME.pid.
kpngc_start() {
  local name="$1" ns="$2"
  shift 2
  mkdir -p "${KPNGC_DIR}/logs" "${KPNGC_DIR}/run"
  # exec all the way down (subshell, nsenter, setsid), so that $! is the
  # program's own pid.
  # A node's programs have the node's name as host name too (its UTS
  # namespace, up.sh): kubelet's host-network pods then see the node's
  # name, as on a machine of its own.
  local uts=()
  [[ ! -e "${KPNGC_DIR}/uts/${ns}" ]] || uts=(--uts="${KPNGC_DIR}/uts/${ns}")
  (exec nsenter --net="/run/netns/$(kpngc_netns "${ns}")" "${uts[@]}" -- setsid "$@" >"${KPNGC_DIR}/logs/${name}.log" 2>&1 </dev/null) &
  echo $! >"${KPNGC_DIR}/run/${name}.pid"
}

# kpngc_import_images NODE loads the images images.sh made into NODE's
# containerd (make e2e's too, with KPNGC_E2E=1); an image already there
# under the same name is replaced (the pods running keep theirs).
kpngc_import_images() {
  local archive archives=("${KPNGC_CACHE}/images/"{pause,agnhost,kpng,kpng-nft,kpng-iptables,coredns}.tar)
  [[ "${KPNGC_E2E:-}" != 1 ]] || archives+=("${KPNGC_CACHE}/images/e2e/"*.tar)
  for archive in "${archives[@]}"; do
    [[ "${archive}" == */busybox-root.tar ]] && continue
    ctr --address "${KPNGC_DIR}/run/$1/containerd.sock" -n k8s.io images import "${archive}" >/dev/null ||
      kpngc_die "loading ${archive} into ${1}'s containerd failed"
  done
}

# kpngc_coredns deploys CoreDNS (hack/e2e/coredns.yaml) as the cluster's
# DNS, the Service kube-dns on KPNGC_DNS_IP, and waits until it is ready.
# CoreDNS reaches the API server at its own address; the queries to kube-dns
# go through the proxier that serves it.
kpngc_coredns() {
  kpngc_coredns_manifest | kpngc_kubectl apply -f - >/dev/null
  kpngc_kubectl -n kube-system rollout status deployment/coredns --timeout=180s >/dev/null ||
    kpngc_die "CoreDNS did not become ready: $(kpngc_kubectl -n kube-system get pods -l k8s-app=kube-dns -o wide 2>&1)"
}

# kpngc_coredns_manifest prints hack/e2e/coredns.yaml for this cluster.
kpngc_coredns_manifest() {
  sed -e "s|__COREDNS_IMAGE__|${KPNGC_COREDNS_IMAGE}|" -e "s|__API_HOST__|${KPNGC_LAN_IP}|" \
    -e "s|__API_PORT__|${KPNGC_API_PORT}|" -e "s|__DNS_IP__|${KPNGC_DNS_IP}|" "${KPNGC_ROOT}/hack/e2e/coredns.yaml"
}

# kpngc_ours PID succeeds if PID is a process of the cluster: one whose
# command line names the cluster's directory (every process kpngc_start
# starts does). A pid file that outlived its process is then harmless.
kpngc_ours() {
  local cmdline
  cmdline="$(tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline")" && [[ "${cmdline}" == *"${KPNGC_DIR}/"* ]]
}

# kpngc_stop NAME stops the process of run/NAME.pid, if it is still the
# cluster's: TERM, up to 5 s to exit, then KILL.
kpngc_stop() {
  local f="${KPNGC_DIR}/run/$1.pid" pid i
  [[ -f "${f}" ]] || return 0
  pid="$(cat "${f}")"
  rm -f "${f}"
  kpngc_ours "${pid}" || return 0
  kill -TERM "${pid}" 2>/dev/null
  for i in $(seq 1 50); do
    kpngc_ours "${pid}" || return 0
    sleep 0.1
  done
  kill -KILL "${pid}" 2>/dev/null
  for i in $(seq 1 50); do
    kpngc_ours "${pid}" || return 0
    sleep 0.1
  done
}

# kpngc_wait WHAT SECONDS CMD... retries CMD every half second until it
# succeeds, or fails after SECONDS naming WHAT.
kpngc_wait() {
  local what="$1" timeout="$2"
  shift 2
  local deadline=$((SECONDS + timeout)) out
  until out="$("$@" 2>&1)"; do
    if ((SECONDS >= deadline)); then
      kpngc_log "timed out after ${timeout}s waiting for ${what}; the last try said: ${out:0:2000}"
      return 1
    fi
    sleep 0.5
  done
}

# The kernel settings kubelet sets for the whole machine (not per network
# namespace): up.sh saves them before the kubelets start, down.sh puts them
# back.
KPNGC_SYSCTLS=(kernel.panic kernel.panic_on_oops vm.overcommit_memory vm.panic_on_oom kernel.keys.root_maxkeys kernel.keys.root_maxbytes)

# kpngc_binaries sets KPNGC_BIN to the directory of the Kubernetes binaries
# (built once and cached by hack/build-controlplane.sh --with-cluster).
kpngc_binaries() {
  KPNGC_BIN="$(bash "${KPNGC_ROOT}/hack/build-controlplane.sh" --with-cluster | tail -n 1)"
  [[ -x "${KPNGC_BIN}/kubelet" ]] || kpngc_die "no kubelet in ${KPNGC_BIN}"
}
