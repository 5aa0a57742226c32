//go:build linux

package allip

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"

	"sigs.k8s.io/kpng/model"
)

// TableName is the name of kpng-allip's nftables tables (one in family ip,
// one in family ip6).
const TableName = "kpng-allip"

// The names of the base chains in each table.
const (
	PreroutingChain = "prerouting"
	OutputChain     = "output"
)

// nftFamily describes how one address family is matched and NATed.
type nftFamily struct {
	table   nftables.TableFamily
	nfproto uint32
	is6     bool
	// daddrOffset and addrLen locate the destination address in the
	// network header.
	daddrOffset, addrLen uint32
}

var nftFamilies = []nftFamily{
	{table: nftables.TableFamilyIPv4, nfproto: unix.NFPROTO_IPV4, is6: false, daddrOffset: 16, addrLen: 4},
	{table: nftables.TableFamilyIPv6, nfproto: unix.NFPROTO_IPV6, is6: true, daddrOffset: 24, addrLen: 16},
}

func (f nftFamily) tableRef() *nftables.Table {
	return &nftables.Table{Name: TableName, Family: f.table}
}

// exprs returns the expressions of "daddr External dnat to Target".
func (f nftFamily) exprs(r Rule) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: f.daddrOffset, Len: f.addrLen},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: r.External.AsSlice()},
		&expr.Immediate{Register: 1, Data: r.Target.AsSlice()},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: f.nfproto, RegAddrMin: 1},
	}
}

// userdataComment is the rule's comment: its service.
func userdataComment(r Rule) []byte {
	return userdata.AppendString(nil, userdata.TypeComment, r.Service.String())
}

// Apply makes the installed rules exactly rules, in one netlink
// transaction: for each family, the table is created if missing, deleted and,
// if the family has rules, created again with its chains and rules, all in
// the same batch. The kernel applies a batch atomically, so packets see
// either the old rules or the new ones, never an empty or half-built table;
// if any part fails, nothing changes. Apply(conn, nil) removes both tables.
// Rules that are invalid (see Rule) are refused before anything is sent.
func Apply(conn *nftables.Conn, rules []Rule) error {
	return apply(conn, rules, nil)
}

// apply is Apply with a hook called before the batch is sent (tests use it
// to make the batch fail).
func apply(conn *nftables.Conn, rules []Rule, beforeFlush func(*nftables.Conn)) error {
	for _, r := range rules {
		if err := r.validate(); err != nil {
			return fmt.Errorf("apply: %w", err)
		}
	}
	n := 0
	for _, f := range nftFamilies {
		t := f.tableRef()
		conn.AddTable(t) // so that the deletion cannot fail
		conn.DelTable(t)
		var mine []Rule
		for _, r := range rules {
			if r.External.Is6() == f.is6 {
				mine = append(mine, r)
			}
		}
		if len(mine) == 0 {
			continue
		}
		conn.AddTable(t)
		for _, c := range []struct {
			name string
			hook *nftables.ChainHook
		}{
			{PreroutingChain, nftables.ChainHookPrerouting},
			{OutputChain, nftables.ChainHookOutput},
		} {
			chain := conn.AddChain(&nftables.Chain{
				Name:     c.name,
				Table:    t,
				Type:     nftables.ChainTypeNAT,
				Hooknum:  c.hook,
				Priority: nftables.ChainPriorityNATDest,
			})
			for _, r := range mine {
				conn.AddRule(&nftables.Rule{
					Table:    t,
					Chain:    chain,
					Exprs:    f.exprs(r),
					UserData: userdataComment(r),
				})
				n++
			}
		}
	}
	if beforeFlush != nil {
		beforeFlush(conn)
	}
	if err := conn.Flush(); err != nil {
		return fmt.Errorf("nftables: replace the %s tables (%d rules): %w", TableName, n, err)
	}
	return nil
}

// Cleanup removes kpng-allip's tables, if present.
func Cleanup(conn *nftables.Conn) error {
	if err := Apply(conn, nil); err != nil {
		return fmt.Errorf("cleanup: %w", err)
	}
	return nil
}

// Current reads back the rules installed by Apply, from the prerouting
// chains, sorted as Rules sorts them. Missing tables mean no rules. A rule
// Apply would not have written is an error.
func Current(conn *nftables.Conn) ([]Rule, error) {
	var rules []Rule
	for _, f := range nftFamilies {
		tables, err := conn.ListTablesOfFamily(f.table)
		if err != nil {
			return nil, fmt.Errorf("nftables: list tables: %w", err)
		}
		found := false
		for _, t := range tables {
			found = found || t.Name == TableName
		}
		if !found {
			continue
		}
		t := f.tableRef()
		nrs, err := conn.GetRules(t, &nftables.Chain{Name: PreroutingChain, Table: t})
		if err != nil {
			return nil, fmt.Errorf("nftables: list the rules of %s: %w", tableText(t), err)
		}
		for _, nr := range nrs {
			r, err := decodeRule(f, nr)
			if err != nil {
				return nil, fmt.Errorf("nftables: %s: %w", tableText(t), err)
			}
			rules = append(rules, r)
		}
	}
	sortRules(rules)
	return rules, nil
}

func tableText(t *nftables.Table) string {
	fam := "ip"
	if t.Family == nftables.TableFamilyIPv6 {
		fam = "ip6"
	}
	return fmt.Sprintf("table %s %s", fam, t.Name)
}

// decodeRule is the inverse of nftFamily.exprs.
func decodeRule(f nftFamily, nr *nftables.Rule) (Rule, error) {
	var r Rule
	var haveNAT bool
	for _, e := range nr.Exprs {
		switch e := e.(type) {
		case *expr.Cmp:
			r.External, _ = netip.AddrFromSlice(e.Data)
		case *expr.Immediate:
			r.Target, _ = netip.AddrFromSlice(e.Data)
		case *expr.NAT:
			haveNAT = e.Type == expr.NATTypeDestNAT
		}
	}
	if comment, ok := userdata.GetString(nr.UserData, userdata.TypeComment); ok {
		ns, name, _ := strings.Cut(comment, "/")
		r.Service = model.ServiceKey{Namespace: ns, Name: name}
	}
	if err := r.validate(); err != nil || !haveNAT || r.External.Is6() != f.is6 {
		return Rule{}, fmt.Errorf("rule handle %d is not a kpng-allip rule", nr.Handle)
	}
	return r, nil
}
