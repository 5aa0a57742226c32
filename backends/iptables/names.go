package iptables

import (
	"crypto/sha256"
	"encoding/base32"
)

// MaxChainName is the longest chain name iptables accepts (its
// XT_EXTENSION_MAXNAMELEN, 29 bytes, less the terminating NUL).
const MaxChainName = 28

// The fixed chains of a proxier, each named ChainPrefix(name) + suffix.
// The same name may live in the nat and the filter table: they are two
// chains.
const (
	// chainServices (nat) sends service addresses to their chains; (filter)
	// rejects or drops the packets to services without usable endpoints
	// and to firewalled load-balancer IPs.
	chainServices = "SERVICES"
	// chainNodePorts (nat and filter) does the same for node ports, on
	// the node's addresses.
	chainNodePorts = "NODEPORTS"
	// chainPostrouting (nat) masquerades the packets carrying the mark bit.
	chainPostrouting = "POSTROUTING"
	// chainMarkMasq (nat) sets the mark bit.
	chainMarkMasq = "MARK-MASQ"
	// chainMasqNonPod (nat) sets the mark bit unless the source is in the
	// cluster CIDRs.
	chainMasqNonPod = "MASQ-NONPOD"
	// chainClusterIPs (filter) rejects new connections to a cluster IP
	// on a port no service defines: TCP reset, ICMP port unreachable.
	chainClusterIPs = "CLUSTER-IPS"
	// chainCanary (nat and filter) holds one rule and nothing refers to
	// it: when it is gone, someone flushed or replaced the table, and a
	// full sync follows.
	chainCanary = "CANARY"
	// chainForward (filter) sends the forwarded new connections to
	// SERVICES (reject, drop), then accepts the forwarded packets a node
	// whose FORWARD policy is DROP would drop: those marked for
	// masquerading (services' traffic from outside the cluster CIDRs)
	// and the replies and related packets of accepted connections (as
	// kube-proxy's KUBE-FORWARD).
	chainForward = "FORWARD"
)

// The kinds of a service's chains (3 letters each, as in kube-proxy).
const (
	// kindCluster DNATs to the endpoints of the Cluster policy.
	kindCluster = "SVC"
	// kindLocal DNATs to the endpoints of the Local policy.
	kindLocal = "SVL"
	// kindExternal handles external IPs, load-balancer IPs and node ports.
	kindExternal = "EXT"
	// kindFirewall lets the sources of loadBalancerSourceRanges through.
	kindFirewall = "FWL"
	// kindAffinity names the recent list (not a chain) of one endpoint
	// of a service port with session affinity.
	kindAffinity = "AFF"
)

// encoding is base32 without padding; its letters and digits are valid in
// chain names.
var encoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// hash returns the first n characters of the base32 SHA-256 of s.
func hash(s string, n int) string {
	sum := sha256.Sum256([]byte(s))
	return encoding.EncodeToString(sum[:])[:n]
}

// ChainPrefix returns the prefix of every chain of the proxier of the
// given service-proxy-name: "KPNG-" and 6 characters of the hash of the
// name, then "-" ("KPNG-ABCDEF-"). The name itself does not fit (names
// may be 63 characters long, chains 28), so several proxiers and
// kube-proxy (KUBE-…) never share a chain.
func ChainPrefix(serviceProxyName string) string {
	return "KPNG-" + hash(serviceProxyName, 6) + "-"
}

// serviceChain returns the name of a chain of the given kind whose
// identity (family, service port, endpoint…) is id: the prefix, the kind,
// "-" and as much of the hash of id as fits in MaxChainName (12
// characters: 60 bits), as kube-proxy names its KUBE-SVC- chains.
func serviceChain(prefix, kind, id string) string {
	head := prefix + kind + "-"
	return head + hash(id, MaxChainName-len(head))
}
