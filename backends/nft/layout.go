package nft

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"sigs.k8s.io/kpng/model"
)

// This file holds every name of the table's objects and its fixed layout:
// the base chains with their hooks and priorities, the kinds of verdict
// maps, and how the names of per-service chains and sets are made
// (docs/backends/nft.md has the same in prose).

// The names of the fixed objects of the table.
const (
	// chainNATPrerouting and chainNATOutput are the NAT base chains
	// (priority dstnat) of incoming and locally generated traffic.
	chainNATPrerouting = "nat-prerouting"
	chainNATOutput     = "nat-output"
	// chainServices looks up the shards' sets (or jumps to the shards
	// chains for a cluster IP: shards.go), then the service maps; both NAT
	// base chains jump to it.
	chainServices = "services"
	// chainFilterInput, chainFilterForward and chainFilterOutput are the
	// filter base chains (priority filter - 10) where traffic to services
	// without usable endpoints is rejected or dropped.
	chainFilterInput   = "filter-input"
	chainFilterForward = "filter-forward"
	chainFilterOutput  = "filter-output"
	// chainNoEndpoints looks up the no-endpoint maps of service
	// addresses; the filter base chains jump to it.
	chainNoEndpoints = "no-endpoint-services"
	// chainNoEndpointNodePorts looks up the no-endpoint maps of node
	// ports; only filter-input jumps to it (as kube-proxy's
	// nodeport-endpoints-check): a packet to a node port that was not
	// DNATed reaches the node's input hook, whether it came in or the
	// node sent it, and forward never sees a local destination. The
	// lookup is on (protocol . port) alone; its elements go to the chains
	// nodeport-reject-vX or nodeport-drop-vX (chainNodePortReject), which
	// check the destination address. So a new connection costs a route
	// lookup (fib) only when its port is a node port without endpoints.
	chainNoEndpointNodePorts = "nodeport-endpoints-check"
	// chainReject rejects: TCP reset for TCP, ICMP(v6) port unreachable
	// otherwise. Not "reject", a keyword of nft's syntax: a listing
	// naming a chain so cannot be loaded back (nft -f).
	chainReject = "reject-chain"
	// chainClusterIPsCheck rejects the new connections to a cluster IP
	// that no service port took (not DNATed: a port no service defines),
	// and drops those to the other addresses of the service CIDRs (the
	// default proxier's); filter-forward and filter-output jump to it for
	// new connections, as kube-proxy's cluster-ips-check. Cluster IPs are
	// virtual: their traffic must never leave the node.
	chainClusterIPsCheck = "cluster-ips-check"
)

// chainNodePortReject returns the name of the chain the reject elements
// of a family's no-endpoint-nodeports map go to, "nodeport-reject-v4":
// it rejects (goto reject-chain) a packet whose destination is a
// node-port address (a local one, loopback excluded, or one inside
// NodePortAddresses: nodePortMatches); other packets go on.
func chainNodePortReject(f ipFamily) string { return "nodeport-reject-v" + familySuffix(f) }

// chainNodePortDrop returns the name of the chain the drop elements of a
// family's no-endpoint-nodeports map go to (Local policy, no local
// endpoint), "nodeport-drop-v4": as chainNodePortReject, but it drops.
func chainNodePortDrop(f ipFamily) string { return "nodeport-drop-v" + familySuffix(f) }

// nodePortCheck is one of a family's chains that a no-endpoint-nodeports
// element goes to: its name, and whether it drops (else it rejects).
type nodePortCheck struct {
	name string
	drop bool
}

// nodePortChecks returns a family's nodeport-reject and nodeport-drop
// chains, in the table's order: the one list Text and the applier write.
func nodePortChecks(f ipFamily) []nodePortCheck {
	return []nodePortCheck{{chainNodePortReject(f), false}, {chainNodePortDrop(f), true}}
}

// mapServices returns the name of the verdict map of a family that sends
// (daddr . l4proto . dport) to the chain of a service port (a plain one's
// key is in its shard's set instead: shards.go):
// "service-ips-v4" or "service-ips-v6".
func mapServices(f ipFamily) string { return "service-ips-v" + familySuffix(f) }

// mapNoEndpoints returns the name of the verdict map of a family that
// rejects or drops (daddr . l4proto . dport) of service ports without
// usable endpoints: "no-endpoint-services-v4" or "...-v6".
func mapNoEndpoints(f ipFamily) string { return "no-endpoint-services-v" + familySuffix(f) }

// mapNodePorts returns the name of the verdict map of a family that sends
// (l4proto . dport) of packets to a local address to the chain of a
// service's node port: "service-nodeports-v4" or "...-v6".
func mapNodePorts(f ipFamily) string { return "service-nodeports-v" + familySuffix(f) }

// mapNoEndpointNodePorts returns the name of the verdict map of a family
// that rejects or drops (l4proto . dport) of node ports without usable
// endpoints: "no-endpoint-nodeports-v4" or "...-v6".
func mapNoEndpointNodePorts(f ipFamily) string { return "no-endpoint-nodeports-v" + familySuffix(f) }

// mapFirewall returns the name of the verdict map of a family that sends
// (daddr . l4proto . dport) of load-balancer IPs with
// loadBalancerSourceRanges to the chain enforcing them, before DNAT:
// "firewall-ips-v4" or "firewall-ips-v6".
func mapFirewall(f ipFamily) string { return "firewall-ips-v" + familySuffix(f) }

// isNodePortMap reports whether the map m is keyed by protocol and port
// only (no address).
func isNodePortMap(m string) bool {
	return strings.HasPrefix(m, "service-nodeports-") || strings.HasPrefix(m, "no-endpoint-nodeports-")
}

// endpointMapName returns the name of the shard-th endpoint map of a family:
// "endpoints-v4-0", "endpoints-v4-1", … Blocks blocksPerMap·shard to
// blocksPerMap·(shard+1) - 1 of the family are in it.
func endpointMapName(f ipFamily, shard uint32) string {
	return fmt.Sprintf("endpoints-v%s-%d", familySuffix(f), shard)
}

// mapHairpin returns the name of the set of a family holding (endpoint .
// endpoint) for every endpoint address: a DNATed packet whose source is
// its destination is a pod reaching itself through a service, and is
// masqueraded. "hairpin-v4" or "hairpin-v6".
func mapHairpin(f ipFamily) string { return "hairpin-v" + familySuffix(f) }

// setClusterIPs returns the name of the set of a family holding every
// cluster IP of the services held: "cluster-ips-v4" or "cluster-ips-v6".
func setClusterIPs(f ipFamily) string { return "cluster-ips-v" + familySuffix(f) }

// baseChain describes one of the fixed base chains of the table: the
// chains it jumps to, in order.
type baseChain struct {
	name     string
	typ      string // "nat" or "filter"
	hook     string
	priority int32
	jumps    []baseJump
}

// baseJump is a base chain's jump to chain: for every packet, or for the
// first packets of connections only (newOnly: "ct state new jump", as
// kube-proxy's filter chains, so that the packets of established
// connections cross no lookup of the table; the NAT hooks only see those
// first packets anyway).
type baseJump struct {
	chain   string
	newOnly bool
}

// every and newOnly make a base chain's jump.
func every(chain string) baseJump   { return baseJump{chain: chain} }
func newOnly(chain string) baseJump { return baseJump{chain: chain, newOnly: true} }

// Priorities of the base chains: dstnat - 10 for the load-balancer
// firewall (before DNAT), dstnat (-100) for DNAT, filter - 10 for the
// reject/drop chains (as kube-proxy: before the usual filter chains) and
// srcnat (100) for masquerading.
const (
	priorityFirewall int32 = -110
	priorityDstNAT   int32 = -100
	priorityFilter   int32 = -10
	prioritySrcNAT   int32 = 100
)

// standardPriorities are nft's names of priorities, in the order nft
// tries them, with the one hook a NAT name is written on (empty: any).
var standardPriorities = []struct {
	name  string
	value int32
	hook  string
}{
	{"raw", -300, ""},
	{"mangle", -150, ""},
	{"dstnat", -100, "prerouting"},
	{"filter", 0, ""},
	{"security", 50, ""},
	{"srcnat", 100, "postrouting"},
}

// priorityText writes the priority p of a base chain on hook as nft
// (1.0.6) lists it: the first standard name usable on the hook within 10
// of p ("dstnat", "filter - 10"), else the number (dstnat on the output
// hook is "-100": nft writes dstnat only on prerouting). The kernel test
// TestKernelListingMatchesText checks it for every base chain.
func priorityText(p int32, hook string) string {
	for _, sp := range standardPriorities {
		if sp.hook != "" && sp.hook != hook {
			continue
		}
		switch off := p - sp.value; {
		case off == 0:
			return sp.name
		case off > 0 && off <= 10:
			return fmt.Sprintf("%s + %d", sp.name, off)
		case off < 0 && off >= -10:
			return fmt.Sprintf("%s - %d", sp.name, -off)
		}
	}
	return strconv.Itoa(int(p))
}

// baseChains are the table's base chains, in the order they are created.
var baseChains = []baseChain{
	{chainFilterPrerouting, "filter", "prerouting", priorityFirewall, []baseJump{newOnly(chainFirewallCheck)}},
	{chainFilterOutputPreDNAT, "filter", "output", priorityFirewall, []baseJump{newOnly(chainFirewallCheck)}},
	{chainNATPrerouting, "nat", "prerouting", priorityDstNAT, []baseJump{every(chainServices)}},
	{chainNATOutput, "nat", "output", priorityDstNAT, []baseJump{every(chainServices)}},
	{chainFilterInput, "filter", "input", priorityFilter, []baseJump{newOnly(chainNoEndpoints), newOnly(chainNoEndpointNodePorts)}},
	{chainFilterForward, "filter", "forward", priorityFilter, []baseJump{newOnly(chainNoEndpoints), newOnly(chainClusterIPsCheck)}},
	{chainFilterOutput, "filter", "output", priorityFilter, []baseJump{newOnly(chainNoEndpoints), newOnly(chainClusterIPsCheck)}},
	{chainNATPostrouting, "nat", "postrouting", prioritySrcNAT, []baseJump{every(chainMasquerading)}},
}

// mapKind describes one kind of verdict map: one map per family.
type mapKind struct {
	name     func(ipFamily) string
	nodePort bool // keyed by protocol . port only
	// checkedAfter: the node-port address match is in the chains the
	// elements go to (chainNodePortReject), not in the lookup rule.
	checkedAfter bool
}

// mapKinds are the kinds of verdict maps of the table.
var mapKinds = []mapKind{
	{mapServices, false, false},
	{mapNoEndpoints, false, false},
	{mapNodePorts, true, false},
	{mapNoEndpointNodePorts, true, true},
	{mapFirewall, false, false},
}

// loopbackV4 and loopbackV6 are excluded from node ports by default:
// packets to loopback addresses cannot be DNATed to another host (as
// kube-proxy's nftables mode, which does not serve node ports there).
var (
	loopbackV4 = netip.MustParsePrefix("127.0.0.0/8")
	loopbackV6 = netip.MustParsePrefix("::1/128")
)

// maxNameLen is the longest object name the kernel accepts
// (NFT_NAME_MAXLEN is 256 bytes including the final NUL).
const maxNameLen = 255

// hashLen is the number of base32 characters of the identity hash in a
// chain name: 8 characters, 40 bits.
const hashLen = 8

// chainKey identifies a chain: its family's table and its name (the
// fixed chains have the same names in both tables).
type chainKey struct {
	family ipFamily
	name   string
}

// TableName returns the name of the tables of the proxier named
// serviceProxyName: "kpng-<serviceProxyName>", or "kpng" for an empty name
// (the proxier of the services without a service-proxy-name label).
func TableName(serviceProxyName string) string {
	if serviceProxyName == "" {
		return "kpng"
	}
	return "kpng-" + serviceProxyName
}

// familySuffix is "4" or "6".
func familySuffix(f ipFamily) string { return f.info().suffix }

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
// identity, written with nameSafe. The readable part makes names unique by
// construction; it is only cut, from its end, when the name would exceed
// the kernel's limit, and the hash (computed on the identity, before the
// cut) then keeps names apart.
func chainName(prefix, readable string) string {
	sum := sha256.Sum256([]byte(prefix + "\x00" + readable))
	h := base32.StdEncoding.EncodeToString(sum[:])[:hashLen]
	name := prefix + "-" + h + "-" + nameSafe(readable)
	if len(name) > maxNameLen {
		name = name[:maxNameLen]
	}
	return name
}

// nameSafe rewrites what nft's syntax does not allow in a name: a name is
// a letter, "_" or "." followed by letters, digits and "/-_.", and is not
// quoted in a listing, so a listing naming an object otherwise cannot be
// loaded back with nft -f (and a name holding a newline, ";" or "}" could
// write rules into it). Namespaces, service names, protocols and ports
// that Kubernetes accepts are made of allowed characters already; IPv6
// addresses (in the names of endpoint chains and affinity sets) have
// their ":" written "." ("fd00.1..2/8080"), which keeps them apart from
// each other and, the family being in the prefix (ep6, aff6), from IPv4
// addresses. Any other byte (from a state file or another controller,
// which Kubernetes does not check) becomes "_", as the iptables backend
// does; the hash in the name, of the identity before this rewriting,
// keeps such names apart.
func nameSafe(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '/', r == '-', r == '_', r == '.':
			return r
		case r == ':':
			return '.'
		}
		return '_'
	}, s)
}

// serviceChainName names the chain choosing among the endpoints of a
// service port for one family: "svc4-HASH-ns/name/tcp/80" for cluster IP
// traffic, "ext4-HASH-..." for external traffic when it uses other
// endpoints (externalTrafficPolicy: Local).
func serviceChainName(kind string, f ipFamily, svc model.ServiceKey, p *model.PortMapping) string {
	return chainName(kind+familySuffix(f), portID(svc, p))
}

// endpointChainName names the chain DNATing a service port to one
// endpoint: "ep4-HASH-ns/name/tcp/80__10.1.2.3/8080".
func endpointChainName(f ipFamily, svc model.ServiceKey, p *model.PortMapping, to string) string {
	return chainName("ep"+familySuffix(f), portID(svc, p)+"__"+to)
}

// balanceMapName names the verdict map choosing among the endpoint chains
// targets of a service port's chain of the given kind: "bal4-" and a hash
// (80 bits) of the chain's identity and of the targets, so that other
// targets make another map. The name is short on purpose: the kernel
// looks a table's sets up by name in a list, comparing whole names; the
// service chain that uses the map has the readable name.
func balanceMapName(f ipFamily, kind string, svc model.ServiceKey, p *model.PortMapping, targets []string) string {
	sum := sha256.Sum256([]byte(kind + "/" + portID(svc, p) + "\x00" + strings.Join(targets, "\x00")))
	return "bal" + familySuffix(f) + "-" + base32.StdEncoding.EncodeToString(sum[:])[:16]
}
