package nft

import (
	"encoding/binary"

	"github.com/google/nftables/userdata"
)

// This file writes the user data nft keeps in a set to declare its key
// and data with typeof: the kernel knows a key only by a type number and
// a length, and nft has no type name for a plain integer, so a map keyed
// by a random number (numgen) is listed as "type 0 : …" and cannot be
// loaded back, unless its user data says which expression the key is. nft
// writes it for `typeof numgen random mod N : ip daddr . th dport` and
// reads it when it lists the set; google/nftables (v0.3.0) writes only a
// key byte order and a comment, so kpng adds the rest to the message
// itself (relay.go).
//
// The layout is nft's (src/mnl.c, src/expression.c, src/numgen.c,
// src/payload.c in nftables 1.0.6): TLVs of libnftnl's user data (one byte
// of type, one of length, the value; numbers 32-bit in host byte order),
// nested for expressions. The numbers below are those nft writes and
// persists in every set it creates; TestKernelListingReloads checks that
// the bytes are the ones nft writes for the same declaration.

// Set user data types (libnftnl's enum nftnl_udata_set_types).
const (
	udataSetKeyByteorder  = userdata.NFTNL_UDATA_SET_KEYBYTEORDER
	udataSetDataByteorder = userdata.NFTNL_UDATA_SET_DATABYTEORDER
	udataSetKeyTypeof     = userdata.NFTNL_UDATA_SET_KEY_TYPEOF
	udataSetDataTypeof    = userdata.NFTNL_UDATA_SET_DATA_TYPEOF
	udataSetDataInterval  = userdata.NFTNL_UDATA_SET_DATA_INTERVAL
)

// The TLVs of a typeof expression: its kind (nft's enum expr_types) and
// its data, whose TLVs depend on the kind.
const (
	udataTypeofExpr userdata.Type = 0 // NFTNL_UDATA_SET_TYPEOF_EXPR
	udataTypeofData userdata.Type = 1 // NFTNL_UDATA_SET_TYPEOF_DATA

	// In a concatenation's data, the i-th TLV holds its i-th expression:
	// a kind and the expression's data.
	udataConcatSubType userdata.Type = 0 // NFTNL_UDATA_SET_KEY_CONCAT_SUB_TYPE
	udataConcatSubData userdata.Type = 1 // NFTNL_UDATA_SET_KEY_CONCAT_SUB_DATA

	// A numgen expression's data.
	udataNumgenType   userdata.Type = 0 // NFTNL_UDATA_NUMGEN_TYPE
	udataNumgenMod    userdata.Type = 1 // NFTNL_UDATA_NUMGEN_MOD
	udataNumgenOffset userdata.Type = 2 // NFTNL_UDATA_NUMGEN_OFFSET

	// A meta expression's data: its key.
	udataMetaKey userdata.Type = 0 // NFTNL_UDATA_META_KEY

	// A payload expression's data: its protocol and field.
	udataPayloadDesc userdata.Type = 0 // NFTNL_UDATA_SET_KEY_PAYLOAD_DESC
	udataPayloadType userdata.Type = 1 // NFTNL_UDATA_SET_KEY_PAYLOAD_TYPE
)

// nft's expression kinds (enum expr_types).
const (
	exprVerdict = 1
	exprPayload = 7
	exprMeta    = 9
	exprConcat  = 13
	exprNumgen  = 23
)

// nft's protocols (enum proto_desc_id) and fields (enum ip_hdr_fields,
// ip6_hdr_fields, th_hdr_fields) of payload expressions.
const (
	protoDescTH  = 11
	protoDescIP  = 12
	protoDescIP6 = 13
	ipHdrDaddr   = 12
	ip6HdrDaddr  = 9
	thHdrDport   = 2
)

// Byte orders (nft's enum byteorder): a numgen key is in host byte order
// (nft converts it to network byte order to look it up in an interval
// map); a concatenation or a verdict has none.
const (
	byteorderInvalid = 0
	byteorderHost    = 1
)

// metaL4proto is NFT_META_L4PROTO.
const metaL4proto = 16

// numgenRandom is NFT_NG_RANDOM.
const numgenRandom = 1

// endpointDataTypeof is the data of an endpoint map as nft writes it
// with typeof: "ip daddr . th dport" (an address and a port).
func endpointDataTypeof(f ipFamily) string { return daddrText(f) + " . th dport" }

// endpointMapUserData is the user data of an endpoint map of family f:
// `typeof numgen random mod 10000000 : ip daddr . th dport`.
func endpointMapUserData(f ipFamily) []byte {
	return setUserData(numgenUserData(blockRange), typeofUserData(exprConcat, endpointDataUserData(f)))
}

// daddrUserData is the data of the payload expression `ip daddr` (`ip6
// daddr` for IPv6).
func daddrUserData(f ipFamily) []byte {
	if f == ipv6 {
		return payloadUserData(protoDescIP6, ip6HdrDaddr)
	}
	return payloadUserData(protoDescIP, ipHdrDaddr)
}

// endpointDataUserData is the data of the concatenation `ip daddr . th
// dport`, what an endpoint or shard map leads to.
func endpointDataUserData(f ipFamily) []byte {
	return concatUserData(daddrUserData(f), payloadUserData(protoDescTH, thHdrDport))
}

// shardMapUserData is the user data of the map of shard n of family f:
// `typeof ip daddr . meta l4proto . th dport . numgen random mod n : ip
// daddr . th dport` (nft writes the same for an interval map but for its
// flags, which are not user data).
func shardMapUserData(f ipFamily, n uint32) []byte {
	key := concatOf(
		subExpr{exprPayload, daddrUserData(f)},
		subExpr{exprMeta, appendU32(nil, udataMetaKey, metaL4proto)},
		subExpr{exprPayload, payloadUserData(protoDescTH, thHdrDport)},
		subExpr{exprNumgen, numgenData(n)})
	b := appendU32(nil, udataSetKeyByteorder, byteorderInvalid)
	b = appendU32(b, udataSetDataByteorder, byteorderInvalid)
	b = userdata.Append(b, udataSetKeyTypeof, typeofUserData(exprConcat, key))
	b = userdata.Append(b, udataSetDataTypeof, typeofUserData(exprConcat, endpointDataUserData(f)))
	return appendU32(b, udataSetDataInterval, 0)
}

// balanceMapUserData is the user data of a balance map of n targets:
// `typeof numgen random mod n : verdict`.
func balanceMapUserData(n int) []byte {
	return setUserData(numgenUserData(uint32(n)), typeofUserData(exprVerdict, nil))
}

// setUserData is the user data of a map whose key is a numgen
// expression (key) and whose data is described by data, in nft's order.
func setUserData(key, data []byte) []byte {
	b := appendU32(nil, udataSetKeyByteorder, byteorderHost)
	b = appendU32(b, udataSetDataByteorder, byteorderInvalid)
	b = userdata.Append(b, udataSetKeyTypeof, key)
	b = userdata.Append(b, udataSetDataTypeof, data)
	return appendU32(b, udataSetDataInterval, 0)
}

// numgenUserData describes `numgen random mod mod` as a typeof key.
func numgenUserData(mod uint32) []byte {
	return typeofUserData(exprNumgen, numgenData(mod))
}

// numgenData is the data of the expression `numgen random mod mod`.
func numgenData(mod uint32) []byte {
	d := appendU32(nil, udataNumgenType, numgenRandom)
	d = appendU32(d, udataNumgenMod, mod)
	return appendU32(d, udataNumgenOffset, 0)
}

// typeofUserData describes an expression of kind kind with its data.
func typeofUserData(kind uint32, data []byte) []byte {
	return userdata.Append(appendU32(nil, udataTypeofExpr, kind), udataTypeofData, data)
}

// payloadUserData is the data of the payload expression of field of
// protocol desc.
func payloadUserData(desc, field uint32) []byte {
	return appendU32(appendU32(nil, udataPayloadDesc, desc), udataPayloadType, field)
}

// concatUserData is the data of a concatenation of payload expressions
// (their data given).
func concatUserData(payloads ...[]byte) []byte {
	subs := make([]subExpr, len(payloads))
	for i, p := range payloads {
		subs[i] = subExpr{exprPayload, p}
	}
	return concatOf(subs...)
}

// subExpr is an expression of a concatenation: its kind and data.
type subExpr struct {
	kind uint32
	data []byte
}

// concatOf is the data of a concatenation of the expressions subs.
func concatOf(subs ...subExpr) []byte {
	var b []byte
	for i, s := range subs {
		sub := userdata.Append(appendU32(nil, udataConcatSubType, s.kind), udataConcatSubData, s.data)
		b = userdata.Append(b, userdata.Type(i), sub)
	}
	return b
}

// appendU32 appends the TLV typ holding v as nft writes numbers: 32 bits
// in host byte order.
func appendU32(b []byte, typ userdata.Type, v uint32) []byte {
	return userdata.Append(b, typ, binary.NativeEndian.AppendUint32(nil, v))
}
