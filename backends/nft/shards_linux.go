//go:build linux

package nft

import (
	"encoding/binary"
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// shardMapKey is the key type of the shard maps of a family: address .
// protocol . port . draw (the draw a 4-byte integer in network byte
// order, as nft sends a numgen value to an interval map).
func shardMapKey(f ipFamily) nftables.SetDatatype {
	return nftables.MustConcatSetType(addrType(f), nftables.TypeInetProto, nftables.TypeInetService, nftables.TypeInteger)
}

// shardMapRef returns the set object of a shard map of family f: an
// endpoint map's, with a concatenated key (an interval map with a
// concatenated key: the kernel's pipapo set).
func shardMapRef(t *nftables.Table, f ipFamily, name string) *nftables.Set {
	m := endpointMapRef(t, f, name)
	m.Concatenation, m.KeyType = true, shardMapKey(f)
	return m
}

// intervalMapRef returns the set object of the endpoint or shard map name
// of family f.
func intervalMapRef(t *nftables.Table, f ipFamily, name string) *nftables.Set {
	if isShardEndpointMap(name) {
		return shardMapRef(t, f, name)
	}
	return endpointMapRef(t, f, name)
}

// shardMapElement returns the kernel element of an interval of a shard
// map: one element from its first key to its last (a pipapo set takes an
// interval as a key and a key end, not as two elements), with the
// endpoint and the comment unless del.
func shardMapElement(e endpointElement, comment string, del bool) (nftables.SetElement, error) {
	k, err := keyBytes(e.Shard)
	if err != nil {
		return nftables.SetElement{}, err
	}
	first, last := e.keys()
	el := nftables.SetElement{
		Key:    binary.BigEndian.AppendUint32(k, first),
		KeyEnd: binary.BigEndian.AppendUint32(k[:len(k):len(k)], last),
	}
	if !del {
		el.Val = binary.BigEndian.AppendUint16(e.Target.Addr().AsSlice(), e.Target.Port())
		el.Val = append(el.Val, 0, 0)
		el.Comment = comment
	}
	return el, nil
}

// exprs returns the expressions nft generates for the rule's text, in
// its order: the family's match, the protocol's, and the lookup of daddr
// . l4proto . dport . hton(numgen random mod shardRange) in the shard
// map, then the DNAT to the address and port found.
func (r shardDnatRule) exprs(sets map[string]*nftables.Set) ([]expr.Any, error) {
	proto, ok := l4proto(r.Proto)
	if !ok {
		return nil, fmt.Errorf("protocol %d not supported", r.Proto)
	}
	fi, nl := r.Family.info(), r.Family.nl()
	return append(nfprotoExprs(r.Family),
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{proto}},
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: fi.daddr, Len: fi.addrLen},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: nl.regL4},
		&expr.Byteorder{SourceRegister: nl.regL4, DestRegister: nl.regL4, Op: expr.ByteorderHton, Size: 2, Len: 1},
		&expr.Payload{DestRegister: nl.regDport, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Numgen{Register: nl.regDport + 1, Modulus: shardRange, Type: unix.NFT_NG_RANDOM},
		&expr.Byteorder{SourceRegister: nl.regDport + 1, DestRegister: nl.regDport + 1, Op: expr.ByteorderHton, Size: 4, Len: 4},
		&expr.Lookup{SourceRegister: reg1, DestRegister: reg1, IsDestRegSet: true, SetName: r.Map, SetID: setID(sets, r.Map)},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(nl.nfproto), RegAddrMin: reg1, RegProtoMin: nl.regEndpointPort, Specified: true},
	), nil
}
