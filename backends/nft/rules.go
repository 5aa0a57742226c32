package nft

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/kpng/model"

	"sigs.k8s.io/kpng/backends/nodeflags"
)

// The fixed chains of masquerading and load-balancer firewalls.
const (
	// chainNATPostrouting is the NAT base chain (priority srcnat) that
	// jumps to chainMasquerading.
	chainNATPostrouting = "nat-postrouting"
	// chainMasquerading masquerades the packets carrying the masquerade
	// mark bit, and clears the bit.
	chainMasquerading = "masquerading"
	// chainMarkForMasquerade sets the masquerade mark bit.
	chainMarkForMasquerade = "mark-for-masquerade"
	// chainFilterPrerouting and chainFilterOutputPreDNAT are the filter
	// base chains (priority dstnat - 10: before DNAT) that jump to
	// chainFirewallCheck.
	chainFilterPrerouting    = "filter-prerouting"
	chainFilterOutputPreDNAT = "filter-output-firewall"
	// chainFirewallCheck looks up the firewall maps: load-balancer IPs
	// with loadBalancerSourceRanges.
	chainFirewallCheck = "firewall-check"
)

// DefaultMasqueradeBit is the packet mark bit asking for masquerading
// when Options does not set one: kube-proxy's (14, mark 0x4000), so that
// both mean the same on a node running both; the same for every backend.
const DefaultMasqueradeBit = nodeflags.DefaultMasqueradeBit

// Options are the node-wide settings that shape the rules.
type Options struct {
	// ClusterCIDRs are the pod networks. Traffic to a cluster IP from a
	// source outside them is masqueraded (as kube-proxy's --cluster-cidr),
	// and pods reaching an external address of a service with
	// externalTrafficPolicy: Local are sent to all its endpoints. Empty:
	// cluster IP traffic is not masqueraded (but for hairpin traffic).
	ClusterCIDRs []netip.Prefix
	// MasqueradeAll masquerades all traffic to cluster IPs.
	MasqueradeAll bool
	// MasqueradeBit is the packet mark bit (1-31, as kube-proxy's
	// --iptables-masquerade-bit but for 0) that asks for masquerading:
	// the mark is 1<<MasqueradeBit. 0 means DefaultMasqueradeBit, so that
	// the zero Options are kube-proxy's default (bit 0 cannot be chosen).
	MasqueradeBit int
	// NodePortAddresses restricts node ports to the local addresses in
	// these prefixes; empty means every local address but loopback.
	NodePortAddresses []netip.Prefix
	// NodeIPs are the node's addresses (kube-proxy's node IPs). When a
	// loadBalancerSourceRanges prefix contains one of them, the service's
	// load-balancer IPs are allowed as sources too, as kube-proxy does: a
	// load-balancer IP routed locally makes the node's own requests to it
	// come from it.
	NodeIPs []netip.Addr
	// IgnoreHeadless leaves headless services out, as kube-proxy does
	// (its informer does not even list them). By default kpng serves
	// their external and load-balancer IPs, of both families: the blog's
	// all-IP case, for which a headless service with external IPs is the
	// way to hand addresses to a specialized proxier.
	IgnoreHeadless bool
	// NoShardMaps gives every service port a chain of its own, as before
	// the shard maps (shards.go): a service added then makes the kernel
	// validate a table of one chain per service (tens of ms at 50,000
	// services, against a tenth of a millisecond for a shard's set
	// element), and the cold start programs a chain, a rule and interval
	// elements per service.
	NoShardMaps bool
}

// mark returns the masquerade mark: the bit MasqueradeBit set.
func (o Options) mark() uint32 {
	bit := o.MasqueradeBit
	if bit == 0 {
		bit = DefaultMasqueradeBit
	}
	return uint32(1) << uint(bit)
}

// Validate reports options that cannot be programmed.
func (o Options) Validate() error {
	return nodeflags.CheckOptions(o.ClusterCIDRs, o.NodePortAddresses, o.NodeIPs, o.MasqueradeBit)
}

// prefixesOf returns the prefixes of family f.
func prefixesOf(ps []netip.Prefix, f ipFamily) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if familyOf(p.Addr()) == f {
			out = append(out, p)
		}
	}
	return out
}

// prefixText writes a prefix as nft does: "10.0.0.0/8", or the address
// alone for a single address ("10.0.0.1", not "10.0.0.1/32").
func prefixText(p netip.Prefix) string {
	if p.IsSingleIP() {
		return p.Addr().String()
	}
	return p.String()
}

// saddrText is "ip saddr" or "ip6 saddr".
func saddrText(f ipFamily) string { return f.info().nft + " saddr" }

// markRule asks for masquerading: "jump mark-for-masquerade", only for
// packets to Dst when it is set (a cluster IP) and only for sources outside
// Except when it is set (a family's cluster CIDRs): one "ip saddr != P"
// match per prefix.
type markRule struct {
	Family ipFamily
	Dst    netip.Addr
	Except []netip.Prefix
}

// String implements rule.
func (r markRule) String() string {
	var b strings.Builder
	if r.Dst.IsValid() {
		fmt.Fprintf(&b, "%s %s ", daddrText(r.Family), r.Dst)
	}
	for _, p := range r.Except {
		fmt.Fprintf(&b, "%s != %s ", saddrText(r.Family), prefixText(p))
	}
	return b.String() + "jump " + chainMarkForMasquerade
}

// sourceRule matches the source address: inside Prefix (a single address
// for hairpin traffic) or, with LocalSource, a local address of the node;
// then jumps to mark-for-masquerade (Mark) or goes to Goto.
type sourceRule struct {
	Family      ipFamily
	Prefix      netip.Prefix
	LocalSource bool
	Mark        bool
	Goto        string
}

// String implements rule.
func (r sourceRule) String() string {
	match := "fib saddr type local"
	if !r.LocalSource {
		match = saddrText(r.Family) + " " + prefixText(r.Prefix)
	}
	if r.Mark {
		return match + " jump " + chainMarkForMasquerade
	}
	return match + " goto " + r.Goto
}

// allowRule lets a source prefix through a firewall chain:
// "ip saddr 192.0.2.0/24 return".
type allowRule struct {
	Family ipFamily
	Prefix netip.Prefix
}

// String implements rule.
func (r allowRule) String() string {
	return fmt.Sprintf("%s %s return", saddrText(r.Family), prefixText(r.Prefix))
}

// dropRule drops: the end of a firewall chain.
type dropRule struct{}

// String implements rule.
func (dropRule) String() string { return "drop" }

// affinityCheckRule sends a client that used an endpoint recently (its
// address is in the endpoint's affinity set) to it again:
// "ip saddr @aff4-… goto ep4-…".
type affinityCheckRule struct {
	Family ipFamily
	Set    string
	Goto   string
}

// String implements rule.
func (r affinityCheckRule) String() string {
	return fmt.Sprintf("%s @%s goto %s", saddrText(r.Family), r.Set, r.Goto)
}

// affinityUpdateRule records (or refreshes) the client in an endpoint's
// affinity set: "update @aff4-… { ip saddr }".
type affinityUpdateRule struct {
	Family ipFamily
	Set    string
}

// String implements rule.
func (r affinityUpdateRule) String() string {
	return fmt.Sprintf("update @%s { %s }", r.Set, saddrText(r.Family))
}

// namedSet is a named set or map of the table, of one of these kinds:
//
//   - an endpoint map (EndpointMap): blocks of endpoints, shared by up to
//     blocksPerMap service chains, its elements those of its blocks; the
//     set is not owned by a service and lives as long as one of its blocks;
//   - a shard map (Shard, shards.go): the endpoints of the plain service
//     ports of Shard endpoints, keyed by cluster IP, protocol, port and
//     draw; not owned by a service, it lives as long as one of its blocks;
//   - a shard set (ShardSet, shards.go): the keys (cluster IP . protocol .
//     port) of the service ports of shard ShardSet, elements of the
//     verdict maps' kind (mapElement with Verdict.Shard) without a
//     verdict; it lives as long as its shard map;
//   - an affinity set (Targets empty): the client addresses that used one
//     endpoint of a service port with session affinity, each expiring after
//     Timeout without traffic;
//   - a balance map (Targets set): "type integer : verdict", i -> goto
//     Targets[i], looked up with "numgen random mod N". A named map rather
//     than an anonymous one: the kernel binds each anonymous set of a rule by
//     walking the whole transaction, which made a cold start quadratic.
//
// The name of an affinity set or balance map says all of its content (the
// timeout, a hash of the targets), so that such a set never changes: a new
// content is a new set, and the rules referring to it change in the same
// transaction. An endpoint map's elements change in place.
type namedSet struct {
	Name        string
	Family      ipFamily
	EndpointMap bool
	// Shard is the shard of a shard map: the number of endpoints of its
	// service ports (0: not a shard map).
	Shard uint32
	// ShardSet is the shard of a shard set (0: not a shard set).
	ShardSet uint32
	Timeout  time.Duration
	Targets  []string
	Service  model.ServiceKey
}

// equalSets reports whether two sets are the same.
func equalSets(a, b *namedSet) bool {
	return a.Name == b.Name && a.Family == b.Family && a.EndpointMap == b.EndpointMap && a.Shard == b.Shard && a.ShardSet == b.ShardSet && a.Timeout == b.Timeout && a.Service == b.Service && slices.Equal(a.Targets, b.Targets)
}

// userData returns the user data nft keeps in the set, for the sets
// keyed by a random number (setUserData), nil for the others, whose types
// nft knows from the kernel's.
func (s *namedSet) userData() []byte {
	switch {
	case s.EndpointMap:
		return endpointMapUserData(s.Family)
	case s.Shard > 0:
		return shardMapUserData(s.Family, s.Shard)
	case len(s.Targets) > 0:
		return balanceMapUserData(len(s.Targets))
	}
	return nil
}

// affinitySetSize is the number of clients an affinity set holds at most:
// the kernel's default for a set that packets add to, given explicitly so
// that the text says it.
const affinitySetSize = 65535

// Text returns the set's declaration in nft syntax, as nft lists it, with
// the elements of an endpoint or shard map given in els (its own) and their comments in
// comments, or those of a shard set in keys; size is a shard set's or map's capacity
// (capacity.go). The maps keyed by a random number are declared with typeof
// (setUserData): nft has no type name for an integer key.
func (s *namedSet) Text(size uint32, els []endpointElement, comments blockComments, keys []mapElement) string {
	if s.ShardSet > 0 {
		text := fmt.Sprintf("set %s {\n\t\ttype %s . inet_proto . inet_service\n\t\tsize %d", s.Name, s.Family.info().addrType, size)
		var lines []string
		for _, e := range keys {
			lines = append(lines, "\t\t\t"+e.text())
		}
		if len(lines) > 0 {
			text += "\n\t\telements = {\n" + strings.Join(lines, ",\n") + "\n\t\t}"
		}
		return text + "\n\t}"
	}
	if s.EndpointMap || s.Shard > 0 {
		text := fmt.Sprintf("map %s {\n\t\ttypeof %s : %s\n\t\tflags interval", s.Name, numgenText(blockRange, 0), endpointDataTypeof(s.Family))
		if s.Shard > 0 {
			text = fmt.Sprintf("map %s {\n\t\ttypeof %s\n\t\tsize %d", s.Name, shardMapTypeof(s.Family, s.Shard), size)
		}
		var lines []string
		for _, e := range els {
			lines = append(lines, "\t\t\t"+e.text(comments.of(e)))
		}
		if len(lines) > 0 {
			text += "\n\t\telements = {\n" + strings.Join(lines, ",\n") + "\n\t\t}"
		}
		return text + "\n\t}"
	}
	if len(s.Targets) > 0 {
		els := make([]string, len(s.Targets))
		for i, t := range s.Targets {
			els[i] = fmt.Sprintf("%d : goto %s", i, t)
		}
		return fmt.Sprintf("map %s {\n\t\ttypeof %s : verdict\n\t\tflags constant\n\t\telements = { %s }\n\t}", s.Name, numgenText(uint32(len(s.Targets)), 0), strings.Join(els, ", "))
	}
	return fmt.Sprintf("set %s {\n\t\ttype %s\n\t\tsize %d\n\t\tflags dynamic,timeout\n\t\ttimeout %s\n\t}", s.Name, s.Family.info().addrType, affinitySetSize, durationText(s.Timeout))
}

// durationText writes d as nft does: days, hours, minutes, seconds and
// milliseconds, each only if not zero ("3h", "1m30s").
func durationText(d time.Duration) string {
	ms := d.Milliseconds()
	var b strings.Builder
	for _, u := range []struct {
		ms   int64
		name string
	}{{86400000, "d"}, {3600000, "h"}, {60000, "m"}, {1000, "s"}, {1, "ms"}} {
		if n := ms / u.ms; n > 0 {
			fmt.Fprintf(&b, "%d%s", n, u.name)
			ms -= n * u.ms
		}
	}
	if b.Len() == 0 {
		return "0s"
	}
	return b.String()
}
