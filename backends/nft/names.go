//go:build linux

package nft

import (
	"crypto/sha256"
	"encoding/base32"
	"strconv"
	"strings"

	"sigs.k8s.io/kpng/client/model"
)

// maxNameLen is the longest object name the kernel accepts
// (NFT_NAME_MAXLEN is 256 bytes including the final NUL).
const maxNameLen = 255

// hashLen is the number of base32 characters of the identity hash in a
// chain name: 8 characters, 40 bits.
const hashLen = 8

// TableName returns the name of the table of the proxier named
// serviceProxyName: "kpng-<serviceProxyName>", or "kpng" for an empty name
// (the proxier of the services without a service-proxy-name label).
func TableName(serviceProxyName string) string {
	if serviceProxyName == "" {
		return "kpng"
	}
	return "kpng-" + serviceProxyName
}

// familySuffix is "4" or "6".
func familySuffix(f Family) string { return f.info().suffix }

// protoName is the lower-case protocol name used in chain names and text.
func protoName(p model.Protocol) string { return strings.ToLower(p.String()) }

// portID is "<namespace>/<name>/<protocol>/<port>": the identity of a
// service port (a Service cannot have two ports with the same protocol and
// port number, and namespaces and names cannot contain "/").
func portID(svc model.ServiceKey, p *model.PortMapping) string {
	return svc.Namespace + "/" + svc.Name + "/" + protoName(p.Protocol) + "/" + strconv.Itoa(int(p.Port))
}

// chainName builds a deterministic, collision-free chain name:
// "<prefix>-<HASH>-<readable>", where HASH is the first 8 characters of the
// base32 SHA-256 of prefix and readable, and readable is the object's full
// identity. The readable part makes names unique by construction; it is
// only cut, from its end, when the name would exceed the kernel's limit, and
// the hash (computed before the cut) then keeps names apart.
func chainName(prefix, readable string) string {
	sum := sha256.Sum256([]byte(prefix + "\x00" + readable))
	h := base32.StdEncoding.EncodeToString(sum[:])[:hashLen]
	name := prefix + "-" + h + "-" + readable
	if len(name) > maxNameLen {
		name = name[:maxNameLen]
	}
	return name
}

// serviceChainName names the chain choosing among the endpoints of a
// service port for one family: "svc4-HASH-ns/name/tcp/80" for cluster IP
// traffic, "ext4-HASH-..." for external traffic when it uses other
// endpoints (externalTrafficPolicy: Local).
func serviceChainName(kind string, f Family, svc model.ServiceKey, p *model.PortMapping) string {
	return chainName(kind+familySuffix(f), portID(svc, p))
}

// endpointChainName names the chain DNATing a service port to one
// endpoint: "ep4-HASH-ns/name/tcp/80__10.1.2.3/8080".
func endpointChainName(f Family, svc model.ServiceKey, p *model.PortMapping, to string) string {
	return chainName("ep"+familySuffix(f), portID(svc, p)+"__"+to)
}

// balanceMapName names the verdict map choosing among the endpoint chains
// targets of a service port's chain of the given kind: "bal4-" and a hash
// (80 bits) of the chain's identity and of the targets, so that other
// targets make another map. The name is short on purpose: the kernel
// looks a table's sets up by name in a list, comparing whole names; the
// service chain that uses the map has the readable name.
func balanceMapName(f Family, kind string, svc model.ServiceKey, p *model.PortMapping, targets []string) string {
	sum := sha256.Sum256([]byte(kind + "/" + portID(svc, p) + "\x00" + strings.Join(targets, "\x00")))
	return "bal" + familySuffix(f) + "-" + base32.StdEncoding.EncodeToString(sum[:])[:16]
}
