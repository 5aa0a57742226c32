#!/usr/bin/env bash
# proxier.sh deploy NAME | remove NAME: the cluster's proxier.
#
#   kpng-nft, kpng-iptables,  kpng as the cluster's only proxier: the
#   kpng-userspace            DaemonSet deploy/kpng-default-<backend>.yaml,
#                             applied as a user would, only its image name
#                             replaced by the one built here; no kube-proxy.
#   kube-proxy-nftables,      kube-proxy v1.36.3 (built from the module
#   kube-proxy-iptables       proxy) as the only proxier, a process on each
#                             node, in that mode (no image of kube-proxy can
#                             be pulled here).
#   seeds                     the seeds' own mode: kube-proxy (nftables) as
#                             the default proxier, and beside it kpng for the
#                             Services labelled with its service-proxy-name:
#                             deploy/kpng-nft.yaml (kpng-nft) and the blog's
#                             all-IP proxier (examples/manifests, kpng-example).
#   controller                on top of the seeds' mode (deployed first):
#                             kpng's controller and its node backends as an
#                             operator deploys them (docs/controller.md,
#                             "Deploying a controller"): CoreDNS as the
#                             cluster's DNS (served by kube-proxy), the
#                             certificates of deploy/kpng-controller-certs.sh,
#                             the Secret, deploy/kpng-controller.yaml and
#                             deploy/kpng-nft-node.yaml (kpng-remote), only
#                             the images replaced, and the node certificates'
#                             directory (below).
#
# remove undoes deploy, and removes the proxier's rules from each node as
# its operator would (kpng ... --cleanup, kube-proxy --cleanup), so that the
# next proxier is the only one programming the nodes.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

kpngc_binaries

# local_images FILE prints a manifest of the repository with the images
# built here in place of registry.example's.
local_images() {
  sed -e "s|registry.example/kpng:latest|${KPNGC_KPNG_IMAGE}|g" \
    -e "s|registry.example/kpng-nft:latest|${KPNGC_KPNG_NFT_IMAGE}|g" \
    -e "s|registry.example/kpng-iptables:latest|${KPNGC_KPNG_IPTABLES_IMAGE}|g" "${KPNGC_ROOT}/$1"
}

# apply FILE applies a manifest of the repository with the local images.
apply() {
  local_images "$1" | kpngc_kubectl apply -f - >/dev/null
}

# delete FILE deletes what apply made, and waits until its pods are gone
# (foreground: the DaemonSet goes after its pods), so that no pod of it can
# put its rules back after the cleanup.
delete() {
  local_images "$1" | kpngc_kubectl delete --ignore-not-found --cascade=foreground --wait=true --timeout=180s -f - >/dev/null
}

# no_pods LABEL fails while a pod of the DaemonSet named LABEL exists.
no_pods() {
  [[ -z "$(kpngc_kubectl -n kube-system get pods -l "app.kubernetes.io/name=$1" -o name)" ]]
}

# clean_nodes fails, naming what it found, if a node still holds a
# proxier's rules: kpng's nftables tables, its iptables chains, kube-proxy's;
# or kpng's userspace proxier's interface (kpng-…, holding the service
# addresses) or its blackhole routes of the service CIDRs (proto 107).
clean_nodes() {
  local node found
  for node in "${KPNGC_NODES[@]}"; do
    found="$(kpngc_in "${node}" nft list tables | grep -E 'kpng|kube-proxy' || true)"
    found+="$(for save in iptables-save iptables-legacy-save; do kpngc_in "${node}" "${save}" 2>/dev/null; done |
      grep -E '^:(KPNG|KUBE-(SERVICES|NODEPORTS|SVC))' || true)"
    found+="$(kpngc_in "${node}" ip -o link show | grep -oE '^[0-9]+: kpng-[^:@]*' || true)"
    found+="$(for family in -4 -6; do kpngc_in "${node}" ip "${family}" route show proto 107; done || true)"
    [[ -z "${found}" ]] || kpngc_die "${node} still holds a proxier's rules: ${found//$'\n'/ }"
  done
}

# rollout NAME waits until the DaemonSet kube-system/NAME runs a ready pod
# on every node.
rollout() {
  kpngc_kubectl -n kube-system rollout status "daemonset/$1" --timeout=180s >/dev/null ||
    kpngc_die "DaemonSet $1 did not become ready: $(kpngc_kubectl -n kube-system get pods -o wide 2>&1 | tail -n +1)"
}

# apiserver_configmap tells the default-proxier DaemonSets where the API
# server is (see the top of deploy/kpng-default-nft.yaml).
apiserver_configmap() {
  kpngc_kubectl -n kube-system create configmap kpng-apiserver \
    --from-literal=KUBERNETES_SERVICE_HOST="${KPNGC_LAN_IP}" \
    --from-literal=KUBERNETES_SERVICE_PORT="${KPNGC_API_PORT}" \
    --dry-run=client -o yaml | kpngc_kubectl apply -f - >/dev/null
}

# kube_proxy MODE starts kube-proxy in MODE on each node, with its
# defaults but one: the conntrack table's size (nf_conntrack_max) is the
# machine's, not a node's, and is left alone. Its TCP timeouts
# (established 24 h, close-wait 1 h) are per network namespace: set, as a
# user's kube-proxy sets them (Kubernetes' e2e tests check close-wait).
kube_proxy() {
  local node
  for node in "${KPNGC_NODES[@]}"; do
    # What kube-proxy changes stays after it stops: saved, for
    # stop_kube_proxy to put back, so that the next proxier starts from
    # the node's own values.
    # (Without the conntrack module loaded there is nothing to save.)
    kpngc_in "${node}" sysctl net.netfilter.nf_conntrack_tcp_timeout_established \
      net.netfilter.nf_conntrack_tcp_timeout_close_wait 2>/dev/null | tr -d ' ' >"${KPNGC_DIR}/run/conntrack-${node}.saved" ||
      rm -f "${KPNGC_DIR}/run/conntrack-${node}.saved"
    kpngc_start "proxier-kube-proxy-${node}" "${node}" "${KPNGC_BIN}/kube-proxy" \
      --kubeconfig="${KPNGC_DIR}/pki/kube-proxy.kubeconfig" --hostname-override="${node}" \
      --proxy-mode="$1" --cluster-cidr="${KPNGC_CLUSTER_CIDR}" \
      --conntrack-max-per-core=0
  done
  for node in "${KPNGC_NODES[@]}"; do
    kpngc_wait "kube-proxy on ${node}" 60 kpngc_in "${node}" curl -sf "http://127.0.0.1:10256/healthz"
  done
}

# stop_kube_proxy stops kube-proxy on each node, waits for it to exit, and
# removes its rules.
stop_kube_proxy() {
  local node
  for node in "${KPNGC_NODES[@]}"; do
    kpngc_stop "proxier-kube-proxy-${node}"
    kpngc_in "${node}" "${KPNGC_BIN}/kube-proxy" --cleanup >/dev/null 2>&1 ||
      kpngc_die "kube-proxy --cleanup on ${node} failed"
    if [[ -s "${KPNGC_DIR}/run/conntrack-${node}.saved" ]]; then
      xargs -r -a "${KPNGC_DIR}/run/conntrack-${node}.saved" nsenter --net="/run/netns/$(kpngc_netns "${node}")" -- sysctl -qw ||
        kpngc_die "putting back ${node}'s conntrack timeouts failed"
      rm -f "${KPNGC_DIR}/run/conntrack-${node}.saved"
    fi
  done
}

# kpng_cleanup BACKEND [NAME] removes kpng's rules of BACKEND (nft,
# iptables; userspace: its interface and addresses, and the default
# proxier's blackhole routes) from each node, with the kpng binary of the
# image.
kpng_cleanup() {
  local node name=()
  [[ -z "${2:-}" ]] || name=("--name=$2")
  for node in "${KPNGC_NODES[@]}"; do
    kpngc_in "${node}" "${KPNGC_CACHE}/images/bin/kpng" file --input=/dev/null \
      to-local "to-$1" "${name[@]}" --cleanup >/dev/null 2>&1 ||
      kpngc_die "kpng to-$1 --cleanup on ${node} failed"
  done
}

# The controller's certificates, as its operator keeps them
# (deploy/kpng-controller-certs.sh's directory: the CA, the controller's,
# each node's), and what is on each node as /etc/kpng/pki: here in
# ${KPNGC_NODE_PKI}/<node>, as the nodes share one filesystem.
KPNGC_CONTROLLER_PKI="${KPNGC_DIR}/kpng-controller-pki"
KPNGC_NODE_PKI="${KPNGC_DIR}/kpng-node-pki"

# node_backends prints deploy/kpng-nft-node.yaml with the local image and
# one change for this one-machine cluster: the nodes share one filesystem,
# so the hostPath /etc/kpng/pki would be the same directory on every node,
# holding one node's certificate. It mounts ${KPNGC_NODE_PKI} instead, and
# the container its node's subdirectory of it (subPathExpr: $(NODE_NAME),
# the downward API's node name the DaemonSet already sets).
node_backends() {
  local m
  m="$(local_images deploy/kpng-nft-node.yaml | sed -e "s|^\( *\)path: /etc/kpng/pki$|\1path: ${KPNGC_NODE_PKI}|" \
    -e 's|^\( *\)mountPath: /etc/kpng/pki$|&\n\1subPathExpr: $(NODE_NAME)|')"
  [[ "$(grep -c -e "path: ${KPNGC_NODE_PKI}$" -e 'subPathExpr: $(NODE_NAME)$' <<<"${m}")" == 2 ]] ||
    kpngc_die "deploy/kpng-nft-node.yaml: no hostPath and mount of /etc/kpng/pki to rewrite"
  echo "${m}"
}

# no_table NAME fails if a node holds an nftables table NAME of kpng's:
# table ip or ip6 NAME, or the table inet NAME of a kpng before the
# table per family.
no_table() {
  local node found
  for node in "${KPNGC_NODES[@]}"; do
    found="$(kpngc_in "${node}" nft list tables | grep -xE "table (ip|ip6|inet) $1" || true)"
    [[ -z "${found}" ]] || { kpngc_log "${node} still holds ${found//$'\n'/, }"; return 1; }
  done
}

# controller_deploy deploys the controller and its node backends (the
# header's "controller"), each step as docs/controller.md tells an
# operator, and waits until both replicas and every node's backend are
# ready.
controller_deploy() {
  local node
  [[ "$(cat "${KPNGC_DIR}/run/proxier" 2>/dev/null)" == seeds ]] ||
    kpngc_die "deploy controller: deploy seeds first (kube-proxy serves the cluster DNS the node backends find the controller through)"
  no_table kpng-kpng-remote || kpngc_die "deploy controller: a node holds a table of kpng-remote already"
  kpngc_coredns
  bash "${KPNGC_ROOT}/deploy/kpng-controller-certs.sh" "${KPNGC_CONTROLLER_PKI}" "${KPNGC_NODES[@]}" >/dev/null 2>&1 ||
    kpngc_die "deploy/kpng-controller-certs.sh failed"
  for node in "${KPNGC_NODES[@]}"; do
    install -d -m 0700 "${KPNGC_NODE_PKI}/${node}"
    install -m 0600 "${KPNGC_CONTROLLER_PKI}/${node}/"{ca.crt,node.crt,node.key} "${KPNGC_NODE_PKI}/${node}/"
  done
  kpngc_kubectl -n kube-system create secret generic kpng-controller-tls \
    --from-file="${KPNGC_CONTROLLER_PKI}/tls.crt" --from-file="${KPNGC_CONTROLLER_PKI}/tls.key" \
    --from-file="${KPNGC_CONTROLLER_PKI}/client-ca.crt" --dry-run=client -o yaml | kpngc_kubectl apply -f - >/dev/null
  apply deploy/kpng-controller.yaml
  # Both replicas ready before the backends start: a backend resolves the
  # Service's name when it starts, and again only when a connection fails.
  kpngc_kubectl -n kube-system rollout status deployment/kpng-controller --timeout=180s >/dev/null ||
    kpngc_die "the controller did not become ready: $(kpngc_kubectl -n kube-system get pods -o wide 2>&1)"
  node_backends | kpngc_kubectl apply -f - >/dev/null
  rollout kpng-nft-node
  touch "${KPNGC_DIR}/run/controller"
}

# controller_remove undoes controller_deploy: the node backends, their
# table on each node (kpng … to-nft --name=kpng-remote --cleanup), the
# controller and its Secret, CoreDNS and the certificates.
controller_remove() {
  node_backends | kpngc_kubectl delete --ignore-not-found --cascade=foreground --wait=true --timeout=180s -f - >/dev/null
  kpngc_wait "the pods of kpng-nft-node to go" 120 no_pods kpng-nft-node
  kpng_cleanup nft kpng-remote
  no_table kpng-kpng-remote || kpngc_die "a table of kpng-remote is left after its cleanup"
  delete deploy/kpng-controller.yaml
  kpngc_kubectl -n kube-system delete secret kpng-controller-tls --ignore-not-found >/dev/null
  kpngc_coredns_manifest | kpngc_kubectl delete --ignore-not-found --wait=true --timeout=180s -f - >/dev/null
  rm -rf "${KPNGC_CONTROLLER_PKI}" "${KPNGC_NODE_PKI}" "${KPNGC_DIR}/run/controller"
}

action="${1:-}" name="${2:-}"
# A proxier is deployed on clean nodes only: its checks then cannot pass
# through another's leftover rules. (The controller is deployed beside the
# seeds' mode.)
[[ "${action}" != deploy || "${name}" == controller ]] || clean_nodes
case "${action}:${name}" in
  deploy:kpng-nft | deploy:kpng-iptables | deploy:kpng-userspace)
    apiserver_configmap
    apply "deploy/kpng-default-${name#kpng-}.yaml"
    rollout "kpng-default-${name#kpng-}"
    ;;
  remove:kpng-nft | remove:kpng-iptables | remove:kpng-userspace)
    delete "deploy/kpng-default-${name#kpng-}.yaml"
    kpngc_wait "the pods of kpng-default-${name#kpng-} to go" 120 no_pods "kpng-default-${name#kpng-}"
    kpng_cleanup "${name#kpng-}"
    clean_nodes
    ;;
  deploy:kube-proxy-nftables | deploy:kube-proxy-iptables)
    kube_proxy "${name#kube-proxy-}"
    ;;
  remove:kube-proxy-nftables | remove:kube-proxy-iptables)
    stop_kube_proxy
    clean_nodes
    ;;
  deploy:seeds)
    kube_proxy nftables
    apply deploy/kpng-nft.yaml
    apply examples/manifests/kpng-example-proxy.yaml
    rollout kpng-nft
    rollout kpng-example-proxy
    ;;
  deploy:controller)
    controller_deploy
    ;;
  remove:controller)
    controller_remove
    ;;
  remove:seeds)
    # The controller's backends find it through the DNS kube-proxy serves.
    [[ ! -e "${KPNGC_DIR}/run/controller" ]] || controller_remove
    delete examples/manifests/kpng-example-proxy.yaml
    delete deploy/kpng-nft.yaml
    kpngc_wait "the pods of kpng-nft to go" 120 no_pods kpng-nft
    kpng_cleanup nft kpng-nft
    # The all-IP callout removes its chains when given an empty state.
    for node in "${KPNGC_NODES[@]}"; do
      echo '[]' | kpngc_in "${node}" "${KPNGC_ROOT}/examples/allip/kpng-example-allip" >/dev/null ||
        kpngc_die "kpng-example-allip with an empty state on ${node} failed"
    done
    stop_kube_proxy
    clean_nodes
    ;;
  *)
    kpngc_die "usage: proxier.sh deploy|remove kpng-nft|kpng-iptables|kpng-userspace|kube-proxy-nftables|kube-proxy-iptables|seeds|controller"
    ;;
esac
if [[ "${name}" != controller ]]; then
  echo "${name}" >"${KPNGC_DIR}/run/proxier"
  [[ "${action}" == deploy ]] || rm -f "${KPNGC_DIR}/run/proxier"
fi
kpngc_log "${action} ${name}: done"
