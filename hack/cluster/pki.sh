# pki.sh: the cluster's certificates and kubeconfigs, made with openssl.
# Sourced by up.sh after lib.sh.

# kpngc_cert NAME SUBJECT [SANS] writes pki/NAME.{key,crt}, signed by the
# cluster's CA, for client and server use; SANS is an openssl
# subjectAltName list (DNS:…,IP:…).
kpngc_cert() {
  local name="$1" subject="$2" sans="${3:-}"
  local d="${KPNGC_DIR}/pki"
  local ext="${d}/${name}.ext"
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=serverAuth,clientAuth"
    [[ -z "${sans}" ]] || echo "subjectAltName=${sans}"
  } >"${ext}"
  openssl req -new -newkey rsa:2048 -nodes -keyout "${d}/${name}.key" -subj "${subject}" -out "${d}/${name}.csr" 2>/dev/null
  openssl x509 -req -in "${d}/${name}.csr" -CA "${d}/ca.crt" -CAkey "${d}/ca.key" -CAcreateserial \
    -days 30 -extfile "${ext}" -out "${d}/${name}.crt" 2>/dev/null
  rm -f "${d}/${name}.csr" "${ext}"
}

# kpngc_kubeconfig NAME writes pki/NAME.kubeconfig: the API server, with the
# client certificate pki/NAME.crt.
kpngc_kubeconfig() {
  local name="$1" d="${KPNGC_DIR}/pki"
  cat >"${d}/${name}.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kpngc
  cluster:
    server: ${KPNGC_SERVER}
    certificate-authority: ${d}/ca.crt
users:
- name: ${name}
  user:
    client-certificate: ${d}/${name}.crt
    client-key: ${d}/${name}.key
contexts:
- name: kpngc
  context: {cluster: kpngc, user: ${name}}
current-context: kpngc
EOF
}

# kpngc_pki makes the CA, the API server's serving certificate, the
# service-account signing key and a client certificate and kubeconfig for
# each component: admin (system:masters), each kubelet (system:node:NAME in
# system:nodes, as the Node authorizer wants), the controller-manager, the
# scheduler, kube-proxy, and the API server's client to the kubelets.
kpngc_pki() {
  local d="${KPNGC_DIR}/pki"
  mkdir -p "${d}"
  chmod 0700 "${d}"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "${d}/ca.key" -out "${d}/ca.crt" \
    -days 30 -subj "/CN=kpng-cluster-ca" 2>/dev/null
  openssl genrsa -out "${d}/sa.key" 2048 2>/dev/null
  openssl rsa -in "${d}/sa.key" -pubout -out "${d}/sa.pub" 2>/dev/null
  kpngc_cert apiserver "/CN=kube-apiserver" \
    "IP:${KPNGC_LAN_IP},IP:${KPNGC_KUBERNETES_IP},IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  kpngc_cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
  kpngc_cert admin "/O=system:masters/CN=kpng-cluster-admin"
  kpngc_cert controller-manager "/CN=system:kube-controller-manager"
  kpngc_cert scheduler "/CN=system:kube-scheduler"
  kpngc_cert kube-proxy "/CN=system:kube-proxy"
  local node
  for node in "${KPNGC_NODES[@]}"; do
    kpngc_cert "kubelet-${node}" "/O=system:nodes/CN=system:node:${node}" "IP:${KPNGC_NODE_IP[${node}]},DNS:${node}"
    kpngc_kubeconfig "kubelet-${node}"
  done
  local c
  for c in admin controller-manager scheduler kube-proxy; do
    kpngc_kubeconfig "${c}"
  done
}
