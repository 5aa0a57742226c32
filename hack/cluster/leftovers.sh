#!/usr/bin/env bash
# leftovers.sh prints what of the cluster is still on the machine and fails
# if anything is: processes whose command lines name its directory (the
# control plane, containerd, kubelet, the shims; the containers' processes
# are in its cgroups), mounts under its directory, its network namespaces,
# its cgroups, its directory, the CNI plugins' results of its network,
# kubelet's links to its pods' logs.
# down.sh must leave none.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

left=()
procs="$(pgrep -af -- "${KPNGC_DIR}/" | grep -v -e leftovers.sh || true)"
[[ -z "${procs}" ]] || left+=("processes: ${procs//$'\n'/; }")
mounts="$(findmnt -rn -o TARGET | grep -F "${KPNGC_DIR}" || true)"
[[ -z "${mounts}" ]] || left+=("mounts: ${mounts//$'\n'/ }")
netns="$(ip netns list | awk '{print $1}' | grep -E "^${KPNGC_PREFIX}-" || true)"
[[ -z "${netns}" ]] || left+=("network namespaces: ${netns//$'\n'/ }")
cgroups="$(ls -d /sys/fs/cgroup/*/"${KPNGC_PREFIX}"-* 2>/dev/null || true)"
[[ -z "${cgroups}" ]] || left+=("cgroups: ${cgroups//$'\n'/ }")
[[ ! -e "${KPNGC_DIR}" ]] || left+=("directory: ${KPNGC_DIR}")
cni="$(ls /var/lib/cni/results/kpngc-* 2>/dev/null || true)"
[[ -z "${cni}" ]] || left+=("CNI results: ${cni//$'\n'/ }")
links="$(find /var/log/containers -maxdepth 1 -lname "${KPNGC_DIR}/*" 2>/dev/null || true)"
[[ -z "${links}" ]] || left+=("kubelet's log links: ${links//$'\n'/ }")
if ((${#left[@]} > 0)); then
  printf '%s\n' "${left[@]}"
  exit 1
fi
