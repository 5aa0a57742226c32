//go:build linux

package nft

import (
	"net/netip"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// familyInfo is everything that differs between the two families, in
// names, text and netlink: one table instead of a test of the family in
// each place.
type familyInfo struct {
	// name is "ipv4" or "ipv6"; suffix "4" or "6" in object names; nft the
	// keyword of the address match ("ip", "ip6"); addrType the address
	// type in nft's text ("ipv4_addr").
	name, suffix, nft, addrType string
	// setType is the address type of sets and map keys.
	setType nftables.SetDatatype
	// nfproto is the meta nfproto of the family (NFPROTO_IPV4).
	nfproto byte
	// addrLen is an address's length, saddr and daddr their offsets in
	// the network header.
	addrLen, saddr, daddr uint32
	// regL4 and regDport hold the protocol and port after an address in
	// a service-map key (address . protocol . port); regHairpinDst the
	// destination after the source in register 1 (hairpin key);
	// regEndpointPort the port after the address of an endpoint found in
	// an endpoint map.
	regL4, regDport, regHairpinDst, regEndpointPort uint32
	// loopback is the family's loopback network, where node ports are
	// not served by default.
	loopback netip.Prefix
}

// families are the two families' facts, indexed by ipFamily.
var families = [2]familyInfo{
	ipv4: {
		name: "ipv4", suffix: "4", nft: "ip", addrType: "ipv4_addr",
		setType: nftables.TypeIPAddr, nfproto: unix.NFPROTO_IPV4,
		addrLen: 4, saddr: 12, daddr: 16,
		regL4: reg32v4L4, regDport: reg32v4Dp, regHairpinDst: reg32HairpinDstV4, regEndpointPort: reg32EndpointPortV4,
		loopback: loopbackV4,
	},
	ipv6: {
		name: "ipv6", suffix: "6", nft: "ip6", addrType: "ipv6_addr",
		setType: nftables.TypeIP6Addr, nfproto: unix.NFPROTO_IPV6,
		addrLen: 16, saddr: 8, daddr: 24,
		regL4: reg32v6L4, regDport: reg32v6Dp, regHairpinDst: reg32HairpinDstV6, regEndpointPort: reg32EndpointPortV6,
		loopback: loopbackV6,
	},
}

// info returns the facts of family f.
func (f ipFamily) info() *familyInfo { return &families[f] }
