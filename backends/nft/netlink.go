//go:build linux

package nft

import (
	"encoding/binary"
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Registers: the 16-byte register 1 and the 32-bit registers (NFT_REG32_xx)
// that concatenated lookup keys use, as nft itself allocates them.
const (
	reg1       = 1
	reg32v4L4  = 9  // NFT_REG32_01: after a 4-byte IPv4 address
	reg32v4Dp  = 10 // NFT_REG32_02
	reg32v6L4  = 12 // NFT_REG32_04: after a 16-byte IPv6 address
	reg32v6Dp  = 13 // NFT_REG32_05
	regVerdict = 0
)

// mapKeyType returns the key type of the service maps of a family.
func mapKeyType(f Family) nftables.SetDatatype {
	addr := nftables.TypeIPAddr
	if f == IPv6 {
		addr = nftables.TypeIP6Addr
	}
	return nftables.MustConcatSetType(addr, nftables.TypeInetProto, nftables.TypeInetService)
}

// mapRef returns the set object of one of the table's verdict maps.
func mapRef(t *nftables.Table, f Family, name string) *nftables.Set {
	return &nftables.Set{
		Table:         t,
		Name:          name,
		IsMap:         true,
		Concatenation: true,
		KeyType:       mapKeyType(f),
		DataType:      nftables.TypeVerdict,
	}
}

// keyBytes encodes a map key as the kernel stores concatenations: each
// field padded to 4 bytes, in network byte order.
func keyBytes(k Key) ([]byte, error) {
	proto, ok := l4proto(k.Proto)
	if !ok {
		return nil, fmt.Errorf("protocol %d not supported", k.Proto)
	}
	b := k.Addr.AsSlice()
	b = append(b, proto, 0, 0, 0)
	b = binary.BigEndian.AppendUint16(b, k.Port)
	return append(b, 0, 0), nil
}

// verdictExpr returns the verdict of a map element.
func verdictExpr(v Verdict) *expr.Verdict {
	if v.Goto == "" {
		return &expr.Verdict{Kind: expr.VerdictDrop}
	}
	return &expr.Verdict{Kind: expr.VerdictGoto, Chain: v.Goto}
}

// lookupExprs returns the expressions of
// "ip[6] daddr . meta l4proto . th dport vmap @m".
func lookupExprs(f Family, m *nftables.Set) []expr.Any {
	nfproto, off, alen, rl4, rdp := byte(unix.NFPROTO_IPV4), uint32(16), uint32(4), uint32(reg32v4L4), uint32(reg32v4Dp)
	if f == IPv6 {
		nfproto, off, alen, rl4, rdp = unix.NFPROTO_IPV6, 24, 16, reg32v6L4, reg32v6Dp
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{nfproto}},
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: alen},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: rl4},
		&expr.Payload{DestRegister: rdp, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: reg1, DestRegister: regVerdict, IsDestRegSet: true, SetName: m.Name, SetID: m.ID},
	}
}

// rejectRules returns the rules of the reject chain.
func rejectRules() [][]expr.Any {
	return [][]expr.Any{
		{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{unix.IPPROTO_TCP}},
			&expr.Reject{Type: unix.NFT_REJECT_TCP_RST},
		},
		{&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_PORT_UNREACH}},
	}
}

// dnatExprs returns the expressions of a DNATRule.
func dnatExprs(r DNATRule) ([]expr.Any, error) {
	proto, ok := l4proto(r.Proto)
	if !ok {
		return nil, fmt.Errorf("protocol %d not supported", r.Proto)
	}
	fam := uint32(unix.NFPROTO_IPV4)
	if r.To.Addr().Is6() {
		fam = unix.NFPROTO_IPV6
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{proto}},
		&expr.Immediate{Register: 1, Data: r.To.Addr().AsSlice()},
		&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(r.To.Port())},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: fam, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	}, nil
}

// balanceExprs returns the expressions of a BalanceRule, adding to conn
// the anonymous verdict map it needs (in the same batch as the rule).
func balanceExprs(conn *nftables.Conn, t *nftables.Table, r BalanceRule) ([]expr.Any, error) {
	switch len(r.Targets) {
	case 0:
		return nil, fmt.Errorf("balance rule without targets")
	case 1:
		return []expr.Any{&expr.Verdict{Kind: expr.VerdictGoto, Chain: r.Targets[0]}}, nil
	}
	m := &nftables.Set{
		Table:     t,
		Anonymous: true,
		Constant:  true,
		IsMap:     true,
		KeyType:   nftables.TypeInteger,
		DataType:  nftables.TypeVerdict,
	}
	els := make([]nftables.SetElement, len(r.Targets))
	for i, target := range r.Targets {
		// numgen writes its result in host byte order.
		els[i] = nftables.SetElement{
			Key:         binaryutil.NativeEndian.PutUint32(uint32(i)),
			VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: target},
		}
	}
	if err := conn.AddSet(m, els); err != nil {
		return nil, fmt.Errorf("anonymous map of %d endpoints: %w", len(r.Targets), err)
	}
	return []expr.Any{
		&expr.Numgen{Register: reg1, Modulus: uint32(len(r.Targets)), Type: unix.NFT_NG_RANDOM},
		&expr.Lookup{SourceRegister: reg1, DestRegister: regVerdict, IsDestRegSet: true, SetName: m.Name, SetID: m.ID},
	}, nil
}
