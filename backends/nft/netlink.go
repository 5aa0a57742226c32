//go:build linux

package nft

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Registers: the 16-byte register 1 and the 32-bit registers (NFT_REG32_xx)
// that concatenated lookup keys use, as nft itself allocates them.
const (
	reg1      = 1
	reg32v4L4 = 9  // NFT_REG32_01: after a 4-byte IPv4 address
	reg32v4Dp = 10 // NFT_REG32_02
	reg32v6L4 = 12 // NFT_REG32_04: after a 16-byte IPv6 address
	reg32v6Dp = 13 // NFT_REG32_05
	// reg32NodePortDp is NFT_REG32_01: the port after the 4-byte
	// protocol of a node-port key.
	reg32NodePortDp = 9
	regVerdict      = 0
	// reg32EndpointPortV4 and reg32EndpointPortV6 hold the port of the
	// endpoint an endpoint map gives, after its address in register 1.
	reg32EndpointPortV4 = 9  // after 4 bytes
	reg32EndpointPortV6 = 12 // NFT_REG32_04: after 16 bytes
	// reg32HairpinDst holds the destination of a hairpin key, after the
	// source in register 1.
	reg32HairpinDstV4 = 9  // after 4 bytes
	reg32HairpinDstV6 = 12 // NFT_REG32_04: after 16 bytes
)

// endpointMapKey is the key type of the endpoint maps: the random number
// drawn by numgen, offset by its block's place in the map, one 4-byte
// integer in network byte order (the map is an interval map, compared as
// bytes). nft knows the key from the map's user data (typeof numgen
// random mod 10000000: setUserData).
var endpointMapKey = func() nftables.SetDatatype {
	t := nftables.TypeInteger
	t.Bytes = 4
	return t
}()

// endpointMapRef returns the set object of an endpoint map of family f.
func endpointMapRef(t *nftables.Table, f ipFamily, name string) *nftables.Set {
	return &nftables.Set{
		Table:    t,
		Name:     name,
		IsMap:    true,
		Interval: true,
		KeyType:  endpointMapKey,
		DataType: nftables.MustConcatSetType(addrType(f), nftables.TypeInetService),
	}
}

// hairpinSetRef returns the set object of the hairpin set of family f.
func hairpinSetRef(t *nftables.Table, f ipFamily) *nftables.Set {
	return &nftables.Set{
		Table:         t,
		Name:          mapHairpin(f),
		Concatenation: true,
		KeyType:       nftables.MustConcatSetType(addrType(f), addrType(f)),
	}
}

// hairpinElement returns the element (a . a) of a hairpin set.
func hairpinElement(a netip.Addr) nftables.SetElement {
	return nftables.SetElement{Key: append(a.AsSlice(), a.AsSlice()...)}
}

// endpointMapElements returns the two kernel elements of an interval of an
// endpoint map: its start (its first key, with the endpoint and the
// comment unless del) and its end (the key after its last one, flagged as
// such).
func endpointMapElements(e endpointElement, comment string, del bool) [2]nftables.SetElement {
	first, last := e.keys()
	start := nftables.SetElement{Key: binary.BigEndian.AppendUint32(nil, first)}
	if !del {
		start.Val = binary.BigEndian.AppendUint16(e.Target.Addr().AsSlice(), e.Target.Port())
		start.Val = append(start.Val, 0, 0)
		start.Comment = comment
	}
	end := nftables.SetElement{Key: binary.BigEndian.AppendUint32(nil, last+1), IntervalEnd: true}
	return [2]nftables.SetElement{start, end}
}

// hairpinExprs returns, for the masquerading chain of family f's table,
// "ct status dnat ip saddr . ip daddr @hairpin-vX masquerade
// fully-random": a pod that reached itself through a service.
func hairpinExprs(f ipFamily, set *nftables.Set) []expr.Any {
	fi := f.info()
	src, dst, alen, rdst := fi.saddr, fi.daddr, fi.addrLen, f.nl().regHairpinDst
	exprs := append([]expr.Any(nil),
		&expr.Ct{Key: expr.CtKeySTATUS, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: binaryutil.NativeEndian.PutUint32(ipsDstNAT), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: make([]byte, 4)},
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: src, Len: alen},
		&expr.Payload{DestRegister: rdst, Base: expr.PayloadBaseNetworkHeader, Offset: dst, Len: alen},
		&expr.Lookup{SourceRegister: reg1, SetName: set.Name, SetID: set.ID},
		&expr.Masq{FullyRandom: true})
	return exprs
}

// ipsDstNAT is the conntrack status bit of a DNATed connection
// (IPS_DST_NAT).
const ipsDstNAT = 1 << 5

// dnatMapExprs returns the expressions of a dnatMapRule, those nft
// generates for its text: the protocol match, then hton(numgen random mod
// blockRange offset the block's first key) looked up in the block's
// endpoint map, and the DNAT to the address and port found.
func dnatMapExprs(r dnatMapRule, sets map[string]*nftables.Set) ([]expr.Any, error) {
	proto, ok := l4proto(r.Proto)
	if !ok {
		return nil, fmt.Errorf("protocol %d not supported", r.Proto)
	}
	if r.Map == "" {
		return nil, fmt.Errorf("block %s has no place in an endpoint map", r.Block)
	}
	fam, regPort := uint32(r.Family.nl().nfproto), r.Family.nl().regEndpointPort
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{proto}},
		&expr.Numgen{Register: reg1, Modulus: blockRange, Offset: blockOffset(r.Slot), Type: unix.NFT_NG_RANDOM},
		&expr.Byteorder{SourceRegister: reg1, DestRegister: reg1, Op: expr.ByteorderHton, Len: 4, Size: 4},
		&expr.Lookup{SourceRegister: reg1, DestRegister: reg1, IsDestRegSet: true, SetName: r.Map, SetID: setID(sets, r.Map)},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: fam, RegAddrMin: reg1, RegProtoMin: regPort, Specified: true},
	}, nil
}

// mapKeyType returns the key type of the maps of a family: address .
// protocol . port, or protocol . port for node-port maps.
func mapKeyType(f ipFamily, nodePort bool) nftables.SetDatatype {
	if nodePort {
		return nftables.MustConcatSetType(nftables.TypeInetProto, nftables.TypeInetService)
	}
	return nftables.MustConcatSetType(addrType(f), nftables.TypeInetProto, nftables.TypeInetService)
}

// addrType is the address type of a family.
func addrType(f ipFamily) nftables.SetDatatype { return f.nl().setType }

// mapRef returns the set object of one of the table's verdict maps.
func mapRef(t *nftables.Table, f ipFamily, name string) *nftables.Set {
	return &nftables.Set{
		Table:         t,
		Name:          name,
		IsMap:         true,
		Concatenation: true,
		KeyType:       mapKeyType(f, isNodePortMap(name)),
		DataType:      nftables.TypeVerdict,
	}
}

// keyBytes encodes a map key as the kernel stores concatenations: each
// field padded to 4 bytes, in network byte order.
func keyBytes(k mapKey) ([]byte, error) {
	proto, ok := l4proto(k.Proto)
	if !ok {
		return nil, fmt.Errorf("protocol %d not supported", k.Proto)
	}
	var b []byte
	if k.Addr.IsValid() {
		b = k.Addr.AsSlice()
	}
	b = append(b, proto, 0, 0, 0)
	b = binary.BigEndian.AppendUint16(b, k.Port)
	return append(b, 0, 0), nil
}

// verdictExpr returns the verdict of a map element.
func verdictExpr(v verdict) *expr.Verdict {
	if v.Goto == "" {
		return &expr.Verdict{Kind: expr.VerdictDrop}
	}
	return &expr.Verdict{Kind: expr.VerdictGoto, Chain: v.Goto}
}

// lookupExprs returns the expressions of
// "ip[6] daddr . meta l4proto . th dport vmap @m", for a node-port map
// "[daddr in prefix] fib daddr type local [daddr not in prefix] meta
// l4proto . th dport vmap @m" (nodePortMatchExprs), or for one whose
// address match is in the chains its elements go to (checkedAfter) "meta
// l4proto . th dport vmap @m". A table holds one family: no rule matches
// the family (meta nfproto), unlike in an inet table.
func lookupExprs(f ipFamily, k mapKind, npm nodePortMatch, m *nftables.Set) []expr.Any {
	var exprs []expr.Any
	switch {
	case !k.nodePort:
		exprs = lookupKeyExprs(f)
	case k.checkedAfter:
	default:
		exprs = nodePortMatchExprs(f, npm)
	}
	if k.nodePort {
		exprs = append(exprs,
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
			&expr.Payload{DestRegister: reg32NodePortDp, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2})
	}
	return append(exprs, &expr.Lookup{SourceRegister: reg1, DestRegister: regVerdict, IsDestRegSet: true, SetName: m.Name, SetID: m.ID})
}

// lookupKeyExprs returns the loading of the key
// (daddr . l4proto . dport) of the services maps and shard sets, from
// register 1.
func lookupKeyExprs(f ipFamily) []expr.Any {
	fi := f.info()
	return []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: fi.daddr, Len: fi.addrLen},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: f.nl().regL4},
		&expr.Payload{DestRegister: f.nl().regDport, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}}
}

// nodePortMatchExprs returns the expressions of the address match npm of
// family f: "[daddr in prefix] fib daddr type local [daddr not in
// prefix]" (nodePortMatchText).
func nodePortMatchExprs(f ipFamily, npm nodePortMatch) []expr.Any {
	var exprs []expr.Any
	if npm.Prefix.IsValid() {
		exprs = append(exprs, addrMatchExprs(f, false, npm.Prefix, expr.CmpOpEq)...)
	}
	exprs = append(exprs,
		&expr.Fib{Register: reg1, FlagDADDR: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)})
	if npm.NotPrefix.IsValid() {
		exprs = append(exprs, addrMatchExprs(f, false, npm.NotPrefix, expr.CmpOpNeq)...)
	}
	return exprs
}

// addrMatchExprs returns the expressions matching the source (or
// destination, saddr false) address of a packet of family f against p
// with op (equal: inside p; not equal: outside p).
func addrMatchExprs(f ipFamily, saddr bool, p netip.Prefix, op expr.CmpOp) []expr.Any {
	off, alen := f.info().daddr, f.info().addrLen
	if saddr {
		off -= alen
	}
	exprs := []expr.Any{&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: alen}}
	if p.Bits() < p.Addr().BitLen() {
		mask := net.CIDRMask(p.Bits(), p.Addr().BitLen())
		exprs = append(exprs, &expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: alen, Mask: mask, Xor: make([]byte, alen)})
	}
	return append(exprs, &expr.Cmp{Op: op, Register: reg1, Data: p.Masked().Addr().AsSlice()})
}

// markExprs returns "meta mark set meta mark | bit" (or, with flip, "^
// bit": clears a bit known to be set).
func markExprs(bit uint32, flip bool) []expr.Any {
	mask, xor := ^bit, bit
	if flip {
		mask = 0xffffffff
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: binaryutil.NativeEndian.PutUint32(mask), Xor: binaryutil.NativeEndian.PutUint32(xor)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: reg1},
	}
}

// masqueradeMarkedExprs returns the first rule of the masquerading chain,
// "meta mark & bit != 0 meta mark set meta mark ^ bit masquerade
// fully-random": a connection marked for masquerading is masqueraded
// before anything else is looked at (the hairpin sets' lookups come
// after it, as in kube-proxy's chain).
func masqueradeMarkedExprs(bit uint32) []expr.Any {
	return append([]expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: binaryutil.NativeEndian.PutUint32(bit), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: make([]byte, 4)},
	}, append(markExprs(bit, true), &expr.Masq{FullyRandom: true})...)
}

// markVerdict is "jump mark-for-masquerade".
func markVerdict() expr.Any {
	return &expr.Verdict{Kind: expr.VerdictJump, Chain: chainMarkForMasquerade}
}

// gotoVerdict is "goto chain".
func gotoVerdict(chain string) expr.Any {
	return &expr.Verdict{Kind: expr.VerdictGoto, Chain: chain}
}

// The expressions of each kind of rule, what the kernel is sent: each rule
// says its own (a kind without them does not compile). sets holds the sets
// added in the same transaction, for their IDs.

func (r balanceRule) exprs(sets map[string]*nftables.Set) ([]expr.Any, error) {
	return balanceExprs(r, sets)
}

func (r dnatRule) exprs(map[string]*nftables.Set) ([]expr.Any, error) { return dnatExprs(r) }

func (r dnatMapRule) exprs(sets map[string]*nftables.Set) ([]expr.Any, error) {
	return dnatMapExprs(r, sets)
}

func (r markRule) exprs(map[string]*nftables.Set) ([]expr.Any, error) {
	var exprs []expr.Any
	if r.Dst.IsValid() {
		exprs = append(exprs, addrMatchExprs(r.Family, false, netip.PrefixFrom(r.Dst, r.Dst.BitLen()), expr.CmpOpEq)...)
	}
	for _, p := range r.Except {
		exprs = append(exprs, addrMatchExprs(r.Family, true, p, expr.CmpOpNeq)...)
	}
	return append(exprs, markVerdict()), nil
}

func (r sourceRule) exprs(map[string]*nftables.Set) ([]expr.Any, error) {
	var exprs []expr.Any
	if r.LocalSource {
		exprs = []expr.Any{
			&expr.Fib{Register: reg1, FlagSADDR: true, ResultADDRTYPE: true},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binaryutil.NativeEndian.PutUint32(unix.RTN_LOCAL)},
		}
	} else {
		exprs = addrMatchExprs(r.Family, true, r.Prefix, expr.CmpOpEq)
	}
	if r.Mark {
		return append(exprs, markVerdict()), nil
	}
	return append(exprs, gotoVerdict(r.Goto)), nil
}

func (r allowRule) exprs(map[string]*nftables.Set) ([]expr.Any, error) {
	return append(addrMatchExprs(r.Family, true, r.Prefix, expr.CmpOpEq), &expr.Verdict{Kind: expr.VerdictReturn}), nil
}

func (dropRule) exprs(map[string]*nftables.Set) ([]expr.Any, error) {
	return []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}}, nil
}

func (r affinityCheckRule) exprs(sets map[string]*nftables.Set) ([]expr.Any, error) {
	return []expr.Any{
		saddrPayload(r.Family),
		&expr.Lookup{SourceRegister: reg1, SetName: r.Set, SetID: setID(sets, r.Set)},
		gotoVerdict(r.Goto),
	}, nil
}

func (r affinityUpdateRule) exprs(sets map[string]*nftables.Set) ([]expr.Any, error) {
	return []expr.Any{
		saddrPayload(r.Family),
		&expr.Dynset{SrcRegKey: reg1, SetName: r.Set, SetID: setID(sets, r.Set), Operation: unix.NFT_DYNSET_OP_UPDATE},
	}, nil
}

// saddrPayload loads the source address into register 1.
func saddrPayload(f ipFamily) expr.Any {
	return &expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: f.info().saddr, Len: f.info().addrLen}
}

// setID returns the ID of the set name if it was added in the current
// transaction (0 otherwise: the kernel finds it by name).
func setID(sets map[string]*nftables.Set, name string) uint32 {
	if s := sets[name]; s != nil {
		return s.ID
	}
	return 0
}

// setRef returns the set object of a namedSet: an interval map of endpoints
// for an endpoint map, a hash map of endpoints for a shard map, a set of
// service keys for a shard set, a constant verdict map keyed by integers
// for a balance map, a dynamic address set with a timeout for an affinity
// set.
func setRef(t *nftables.Table, s *namedSet) *nftables.Set {
	if s.EndpointMap {
		return endpointMapRef(t, s.Family, s.Name)
	}
	if s.Shard > 0 {
		return shardMapRef(t, s.Family, s.Name)
	}
	if s.ShardSet > 0 {
		return shardSetRef(t, s.Family, s.Name)
	}
	if len(s.Targets) > 0 {
		return &nftables.Set{Table: t, Name: s.Name, IsMap: true, Constant: true, KeyType: nftables.TypeInteger, DataType: nftables.TypeVerdict}
	}
	return &nftables.Set{
		Table:      t,
		Name:       s.Name,
		KeyType:    addrType(s.Family),
		Dynamic:    true,
		HasTimeout: true,
		Timeout:    s.Timeout,
		Size:       affinitySetSize,
	}
}

// rejectRules returns the rules of the reject chain of family f's table:
// a TCP reset, else an ICMP (ICMPv6) port unreachable.
func rejectRules(f ipFamily) [][]expr.Any {
	return [][]expr.Any{
		{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{unix.IPPROTO_TCP}},
			&expr.Reject{Type: unix.NFT_REJECT_TCP_RST},
		},
		{&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: f.nl().portUnreachable}},
	}
}

// dnatExprs returns the expressions of a dnatRule.
func dnatExprs(r dnatRule) ([]expr.Any, error) {
	proto, ok := l4proto(r.Proto)
	if !ok {
		return nil, fmt.Errorf("protocol %d not supported", r.Proto)
	}
	fam := uint32(familyOf(r.To.Addr()).nl().nfproto)
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{proto}},
		&expr.Immediate{Register: 1, Data: r.To.Addr().AsSlice()},
		&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(r.To.Port())},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: fam, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	}, nil
}

// balanceExprs returns the expressions of a balanceRule: "goto target",
// or "numgen random mod N vmap @map" (sets: the sets added in the same
// transaction, for their IDs).
func balanceExprs(r balanceRule, sets map[string]*nftables.Set) ([]expr.Any, error) {
	switch {
	case len(r.Targets) == 0:
		return nil, fmt.Errorf("balance rule without targets")
	case len(r.Targets) == 1:
		return []expr.Any{gotoVerdict(r.Targets[0])}, nil
	case r.Map == "":
		return nil, fmt.Errorf("balance rule over %d targets without a map", len(r.Targets))
	}
	return []expr.Any{
		&expr.Numgen{Register: reg1, Modulus: uint32(len(r.Targets)), Type: unix.NFT_NG_RANDOM},
		&expr.Lookup{SourceRegister: reg1, DestRegister: regVerdict, IsDestRegSet: true, SetName: r.Map, SetID: setID(sets, r.Map)},
	}, nil
}

// balanceElements returns the elements of a balance map: i -> goto
// targets[i] (numgen writes its result in host byte order).
func balanceElements(targets []string) []nftables.SetElement {
	els := make([]nftables.SetElement, len(targets))
	for i, target := range targets {
		els[i] = nftables.SetElement{
			Key:         binaryutil.NativeEndian.PutUint32(uint32(i)),
			VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: target},
		}
	}
	return els
}

// clusterIPsSetRef returns the set object of the cluster-ips set of
// family f.
func clusterIPsSetRef(t *nftables.Table, f ipFamily) *nftables.Set {
	return &nftables.Set{Table: t, Name: setClusterIPs(f), KeyType: addrType(f)}
}

// addrElement returns the element a of an address set.
func addrElement(a netip.Addr) nftables.SetElement {
	return nftables.SetElement{Key: a.AsSlice()}
}

// ctStateNew is the conntrack state bit of a new connection
// (NF_CT_STATE_BIT(IP_CT_NEW)), in host byte order as ct state loads it.
const ctStateNew = 1 << 3

// newConnJumpExprs returns "ct state new jump chain".
func newConnJumpExprs(chain string) []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: reg1},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: binaryutil.NativeEndian.PutUint32(ctStateNew), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: make([]byte, 4)},
		&expr.Verdict{Kind: expr.VerdictJump, Chain: chain},
	}
}

// daddrInSetExprs returns "ip[6] daddr @set" and then v: the rules of the
// cluster-IP check.
func daddrInSetExprs(f ipFamily, set *nftables.Set, v *expr.Verdict) []expr.Any {
	fi := f.info()
	return []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: fi.daddr, Len: fi.addrLen},
		&expr.Lookup{SourceRegister: reg1, SetName: set.Name, SetID: set.ID},
		v}
}

// clusterIPsCheckRules returns the rules of cluster-ips-check in family
// f's table: new connections to a cluster IP (in its cluster-ips set
// clusterIPs) that
// were not DNATed go to reject-chain, then those to the other addresses
// of the service CIDRs are dropped, one rule per range: "ip[6] daddr
// PREFIX drop", or "ip[6] daddr FROM-LAST drop" for a range that is no
// prefix. A constant match, as kube-proxy's, and not a lookup in an
// interval set (kpng's until 2026-12-02): every new connection crossing
// forward or output is checked, and the interval set's lookup (the
// kernel's rbtree) was about 1% of its first packet. A change of the
// service CIDRs rewrites the chain (rare: ServiceCIDR objects).
func clusterIPsCheckRules(f ipFamily, clusterIPs *nftables.Set, cidrs []addrRange) [][]expr.Any {
	out := [][]expr.Any{daddrInSetExprs(f, clusterIPs, &expr.Verdict{Kind: expr.VerdictGoto, Chain: chainReject})}
	for _, r := range cidrs {
		if r.family() != f {
			continue
		}
		var exprs []expr.Any
		if p, ok := r.prefix(); ok {
			exprs = addrMatchExprs(f, false, p, expr.CmpOpEq)
		} else {
			exprs = append(exprs,
				&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: f.info().daddr, Len: f.info().addrLen},
				&expr.Range{Op: expr.CmpOpEq, Register: reg1, FromData: r.From.AsSlice(), ToData: r.Last.AsSlice()})
		}
		out = append(out, append(exprs, &expr.Verdict{Kind: expr.VerdictDrop}))
	}
	return out
}

// netlinkFamily is what differs between the two families in netlink
// (familyInfo holds the rest).
type netlinkFamily struct {
	// setType is the address type of sets and map keys.
	setType nftables.SetDatatype
	// table is the family of its table (TableFamilyIPv4).
	table nftables.TableFamily
	// nfproto is the family of its NAT statements (NFPROTO_IPV4).
	nfproto byte
	// portUnreachable is the ICMP (ICMPv6) code of a port unreachable.
	portUnreachable uint8
	// regL4 and regDport hold the protocol and port after an address in
	// a service-map key (address . protocol . port); regHairpinDst the
	// destination after the source in register 1 (hairpin key);
	// regEndpointPort the port after the address of an endpoint found in
	// an endpoint map.
	regL4, regDport, regHairpinDst, regEndpointPort uint32
}

// netlinkFamilies are the two families' netlink facts, indexed by
// ipFamily.
var netlinkFamilies = [2]netlinkFamily{
	ipv4: {
		setType: nftables.TypeIPAddr, table: nftables.TableFamilyIPv4, nfproto: unix.NFPROTO_IPV4,
		regL4: reg32v4L4, regDport: reg32v4Dp, regHairpinDst: reg32HairpinDstV4, regEndpointPort: reg32EndpointPortV4,
		portUnreachable: 3, // ICMP_PORT_UNREACH
	},
	ipv6: {
		setType: nftables.TypeIP6Addr, table: nftables.TableFamilyIPv6, nfproto: unix.NFPROTO_IPV6,
		regL4: reg32v6L4, regDport: reg32v6Dp, regHairpinDst: reg32HairpinDstV6, regEndpointPort: reg32EndpointPortV6,
		portUnreachable: 4, // ICMPV6_PORT_UNREACH
	},
}

// nl returns the netlink facts of family f.
func (f ipFamily) nl() *netlinkFamily { return &netlinkFamilies[f] }

// netlinkRule is a rule as the applier sends it: with its netlink
// expressions.
type netlinkRule interface {
	rule
	// exprs returns the rule's netlink expressions, what the kernel is
	// sent; sets holds the sets added in the same transaction, for the
	// IDs of those the rule refers to.
	exprs(sets map[string]*nftables.Set) ([]expr.Any, error)
}

// Every rule has its netlink expressions.
var _ = []netlinkRule{balanceRule{}, dnatRule{}, dnatMapRule{}, shardDnatRule{}, markRule{}, sourceRule{}, allowRule{}, dropRule{}, affinityCheckRule{}, affinityUpdateRule{}}
