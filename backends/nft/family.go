package nft

import "net/netip"

// familyInfo is everything that differs between the two families, in
// names and text (netlinkFamily adds what differs in netlink): one table
// instead of a test of the family in each place.
type familyInfo struct {
	// name is "ipv4" or "ipv6"; suffix "4" or "6" in object names; nft the
	// keyword of the address match ("ip", "ip6"); addrType the address
	// type in nft's text ("ipv4_addr").
	name, suffix, nft, addrType string
	// addrLen is an address's length, saddr and daddr their offsets in
	// the network header.
	addrLen, saddr, daddr uint32
	// loopback is the family's loopback network, where node ports are
	// not served by default.
	loopback netip.Prefix
}

// families are the two families' facts, indexed by ipFamily.
var families = [2]familyInfo{
	ipv4: {
		name: "ipv4", suffix: "4", nft: "ip", addrType: "ipv4_addr",
		addrLen: 4, saddr: 12, daddr: 16,
		loopback: loopbackV4,
	},
	ipv6: {
		name: "ipv6", suffix: "6", nft: "ip6", addrType: "ipv6_addr",
		addrLen: 16, saddr: 8, daddr: 24,
		loopback: loopbackV6,
	},
}

// info returns the facts of family f.
func (f ipFamily) info() *familyInfo { return &families[f] }
