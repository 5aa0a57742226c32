//go:build linux

package conformance_test

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"sigs.k8s.io/kpng/backends/conformance"
	"sigs.k8s.io/kpng/backends/conntrack"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
	"sigs.k8s.io/kpng/model/endpoints"
)

// tiny is a minimal nftables proxier, as an outside author might start
// one: cluster IPs only, DNAT to an endpoint chosen at random, the whole
// table rewritten in one transaction on each Sync. It exists to run the
// kit against backends that break one duty each (TestKitCanFail); what it
// does not do at all it declares unsupported or is not asked.
type tiny struct {
	netns string // the node's namespace (its bind mount)
	// ignoreReadiness sends to every endpoint, ready or not.
	ignoreReadiness bool
	// keepFlows never deletes the conntrack entries of removed
	// endpoints.
	keepFlows bool

	services map[model.ServiceKey]*model.ServiceEndpoints
	// udp are the endpoints each UDP service address and port was sent
	// to by the last applied table.
	udp map[netip.AddrPort][]netip.AddrPort
}

// startTiny returns a conformance Start building a tiny with the options
// of proto.
func startTiny(proto tiny) func(t testing.TB, node conformance.Node) (localsink.Sink, error) {
	return func(t testing.TB, node conformance.Node) (localsink.Sink, error) {
		s := proto
		s.netns = node.NetNS
		s.services = map[model.ServiceKey]*model.ServiceEndpoints{}
		return &s, nil
	}
}

// Reset implements localsink.Sink.
func (s *tiny) Reset() { clear(s.services) }

// Update implements localsink.Sink.
func (s *tiny) Update(key model.ServiceKey, _, cur *model.ServiceEndpoints) {
	if cur == nil {
		delete(s.services, key)
		return
	}
	s.services[key] = cur
}

// Sync implements localsink.Sink: the whole table, then the stale flows.
func (s *tiny) Sync() error {
	f, err := os.Open(s.netns)
	if err != nil {
		return err
	}
	defer f.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		return err
	}
	udp := s.program(c)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("program table: %w", err)
	}
	if !s.keepFlows {
		if _, err := conntrack.DeleteFlows(conntrack.InNetNS(s.netns), staleFlows(s.udp, udp)); err != nil {
			return err
		}
	}
	s.udp = udp
	return nil
}

// staleFlows returns the flows to delete when the UDP service addresses
// went from before to after: one per address and endpoint it lost.
func staleFlows(before, after map[netip.AddrPort][]netip.AddrPort) []conntrack.Flow {
	var flows []conntrack.Flow
	for dst, eps := range before {
		for _, ep := range eps {
			if !slices.Contains(after[dst], ep) {
				flows = append(flows, conntrack.Flow{IPv6: dst.Addr().Is6(), Proto: unix.IPPROTO_UDP, Dst: dst, Endpoint: ep})
			}
		}
	}
	return flows
}

// program queues the table for the current state on c and returns, per
// UDP service address and port, its endpoints.
func (s *tiny) program(c *nftables.Conn) map[netip.AddrPort][]netip.AddrPort {
	table := &nftables.Table{Family: nftables.TableFamilyINet, Name: "kittiny"}
	c.AddTable(table)
	c.DelTable(table)
	c.AddTable(table)
	var chains []*nftables.Chain
	for _, hook := range []*nftables.ChainHook{nftables.ChainHookPrerouting, nftables.ChainHookOutput} {
		chains = append(chains, c.AddChain(&nftables.Chain{Name: fmt.Sprintf("hook%d", *hook), Table: table,
			Type: nftables.ChainTypeNAT, Hooknum: hook, Priority: nftables.ChainPriorityNATDest}))
	}
	udp := map[netip.AddrPort][]netip.AddrPort{}
	for _, se := range s.services {
		for _, p := range se.Service.Ports {
			if p.Protocol != model.TCP && p.Protocol != model.UDP {
				continue
			}
			eps := se.Endpoints
			if !s.ignoreReadiness {
				eps, _ = endpoints.CategorizePort(p, se.Endpoints).Internal(se.Service)
			}
			for _, ip := range se.Service.IPs.ClusterIPs.All() {
				dst := netip.AddrPortFrom(netip.MustParseAddr(ip), uint16(p.Port))
				var targets []netip.AddrPort
				for _, e := range eps {
					port, ok := e.PortFor(p)
					a, err := netip.ParseAddr(e.IPs.All()[0])
					if ok && err == nil && a.Is4() == dst.Addr().Is4() {
						targets = append(targets, netip.AddrPortFrom(a, uint16(port)))
					}
				}
				if p.Protocol == model.UDP {
					udp[dst] = targets
				}
				// Endpoint i of n is chosen with probability 1/(n−i)
				// among those left: each with 1/n.
				for i, tgt := range targets {
					for _, ch := range chains {
						c.AddRule(&nftables.Rule{Table: table, Chain: ch, Exprs: dnat(p.Protocol, dst, tgt, len(targets)-i)})
					}
				}
			}
		}
	}
	return udp
}

// dnat returns a rule DNATing proto traffic to dst to tgt, if a random
// number modulo mod is 0.
func dnat(proto model.Protocol, dst, tgt netip.AddrPort, mod int) []expr.Any {
	family, l4, offset := byte(unix.NFPROTO_IPV4), byte(unix.IPPROTO_TCP), uint32(16) // IPv4 destination
	if dst.Addr().Is6() {
		family, offset = unix.NFPROTO_IPV6, 24
	}
	if proto == model.UDP {
		l4 = unix.IPPROTO_UDP
	}
	be16 := func(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{family}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: uint32(dst.Addr().BitLen() / 8)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: dst.Addr().AsSlice()},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{l4}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: be16(dst.Port())},
		&expr.Numgen{Register: 1, Modulus: uint32(mod), Type: unix.NFT_NG_RANDOM},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: make([]byte, 4)},
		&expr.Immediate{Register: 1, Data: tgt.Addr().AsSlice()},
		&expr.Immediate{Register: 2, Data: be16(tgt.Port())},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(family), RegAddrMin: 1, RegProtoMin: 2, Specified: true},
	}
}
