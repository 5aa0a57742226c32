#!/usr/bin/env bash
# down.sh removes the one-machine cluster and everything it made: the
# containers and their processes, containerd, kubelet and the control plane,
# the mounts under the cluster's directory, the cgroups under each node's
# cgroupRoot, the network namespaces (and with them every interface,
# nftables and iptables rule the proxiers made in them), and the directory.
# It works on a half-made cluster too, and running it twice is harmless.
# What is built once (binaries, the Debian root filesystem) stays cached.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[[ "$(id -u)" == 0 ]] || kpngc_die "run as root"

# cgroups_of NODE prints the node's cgroup directories in every hierarchy,
# deepest first.
cgroups_of() {
  local h
  for h in /sys/fs/cgroup/*/; do
    [[ -d "${h}${KPNGC_PREFIX}-$1" ]] && find "${h}${KPNGC_PREFIX}-$1" -depth -type d
  done
}

# kill_cgroups NODE kills every process in the node's cgroups (its pods'
# containers), repeating until none is left.
kill_cgroups() {
  local i pids
  for i in $(seq 1 50); do
    pids="$(cgroups_of "$1" | sed 's|$|/cgroup.procs|' | xargs -r cat 2>/dev/null | sort -u)"
    [[ -n "${pids}" ]] || return 0
    # shellcheck disable=SC2086
    kill -9 ${pids} 2>/dev/null
    sleep 0.1
  done
  kpngc_log "processes left in the cgroups of $1: ${pids}"
}

stop() { kpngc_stop "$@"; }

# Proxiers run as processes (proxier.sh) first, then each node's kubelet,
# its containers, the containerd shims that ran them, and containerd.
for f in "${KPNGC_DIR}"/run/proxier-*.pid; do
  [[ -e "${f}" ]] && stop "$(basename "${f}" .pid)"
done
for node in "${KPNGC_NODES[@]}"; do
  stop "kubelet-${node}"
done
# shim_sockets NODE prints the sockets of the node's containerd shims: they
# live in /run/containerd/s whatever containerd's configuration, named by
# the sha256 of <containerd's address>/<namespace>/<container id>, and a
# killed shim leaves its socket behind.
shim_sockets() {
  local address="${KPNGC_DIR}/run/$1/containerd.sock" pid ns id
  for pid in $(pgrep -f "containerd-shim.*-address ${address}"); do
    ns="$(tr '\0' '\n' 2>/dev/null <"/proc/${pid}/cmdline" | sed -n '/^-namespace$/{n;p}')"
    id="$(tr '\0' '\n' 2>/dev/null <"/proc/${pid}/cmdline" | sed -n '/^-id$/{n;p}')"
    [[ -n "${ns}" && -n "${id}" ]] || continue
    printf '/run/containerd/s/%s\n' "$(printf '%s' "${address}/${ns}/${id}" | sha256sum | cut -c1-64)"
  done
}

for node in "${KPNGC_NODES[@]}"; do
  kill_cgroups "${node}"
  sockets="$(shim_sockets "${node}")"
  # The shims are containerd's children in spirit only: they outlive it.
  pkill -9 -f "containerd-shim.*-address ${KPNGC_DIR}/run/${node}/containerd.sock" 2>/dev/null
  [[ -z "${sockets}" ]] || xargs -r rm -f <<<"${sockets}"
  stop "containerd-${node}"
done
# The CNI plugins' cache of each pod's networks (libcni's, in /var/lib/cni):
# the cluster's network and containerd's loopback, named by sandbox.
for sandbox in "${KPNGC_DIR}"/run/*/containerd/io.containerd.grpc.v1.cri/sandboxes/*; do
  [[ -e "${sandbox}" ]] && rm -f /var/lib/cni/results/*-"$(basename "${sandbox}")"-*
done
rm -f /var/lib/cni/results/kpngc-*
for c in kube-scheduler kube-controller-manager kube-apiserver etcd; do
  stop "${c}"
done
# Any other of the cluster's programs whose command line names its
# directory (a pid file lost): only those programs, never a shell or a
# viewer of its logs.
for pid in $(pgrep -f -- "${KPNGC_DIR}/"); do
  exe="$(basename "$(readlink "/proc/${pid}/exe" 2>/dev/null)")"
  case "${exe}" in
    etcd | kube-apiserver | kube-controller-manager | kube-scheduler | kubelet | kube-proxy | containerd | containerd-shim-runc-v2)
      kpngc_ours "${pid}" && kill -9 "${pid}" 2>/dev/null ;;
  esac
done
sleep 0.2

# kubelet's links to the pods' logs, in a directory it does not let one
# configure (/var/log/containers), pointing into the cluster's.
find /var/log/containers -maxdepth 1 -lname "${KPNGC_DIR}/*" -delete 2>/dev/null

# The kernel settings kubelet changed, as they were before.
if [[ -f "${KPNGC_DIR}/sysctls.saved" ]]; then
  while IFS='=' read -r k v; do
    sysctl -qw "${k}=${v}" || kpngc_log "could not restore ${k}=${v}"
  done <"${KPNGC_DIR}/sysctls.saved"
fi

# Mounts: kubelet's volumes, containerd's root filesystems, shm and the pods'
# network namespaces (netns_mounts_under_state_dir), deepest first.
if [[ -d "${KPNGC_DIR}" ]]; then
  findmnt -rn -o TARGET | grep -F "${KPNGC_DIR}/" | sort -r | while read -r m; do
    umount -l "${m}" 2>/dev/null || kpngc_log "could not unmount ${m}"
  done
fi

for node in "${KPNGC_NODES[@]}"; do
  kill_cgroups "${node}"
  cgroups_of "${node}" | xargs -r rmdir 2>/dev/null
  left="$(cgroups_of "${node}")"
  [[ -z "${left}" ]] || kpngc_log "cgroups left: ${left}"
done

for ns in $(ip netns list | awk '{print $1}' | grep -E "^${KPNGC_PREFIX}-"); do
  ip netns del "${ns}"
done

rm -rf "${KPNGC_DIR}"
if ! left="$(bash "$(dirname "${BASH_SOURCE[0]}")/leftovers.sh")"; then
  kpngc_die "down: left behind: ${left}"
fi
kpngc_log "down: nothing of the cluster is left"
