// Package nodeflags binds the command-line flags of the node options that
// the backends share (--cluster-cidr, --nodeport-addresses, --node-ip,
// --masquerade-all, --masquerade-bit) and parses their values, so that
// every backend reads them the same way: each backend's BindFlags calls
// Bind with pointers to its own Options' fields. Not binds a boolean flag
// to a Config field that says the opposite (--monitor to NoMonitor).
package nodeflags

import (
	"flag"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// The flag names Bind registers.
const (
	ClusterCIDR       = "cluster-cidr"
	NodePortAddresses = "nodeport-addresses"
	NodeIP            = "node-ip"
	MasqueradeAll     = "masquerade-all"
	MasqueradeBit     = "masquerade-bit"
)

// The masquerade mark bits a backend accepts: kube-proxy's range
// (--iptables-masquerade-bit) but for bit 0, as 0 in a backend's Options
// means its default bit (14, kube-proxy's).
const (
	MinMasqueradeBit = 1
	MaxMasqueradeBit = 31
)

// DefaultMasqueradeBit is the mark bit asking for masquerading that the
// backends use when their Options leave it zero: kube-proxy's (14, mark
// 0x4000), so that both mean the same on a node running both.
const DefaultMasqueradeBit = 14

// Node points at the fields of a backend's options that the flags fill;
// a nil pointer registers no flag. The flags' defaults are the values the
// fields hold when Bind is called, but for a zero MasqueradeBit, which
// Bind sets to DefaultMasqueradeBit.
type Node struct {
	ClusterCIDRs      *[]netip.Prefix
	NodePortAddresses *[]netip.Prefix
	NodeIPs           *[]netip.Addr
	MasqueradeAll     *bool
	MasqueradeBit     *int
	// Usage replaces the help of the flags it names (ClusterCIDR, ...).
	Usage map[string]string
}

// defaultUsage is the help of each flag, as the rule-programming backends
// (nft, iptables) read it.
var defaultUsage = map[string]string{
	ClusterCIDR:       "comma-separated pod networks: traffic to cluster IPs from outside them is masqueraded",
	NodePortAddresses: "comma-separated CIDRs: serve node ports only on the local addresses inside them (default: every local address but 127.0.0.0/8 and ::1)",
	NodeIP:            "comma-separated addresses of the node: when a loadBalancerSourceRanges CIDR contains one, the load-balancer IPs are allowed as sources too (as kube-proxy)",
	MasqueradeAll:     "masquerade all traffic to cluster IPs",
	MasqueradeBit:     fmt.Sprintf("the packet mark bit (%d-%d) that asks for masquerading", MinMasqueradeBit, MaxMasqueradeBit),
}

// Bind registers on fs the flags of the fields n points at.
func (n Node) Bind(fs *flag.FlagSet) {
	usage := func(name string) string {
		if u, ok := n.Usage[name]; ok {
			return u
		}
		return defaultUsage[name]
	}
	if n.ClusterCIDRs != nil {
		fs.Func(ClusterCIDR, usage(ClusterCIDR), PrefixList(n.ClusterCIDRs))
	}
	if n.NodePortAddresses != nil {
		fs.Func(NodePortAddresses, usage(NodePortAddresses), PrefixList(n.NodePortAddresses))
	}
	if n.NodeIPs != nil {
		fs.Func(NodeIP, usage(NodeIP), AddrList(n.NodeIPs))
	}
	if n.MasqueradeAll != nil {
		fs.BoolVar(n.MasqueradeAll, MasqueradeAll, *n.MasqueradeAll, usage(MasqueradeAll))
	}
	if n.MasqueradeBit != nil {
		if *n.MasqueradeBit == 0 {
			*n.MasqueradeBit = DefaultMasqueradeBit
		}
		fs.Var(bitValue{n.MasqueradeBit}, MasqueradeBit, usage(MasqueradeBit))
	}
}

// bitValue is the flag.Value of --masquerade-bit: an int in the range the
// backends accept (0, which their Options take as the default bit, is
// refused: it is not a bit one can choose).
type bitValue struct{ p *int }

// String implements flag.Value.
func (b bitValue) String() string {
	if b.p == nil {
		return "0"
	}
	return strconv.Itoa(*b.p)
}

// Set implements flag.Value.
func (b bitValue) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		return fmt.Errorf("%q is not a number", s)
	}
	if err := checkBit(n); err != nil {
		return err
	}
	*b.p = n
	return nil
}

// checkBit reports a masquerade bit out of range.
func checkBit(bit int) error {
	if bit < MinMasqueradeBit || bit > MaxMasqueradeBit {
		return fmt.Errorf("must be between %d and %d", MinMasqueradeBit, MaxMasqueradeBit)
	}
	return nil
}

// CheckOptions reports the first of a backend's node options that cannot
// be used, naming its Options field: a masquerade bit out of 0-31 (0
// meaning the backend's default), a prefix of ClusterCIDRs or
// NodePortAddresses that is not a network address (host bits set, a
// zone, or an IPv4-mapped IPv6 prefix, which would never match an IPv4
// packet), or a NodeIPs address that is not valid. Each backend's
// Options.Validate calls it, so the backends refuse the same values.
func CheckOptions(clusterCIDRs, nodePortAddresses []netip.Prefix, nodeIPs []netip.Addr, masqueradeBit int) error {
	if masqueradeBit != 0 {
		if err := checkBit(masqueradeBit); err != nil {
			return fmt.Errorf("options: MasqueradeBit %d: %w (0: the default)", masqueradeBit, err)
		}
	}
	for _, set := range []struct {
		field string
		ps    []netip.Prefix
	}{{"ClusterCIDRs", clusterCIDRs}, {"NodePortAddresses", nodePortAddresses}} {
		for _, p := range set.ps {
			if !p.IsValid() || p != p.Masked() || p.Addr().Is4In6() || p.Addr().Zone() != "" {
				return fmt.Errorf("options: %s: prefix %s: not a valid network address", set.field, p)
			}
		}
	}
	for _, a := range nodeIPs {
		if !a.IsValid() || a.Zone() != "" {
			return fmt.Errorf("options: NodeIPs: %q: not a valid address", a)
		}
	}
	return nil
}

// PrefixList returns a flag.Func parser of a comma-separated list of CIDRs
// into dst (replacing what it held); a CIDR with host bits set is refused,
// as it is most likely a mistake.
func PrefixList(dst *[]netip.Prefix) func(string) error {
	return func(list string) error {
		*dst = nil
		for _, s := range splitList(list) {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				return fmt.Errorf("%q is not a CIDR", s)
			}
			if p != p.Masked() {
				return fmt.Errorf("%q has host bits set (did you mean %s?)", s, p.Masked())
			}
			*dst = append(*dst, p)
		}
		return nil
	}
}

// AddrList returns a flag.Func parser of a comma-separated list of IP
// addresses into dst (replacing what it held); IPv4-mapped IPv6 addresses
// are taken as IPv4 ones, addresses with a zone are refused.
func AddrList(dst *[]netip.Addr) func(string) error {
	return func(list string) error {
		*dst = nil
		for _, s := range splitList(list) {
			a, err := netip.ParseAddr(s)
			if err != nil || a.Zone() != "" {
				return fmt.Errorf("%q is not an IP address", s)
			}
			*dst = append(*dst, a.Unmap())
		}
		return nil
	}
}

// splitList returns the non-empty items of a comma-separated list.
func splitList(list string) []string {
	var out []string
	for _, s := range strings.Split(list, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// Not returns a boolean flag.Value that stores the opposite of its value
// in *p: a flag --x whose default is true for a Config field NoX that is
// false by default (--monitor=false sets NoMonitor).
func Not(p *bool) flag.Value { return notValue{p} }

// notValue is the flag.Value of Not.
type notValue struct{ p *bool }

// String implements flag.Value.
func (n notValue) String() string {
	if n.p == nil {
		return "true"
	}
	return strconv.FormatBool(!*n.p)
}

// Set implements flag.Value.
func (n notValue) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return err
	}
	*n.p = !v
	return nil
}

// IsBoolFlag makes --x mean --x=true.
func (n notValue) IsBoolFlag() bool { return true }
