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
// protocol . port . draw (the draw a 4-byte integer in the host's byte
// order, as nft sends a numgen value to a hash map).
func shardMapKey(f ipFamily) nftables.SetDatatype {
	return nftables.MustConcatSetType(addrType(f), nftables.TypeInetProto, nftables.TypeInetService, nftables.TypeInteger)
}

// shardMapRef returns the set object of a shard map of family f: an
// endpoint map's data, with a concatenated key and no intervals (a hash:
// one element per endpoint).
func shardMapRef(t *nftables.Table, f ipFamily, name string) *nftables.Set {
	m := endpointMapRef(t, f, name)
	m.Interval, m.Concatenation, m.KeyType = false, true, shardMapKey(f)
	return m
}

// shardSetRef returns the set object of a shard set of family f: the
// services map's key (address . protocol . port), without data.
func shardSetRef(t *nftables.Table, f ipFamily, name string) *nftables.Set {
	return &nftables.Set{Table: t, Name: name, Concatenation: true, KeyType: mapKeyType(f, false)}
}

// shardRuleExprs returns the expressions nft generates for the services
// chain's rule of a shard (shardRuleText): the family's match, the
// lookup of daddr . l4proto . dport in the shard's set, and the goto to
// its chain.
func shardRuleExprs(f ipFamily, n uint32, set *nftables.Set) []expr.Any {
	return append(lookupKeyExprs(f),
		&expr.Lookup{SourceRegister: reg1, SetName: set.Name, SetID: set.ID},
		&expr.Verdict{Kind: expr.VerdictGoto, Chain: shardChainName(f, n)})
}

// intervalMapRef returns the set object of the endpoint or shard map name
// of family f.
func intervalMapRef(t *nftables.Table, f ipFamily, name string) *nftables.Set {
	if isShardEndpointMap(name) {
		return shardMapRef(t, f, name)
	}
	return endpointMapRef(t, f, name)
}

// shardMapElement returns the kernel element of an endpoint of a shard
// map: its service port's key and its draw, with the endpoint and the
// comment unless del.
func shardMapElement(e endpointElement, comment string, del bool) (nftables.SetElement, error) {
	k, err := keyBytes(e.Shard)
	if err != nil {
		return nftables.SetElement{}, err
	}
	draw, _ := e.keys()
	el := nftables.SetElement{Key: binary.NativeEndian.AppendUint32(k, draw)}
	if !del {
		el.Val = binary.BigEndian.AppendUint16(e.Target.Addr().AsSlice(), e.Target.Port())
		el.Val = append(el.Val, 0, 0)
		el.Comment = comment
	}
	return el, nil
}

// exprs returns the expressions nft generates for the rule's text, in
// its order: the protocol's match, and the lookup of daddr
// . l4proto . dport . numgen random mod Mod in the shard map, then the
// DNAT to the address and port found.
func (r shardDnatRule) exprs(sets map[string]*nftables.Set) ([]expr.Any, error) {
	proto, ok := l4proto(r.Proto)
	if !ok {
		return nil, fmt.Errorf("protocol %d not supported", r.Proto)
	}
	fi, nl := r.Family.info(), r.Family.nl()
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{proto}},
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: fi.daddr, Len: fi.addrLen},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: nl.regL4},
		&expr.Payload{DestRegister: nl.regDport, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Numgen{Register: nl.regDport + 1, Modulus: r.Mod, Type: unix.NFT_NG_RANDOM},
		&expr.Lookup{SourceRegister: reg1, DestRegister: reg1, IsDestRegSet: true, SetName: r.Map, SetID: setID(sets, r.Map)},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(nl.nfproto), RegAddrMin: reg1, RegProtoMin: nl.regEndpointPort, Specified: true},
	}, nil
}
