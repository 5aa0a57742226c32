#!/usr/bin/env bash
# run.sh: Kubernetes' own network e2e tests (test/e2e/network of the pinned
# k8s.io/kubernetes, built by hack/build-controlplane.sh --with-e2e) through
# each PROXIER in turn, on one cluster (hack/cluster, two nodes, or
# KPNG_CLUSTER_NODES): make e2e.
#
# Usage: run.sh PROXIER...   (kpng-nft, kpng-iptables, kpng-userspace,
#                             kube-proxy-nftables, kube-proxy-iptables)
# Environment:
#   FOCUS      the tests to run, a regular expression (default: every
#              [sig-network] test); hack/e2e/skips.txt's are skipped always
#   E2E_SKIP   more tests to skip, a regular expression (the Makefile's SKIP)
#   E2E_PROCS  tests run at once (default 4; [Serial] ones run alone)
#   E2E_OUT    where each proxier's JUnit report, log and summary go
#              (default _output/e2e/PROXIER)
#   KPNG_E2E_KEEP=1  leave the cluster up afterwards (make cluster-down)
#
# It uses a cluster already up (made by make e2e with KPNG_E2E_KEEP=1),
# else brings one up with the tests' images and tears it down at the end.
# Each proxier is deployed as the cluster's only proxier on clean nodes
# (the previous one removed first), CoreDNS beside it. The tests run from
# the cluster's lan namespace, outside the nodes, as a test machine would.
# Prints a closing line per proxier; exits non-zero when a test failed.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "${here}/../cluster/lib.sh"

(($# > 0)) || kpngc_die "usage: run.sh PROXIER... (kpng-nft kpng-iptables kpng-userspace kube-proxy-nftables kube-proxy-iptables)"
for p in "$@"; do
  case "${p}" in
    kpng-nft | kpng-iptables | kpng-userspace | kube-proxy-nftables | kube-proxy-iptables) ;;
    *) kpngc_die "unknown proxier ${p} (kpng-nft kpng-iptables kpng-userspace kube-proxy-nftables kube-proxy-iptables)" ;;
  esac
done
focus="${FOCUS:-\[sig-network\]}"
procs="${E2E_PROCS:-4}"
out_root="${E2E_OUT:-${KPNGC_ROOT}/_output/e2e}"

KPNGC_BIN="$(bash "${KPNGC_ROOT}/hack/build-controlplane.sh" --with-e2e | tail -n 1)"

# The skip list: its expressions joined, for ginkgo's --skip.
skip="$(grep -v -e '^#' -e '^$' "${here}/skips.txt" | cut -f1 | paste -sd'|')${E2E_SKIP:+|${E2E_SKIP}}"

made=false
teardown() {
  local rc=$?
  if ${made} && [[ "${KPNG_E2E_KEEP:-}" != 1 ]]; then
    bash "${here}/../cluster/down.sh" || rc=1
  fi
  exit "${rc}"
}
if [[ ! -e "${KPNGC_DIR}" ]]; then
  made=true
  trap teardown EXIT
  KPNGC_E2E=1 bash "${here}/../cluster/up.sh"
fi
[[ -e "${KPNGC_DIR}/run/e2e-images" ]] ||
  kpngc_die "the cluster in ${KPNGC_DIR} was not made with the e2e tests' images: make cluster-down, then make e2e (KPNG_E2E_KEEP=1 keeps it)"
if ! ${made}; then
  # A cluster kept from an earlier run: its images made again from this
  # tree (kpng's own, after a change) and loaded.
  KPNGC_E2E=1 bash "${here}/../cluster/images.sh"
  for node in "${KPNGC_NODES[@]}"; do
    KPNGC_E2E=1 kpngc_import_images "${node}"
  done
fi

k() { kpngc_kubectl "$@"; }

# Zones, for the Topology Hints and Traffic Distribution tests: one per node.
for node in "${KPNGC_NODES[@]}"; do
  k label --overwrite node "${node}" "topology.kubernetes.io/zone=zone-${node#node-}" topology.kubernetes.io/region=region-1 >/dev/null
done

kpngc_coredns

# test_namespaces lists the namespaces a run of the tests left (an
# interrupted run leaves its own).
test_namespaces() {
  k get namespaces -o name | grep -v -E '^namespace/(default|kube-system|kube-public|kube-node-lease)$' || true
}

rc=0
for proxier in "$@"; do
  leftover="$(test_namespaces)"
  if [[ -n "${leftover}" ]]; then
    kpngc_log "e2e: removing the namespaces an earlier run left: ${leftover//$'\n'/ }"
    k delete --ignore-not-found --wait=true --timeout=300s ${leftover} >/dev/null ||
      kpngc_die "the namespaces an earlier run left did not go: ${leftover//$'\n'/ }"
  fi
  current="$(cat "${KPNGC_DIR}/run/proxier" 2>/dev/null || true)"
  [[ -z "${current}" ]] || bash "${here}/../cluster/proxier.sh" remove "${current}"
  bash "${here}/../cluster/proxier.sh" deploy "${proxier}"
  dir="${out_root}/${proxier}"
  rm -rf "${dir}"
  mkdir -p "${dir}"
  kpngc_log "e2e: ${proxier}: running (${procs} at once; log: ${dir}/e2e.log)"
  start=${SECONDS}
  set +e
  kpngc_in lan "${KPNGC_BIN}/ginkgo" --procs="${procs}" --focus="${focus}" --skip="${skip}" \
    --junit-report=junit.xml --json-report=report.json --output-dir="${dir}" --no-color --timeout=4h \
    "${KPNGC_BIN}/e2e-network.test" -- \
    --kubeconfig="${KPNGC_DIR}/pki/admin.kubeconfig" --kubectl-path="${KPNGC_BIN}/kubectl" \
    --provider=skeleton --num-nodes="${#KPNGC_NODES[@]}" >"${dir}/e2e.log" 2>&1
  test_rc=$?
  set -e
  echo "${proxier}" >"${dir}/proxier"
  summary="$(go run -C "${KPNGC_ROOT}" ./hack/cmd/kpng-e2e-report --summary "${dir}" 2>&1)" || true
  echo "e2e: ${proxier}: ${summary} (ginkgo exit ${test_rc}, $((SECONDS - start))s)"
  ((test_rc == 0)) || rc=1
done
exit "${rc}"
