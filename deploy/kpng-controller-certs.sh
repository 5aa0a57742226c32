#!/bin/sh
# kpng-controller-certs.sh makes, with openssl, the TLS material of
# kpng-controller.yaml and kpng-nft-node.yaml (docs/controller.md,
# "Deploying a controller"):
#
#   deploy/kpng-controller-certs.sh DIR NODE...
#
#   DIR/ca.crt, ca.key        a CA of kpng's own (made once, kept: keep ca.key
#                             off the cluster)
#   DIR/tls.crt, tls.key      the controller's server certificate, for
#                             kpng-controller.kube-system.svc (and
#                             .svc.cluster.local); client-ca.crt, the CA
#                             it checks the nodes' certificates with: the
#                             Secret kpng-controller-tls
#   DIR/NODE/node.crt, node.key, ca.crt
#                             each node's client certificate
#                             (CN=system:node:NODE, O=system:nodes, as
#                             kubelet's): its /etc/kpng/pki
#
# $KPNG_CONTROLLER_NAMES (space-separated) replaces the server certificate's
# DNS names; $KPNG_CERT_DAYS its validity (365).
set -eu
[ $# -ge 1 ] || { echo "usage: $0 DIR [NODE...]" >&2; exit 2; }
dir=$1
shift
days=${KPNG_CERT_DAYS:-365}
names=${KPNG_CONTROLLER_NAMES:-kpng-controller.kube-system.svc kpng-controller.kube-system.svc.cluster.local}
umask 077
mkdir -p "$dir"
cd "$dir"

# key FILE: a new P-256 key.
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1"; }

# sign SUBJECT KEY CERT EXTENSIONS: a certificate of KEY signed by the CA.
sign() {
	printf '%b\n' "$4" >ext.tmp
	openssl req -new -key "$2" -subj "$1" -out csr.tmp
	openssl x509 -req -in csr.tmp -CA ca.crt -CAkey ca.key -CAcreateserial \
		-days "$days" -extfile ext.tmp -out "$3" 2>/dev/null
	rm -f ext.tmp csr.tmp
}

if [ ! -f ca.key ]; then
	key ca.key
	openssl req -x509 -new -key ca.key -subj "/CN=kpng-controller-ca" -days 3650 -out ca.crt
fi

san=
for n in $names; do san="${san:+$san,}DNS:$n"; done
key tls.key
sign "/CN=kpng-controller" tls.key tls.crt \
	"basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=$san"
cp ca.crt client-ca.crt

for node in "$@"; do
	mkdir -p "$node"
	key "$node/node.key"
	sign "/O=system:nodes/CN=system:node:$node" "$node/node.key" "$node/node.crt" \
		"basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth"
	cp ca.crt "$node/ca.crt"
done
rm -f ca.srl
chmod 0644 ca.crt client-ca.crt tls.crt
