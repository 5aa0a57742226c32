#!/usr/bin/env bash
# up.sh brings up the one-machine cluster (lib.sh tells its layout; see
# docs/cluster.md) with no proxier: the lan and node network namespaces,
# the control plane, and on each node containerd and kubelet, the images
# loaded. proxier.sh then deploys the proxier. down.sh removes everything.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/pki.sh"

[[ "$(id -u)" == 0 ]] || kpngc_die "run as root: the cluster needs network namespaces, cgroups and mounts"
[[ ! -e /sys/fs/cgroup/cgroup.controllers ]] ||
  kpngc_die "this machine has cgroup v2 only: these scripts make the kubelets' cgroup roots in cgroup v1's hierarchies"
# The cluster's directory, claimed at once (mkdir is atomic): a second
# up.sh, or one beside a cluster that runs, stops here.
mkdir -p "$(dirname "${KPNGC_DIR}")"
mkdir "${KPNGC_DIR}" 2>/dev/null ||
  kpngc_die "${KPNGC_DIR} holds a cluster already: run hack/cluster/down.sh (make cluster-down) first"

# What the nodes run comes from Debian's packages.
need=()
for tool in containerd:containerd runc:runc buildah:buildah debootstrap:debootstrap openssl:openssl nsenter:util-linux nft:nftables iptables:iptables conntrack:conntrack curl:curl; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || need+=("${tool##*:}")
done
[[ -x "${KPNGC_CNI_BIN}/ptp" ]] || need+=(containernetworking-plugins)
# make e2e's busybox image is Debian's static busybox.
[[ "${KPNGC_E2E:-}" != 1 || -x /bin/busybox ]] || need+=(busybox-static)
if ((${#need[@]} > 0)); then
  kpngc_log "installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

phase_start=${SECONDS}
phase() {
  kpngc_log "$1 ($((SECONDS - phase_start))s)"
  phase_start=${SECONDS}
}

kpngc_binaries
phase "Kubernetes binaries ready in ${KPNGC_BIN}"
bash "$(dirname "${BASH_SOURCE[0]}")/images.sh"
phase "images built"

mkdir -p "${KPNGC_DIR}/run" "${KPNGC_DIR}/logs"
echo "${#KPNGC_NODES[@]}" >"${KPNGC_DIR}/nodes"

# The network: a bridge in the lan namespace, a veth to each node.
ip netns add "${KPNGC_LAN}"
ip -n "${KPNGC_LAN}" link set lo up
ip -n "${KPNGC_LAN}" link add "${KPNGC_BRIDGE}" type bridge
ip -n "${KPNGC_LAN}" addr add "${KPNGC_LAN_IP}/24" dev "${KPNGC_BRIDGE}"
ip -n "${KPNGC_LAN}" link set "${KPNGC_BRIDGE}" up
for node in "${KPNGC_NODES[@]}"; do
  ns="$(kpngc_netns "${node}")"
  ip netns add "${ns}"
  ip -n "${ns}" link set lo up
  ip -n "${KPNGC_LAN}" link add "${node}" type veth peer name eth0 netns "${ns}"
  ip -n "${KPNGC_LAN}" link set "${node}" master "${KPNGC_BRIDGE}" up
  ip -n "${ns}" addr add "${KPNGC_NODE_IP[${node}]}/24" dev eth0
  ip -n "${ns}" link set eth0 up
  ip -n "${ns}" route add default via "${KPNGC_LAN_IP}"
  ip netns exec "${ns}" sysctl -qw net.ipv4.ip_forward=1
  # Each node's pods are reached through it, from the lan and the others.
  ip -n "${KPNGC_LAN}" route add "${KPNGC_POD_CIDR[${node}]}" via "${KPNGC_NODE_IP[${node}]}"
  for other in "${KPNGC_NODES[@]}"; do
    [[ "${other}" == "${node}" ]] || ip -n "${ns}" route add "${KPNGC_POD_CIDR[${other}]}" via "${KPNGC_NODE_IP[${other}]}"
  done
done
# Each node's host name, in a UTS namespace of its own kept by a bind mount
# (on a private mount, as unshare requires), for the node's programs.
mkdir -p "${KPNGC_DIR}/uts"
mount --bind "${KPNGC_DIR}/uts" "${KPNGC_DIR}/uts"
mount --make-private "${KPNGC_DIR}/uts"
for node in "${KPNGC_NODES[@]}"; do
  touch "${KPNGC_DIR}/uts/${node}"
  unshare --uts="${KPNGC_DIR}/uts/${node}" hostname "${node}"
done
phase "network namespaces ${KPNGC_LAN} and $(for n in "${KPNGC_NODES[@]}"; do kpngc_netns "${n}"; done | paste -sd' ') joined"

kpngc_pki

# The control plane, in the lan namespace.
kpngc_start etcd lan "${KPNGC_BIN}/etcd" --name=kpngc --data-dir="${KPNGC_DIR}/etcd" \
  --listen-client-urls=http://127.0.0.1:2379 --advertise-client-urls=http://127.0.0.1:2379 \
  --listen-peer-urls=http://127.0.0.1:2380 --initial-advertise-peer-urls=http://127.0.0.1:2380 \
  --initial-cluster=kpngc=http://127.0.0.1:2380 --unsafe-no-fsync
pki="${KPNGC_DIR}/pki"
kpngc_start kube-apiserver lan "${KPNGC_BIN}/kube-apiserver" \
  --bind-address="${KPNGC_LAN_IP}" --advertise-address="${KPNGC_LAN_IP}" --secure-port="${KPNGC_API_PORT}" \
  --etcd-servers=http://127.0.0.1:2379 \
  --tls-cert-file="${pki}/apiserver.crt" --tls-private-key-file="${pki}/apiserver.key" \
  --client-ca-file="${pki}/ca.crt" \
  --kubelet-client-certificate="${pki}/apiserver-kubelet-client.crt" --kubelet-client-key="${pki}/apiserver-kubelet-client.key" \
  --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
  --kubelet-preferred-address-types=InternalIP \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="${pki}/sa.pub" --service-account-signing-key-file="${pki}/sa.key" \
  --service-cluster-ip-range="${KPNGC_SERVICE_CIDR}" --allow-privileged=true
kpngc_wait "the API server" 120 kpngc_kubectl get --raw /readyz
kpngc_start kube-controller-manager lan "${KPNGC_BIN}/kube-controller-manager" \
  --kubeconfig="${pki}/controller-manager.kubeconfig" \
  --authentication-kubeconfig="${pki}/controller-manager.kubeconfig" \
  --authorization-kubeconfig="${pki}/controller-manager.kubeconfig" \
  --bind-address=127.0.0.1 --leader-elect=false --use-service-account-credentials=true \
  --service-account-private-key-file="${pki}/sa.key" --root-ca-file="${pki}/ca.crt" \
  --cluster-signing-cert-file="${pki}/ca.crt" --cluster-signing-key-file="${pki}/ca.key" \
  --service-cluster-ip-range="${KPNGC_SERVICE_CIDR}"
kpngc_start kube-scheduler lan "${KPNGC_BIN}/kube-scheduler" \
  --kubeconfig="${pki}/scheduler.kubeconfig" \
  --authentication-kubeconfig="${pki}/scheduler.kubeconfig" \
  --authorization-kubeconfig="${pki}/scheduler.kubeconfig" \
  --bind-address=127.0.0.1 --leader-elect=false
phase "control plane up at ${KPNGC_SERVER}"

# The nodes: containerd and kubelet in each node's namespace. kubelet sets
# a few kernel settings of the whole machine: saved for down.sh to restore.
for k in "${KPNGC_SYSCTLS[@]}"; do
  echo "${k}=$(sysctl -n "${k}")"
done >"${KPNGC_DIR}/sysctls.saved"
for node in "${KPNGC_NODES[@]}"; do
  d="${KPNGC_DIR}/${node}"
  mkdir -p "${d}/cni" "${d}/kubelet" "${d}/pods-logs"
  # kubelet refuses a cgroupRoot that does not exist in every cgroup v1
  # hierarchy: make it in each (down.sh removes them).
  for h in /sys/fs/cgroup/*/; do
    [[ -e "${h}cgroup.procs" ]] || continue
    mkdir -p "${h}${KPNGC_PREFIX}-${node}"
    if [[ -e "${h}cpuset.cpus" ]]; then
      cat "${h}cpuset.cpus" >"${h}${KPNGC_PREFIX}-${node}/cpuset.cpus"
      cat "${h}cpuset.mems" >"${h}${KPNGC_PREFIX}-${node}/cpuset.mems"
    fi
  done
  cat >"${d}/containerd.toml" <<EOF
version = 2
root = "${d}/containerd/root"
state = "${KPNGC_DIR}/run/${node}/containerd"
[grpc]
  address = "${KPNGC_DIR}/run/${node}/containerd.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "${d}/opt"
[ttrpc]
  address = "${KPNGC_DIR}/run/${node}/containerd-ttrpc.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "${KPNGC_PAUSE_IMAGE}"
  # These machines refuse a lower oom_score_adj than the process's own; runc
  # fails on it with only "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "${KPNGC_CNI_BIN}"
    conf_dir = "${d}/cni"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      # runc's state in the cluster's directory, not /run/containerd/runc.
      Root = "${KPNGC_DIR}/run/${node}/runc"
EOF
  cat >"${d}/cni/10-kpngc.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "kpngc",
  "plugins": [
    {
      "type": "ptp",
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "${KPNGC_POD_CIDR[${node}]}"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "${d}/cni-ipam"
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
  mkdir -p "${KPNGC_DIR}/run/${node}"
  kpngc_start "containerd-${node}" "${node}" containerd --config "${d}/containerd.toml"
  kpngc_wait "containerd on ${node}" 60 ctr --address "${KPNGC_DIR}/run/${node}/containerd.sock" version
  kpngc_import_images "${node}"
  echo "nameserver 127.0.0.1" >"${d}/resolv.conf"
  cat >"${d}/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# These machines have cgroup v1, which kubelet 1.35 and later refuse unless
# told not to.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /${KPNGC_PREFIX}-${node}
containerRuntimeEndpoint: unix://${KPNGC_DIR}/run/${node}/containerd.sock
address: ${KPNGC_NODE_IP[${node}]}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: ${pki}/ca.crt}
authorization:
  mode: Webhook
clusterDomain: cluster.local
clusterDNS: [${KPNGC_DNS_IP}]
resolvConf: ${d}/resolv.conf
podLogsDir: ${d}/pods-logs
failSwapOn: false
# No registry can be reached: an image removed could never come back.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  imagefs.available: 1%
  nodefs.inodesFree: 1%
serializeImagePulls: false
EOF
  kpngc_start "kubelet-${node}" "${node}" "${KPNGC_BIN}/kubelet" \
    --config="${d}/kubelet.yaml" --kubeconfig="${pki}/kubelet-${node}.kubeconfig" \
    --root-dir="${d}/kubelet" --cert-dir="${d}/kubelet/pki" \
    --hostname-override="${node}" --node-ip="${KPNGC_NODE_IP[${node}]}"
done
for node in "${KPNGC_NODES[@]}"; do
  kpngc_wait "node ${node} Ready" 180 kpngc_kubectl wait --for=condition=Ready "node/${node}" --timeout=1s
done
phase "nodes $(kpngc_kubectl get nodes -o name | paste -sd' ') Ready"
# hack/e2e/run.sh uses a cluster only if it has the e2e tests' images.
[[ "${KPNGC_E2E:-}" != 1 ]] || touch "${KPNGC_DIR}/run/e2e-images"
kpngc_log "up; kubectl: hack/cluster/kubectl.sh (or: nsenter --net=/run/netns/${KPNGC_LAN} kubectl --kubeconfig=${pki}/admin.kubeconfig)"
