//go:build linux

package nft

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"reflect"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	vnetlink "github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"sigs.k8s.io/kpng/model"
)

// kernelTable is a table as the kernel holds it, read back over netlink
// and put in a form that does not depend on history: what two sinks
// programming the same state must agree on whatever the rounds that led
// there. The capacity of the hairpin and cluster-ips sets is set at the
// last full write: only its room for the elements is compared.
// Endpoint-map slots (which block a service port got, in which
// endpoint map) depend on history: each rule drawing from an endpoint map
// shows the intervals of its slot instead, and the endpoint maps
// themselves show only their declaration and the intervals no rule uses
// (there must be none). Everything else is compared as the kernel lists
// it: chain declarations, every rule's expressions in order (rule handles
// aside), set and map declarations (handles and IDs aside) and elements.
type kernelTable struct {
	// Chains are the chains by name: declaration, then the rules.
	Chains map[string][]string
	// Sets are the sets and maps but the endpoint maps, by name:
	// declaration, then the elements, sorted.
	Sets map[string][]string
	// EndpointMaps are the distinct declarations of the endpoint maps.
	EndpointMaps []string
	// Unused are the endpoint-map intervals that no rule draws from.
	Unused []string
}

// readKernelTable reads the tables named table (ip and ip6) over conn;
// nil when there is neither. Chains are named with their table's family
// ("ip services"), sets and maps by their names (each family's have its
// suffix).
func readKernelTable(conn *nftables.Conn, table string) (*kernelTable, error) {
	kt := &kernelTable{Chains: map[string][]string{}, Sets: map[string][]string{}}
	found := false
	for _, f := range []ipFamily{ipv4, ipv6} {
		ok, err := readFamilyTable(conn, f, table, kt)
		if err != nil {
			return nil, err
		}
		found = found || ok
	}
	if !found {
		return nil, nil
	}
	sort.Strings(kt.EndpointMaps)
	sort.Strings(kt.Unused)
	return kt, nil
}

// readFamilyTable reads family f's table named table into kt, and
// reports whether there is one.
func readFamilyTable(conn *nftables.Conn, f ipFamily, table string, kt *kernelTable) (bool, error) {
	tables, err := conn.ListTablesOfFamily(f.nl().table)
	if err != nil {
		return false, fmt.Errorf("list tables: %w", err)
	}
	var t *nftables.Table
	for _, tt := range tables {
		if tt.Name == table {
			t = tt
		}
	}
	if t == nil {
		return false, nil
	}

	// Endpoint maps first: the rules drawing from them show their slot's
	// intervals.
	sets, err := conn.GetSets(t)
	if err != nil {
		return false, fmt.Errorf("list sets of %s: %w", table, err)
	}
	slotsOf := map[string]map[uint32][]string{} // endpoint map → slot → intervals
	for _, s := range sets {
		els, err := conn.GetSetElements(s)
		if err != nil {
			return false, fmt.Errorf("list elements of %s: %w", s.Name, err)
		}
		decl := setDecl(s)
		if strings.HasPrefix(s.Name, "endpoints-v") {
			if !slices.Contains(kt.EndpointMaps, decl) {
				kt.EndpointMaps = append(kt.EndpointMaps, decl)
			}
			bySlot, err := endpointIntervals(s, els)
			if err != nil {
				return false, fmt.Errorf("endpoint map %s: %w", s.Name, err)
			}
			slotsOf[s.Name] = bySlot
			continue
		}
		lines := make([]string, 0, len(els))
		for _, e := range els {
			lines = append(lines, elementText(e))
		}
		// A hash set's dump may list an element twice when the kernel
		// resizes the table during the walk (found by the 10,000-round
		// convergence run, in a map filled the moment before): a set
		// never holds two elements with one key, so duplicates are the
		// walk's.
		sort.Strings(lines)
		lines = slices.Compact(lines)
		if strings.HasPrefix(s.Name, "hairpin-v") || strings.HasPrefix(s.Name, "cluster-ips-v") {
			// A sized set's capacity is chosen at the last full write
			// (capacity.go): history. What must hold is that it has
			// one, and room for what it holds.
			room := "has room"
			if s.Size == 0 || int(s.Size) < len(lines) {
				room = fmt.Sprintf("has no room: size %d for %d elements", s.Size, len(lines))
			}
			sized := *s
			sized.Size = 0
			decl = setDecl(&sized) + " " + room
		}
		kt.Sets[s.Name] = append([]string{decl}, lines...)
	}
	chains, err := conn.ListChainsOfTableFamily(f.nl().table)
	if err != nil {
		return false, fmt.Errorf("list chains: %w", err)
	}
	used := map[string]map[uint32]bool{}
	for _, c := range chains {
		if c.Table.Name != table {
			continue
		}
		rules, err := conn.GetRules(t, c)
		if err != nil {
			return false, fmt.Errorf("list rules of chain %s: %w", c.Name, err)
		}
		lines := []string{chainDecl(c)}
		for _, r := range rules {
			text, m, slot := ruleText(r.Exprs)
			if m != "" {
				intervals, ok := slotsOf[m][slot]
				if !ok {
					text += fmt.Sprintf(" [slot %d of %s: no intervals]", slot, m)
				} else {
					text += " [" + strings.Join(intervals, ", ") + "]"
				}
				if used[m] == nil {
					used[m] = map[uint32]bool{}
				}
				used[m][slot] = true
			}
			lines = append(lines, text)
		}
		kt.Chains[f.info().nft+" "+c.Name] = lines
	}
	for m, bySlot := range slotsOf {
		for slot, intervals := range bySlot {
			if !used[m][slot] {
				kt.Unused = append(kt.Unused, fmt.Sprintf("%s slot %d: %s", m, slot, strings.Join(intervals, ", ")))
			}
		}
	}
	return true, nil
}

// chainDecl is a chain's declaration: base chains with their type, hook,
// priority and policy.
func chainDecl(c *nftables.Chain) string {
	if c.Hooknum == nil {
		return "regular"
	}
	policy := "none"
	if c.Policy != nil {
		policy = fmt.Sprint(*c.Policy)
	}
	prio := "none"
	if c.Priority != nil {
		prio = fmt.Sprint(*c.Priority)
	}
	return fmt.Sprintf("type %s hook %d priority %s policy %s", c.Type, *c.Hooknum, prio, policy)
}

// setDecl is a set's declaration: its kind, types, flags and timeout.
func setDecl(s *nftables.Set) string {
	return fmt.Sprintf("map=%v interval=%v constant=%v dynamic=%v timeout=%v/%v concat=%v key=%s/%d data=%s/%d size=%d",
		s.IsMap, s.Interval, s.Constant, s.Dynamic, s.HasTimeout, s.Timeout, s.Concatenation,
		s.KeyType.Name, s.KeyType.Bytes, s.DataType.Name, s.DataType.Bytes, s.Size)
}

// elementText is an element of a set or map but an endpoint map.
func elementText(e nftables.SetElement) string {
	s := fmt.Sprintf("%x", e.Key)
	if len(e.KeyEnd) > 0 {
		s += fmt.Sprintf("-%x", e.KeyEnd)
	}
	if e.IntervalEnd {
		s += " (end)"
	}
	if len(e.Val) > 0 {
		s += " : " + valueText(e.Val)
	}
	if e.VerdictData != nil {
		s += fmt.Sprintf(" : %s", exprText(e.VerdictData))
	}
	if e.Comment != "" {
		s += fmt.Sprintf(" comment %q", e.Comment)
	}
	return s
}

// valueText is the value of a map element: a verdict (which the library
// leaves as its netlink attributes) as "verdict <code> <chain>", else
// hexadecimal.
func valueText(val []byte) string {
	ad, err := netlink.NewAttributeDecoder(val)
	if err != nil {
		return fmt.Sprintf("%x", val)
	}
	var code int32
	var chain string
	for ad.Next() {
		switch ad.Type() {
		case unix.NFTA_VERDICT_CODE:
			ad.ByteOrder = binary.BigEndian
			code = int32(ad.Uint32())
		case unix.NFTA_VERDICT_CHAIN:
			chain = ad.String()
		default:
			return fmt.Sprintf("%x", val)
		}
	}
	if ad.Err() != nil {
		return fmt.Sprintf("%x", val)
	}
	return fmt.Sprintf("verdict %d %s", code, chain)
}

// endpointIntervals returns the intervals of an endpoint map by block
// (the block's number in the map, its first key / blockRange):
// "[from,to)→address:port \"comment\"", in order, from and to counted
// from the block's first key. Each interval is a start element (with the
// endpoint and the comment) and the end element (the key after its last)
// that the next start or end follows.
func endpointIntervals(s *nftables.Set, els []nftables.SetElement) (map[uint32][]string, error) {
	// By key, and for one key the end of an interval before the start of
	// the next.
	slices.SortFunc(els, func(a, b nftables.SetElement) int {
		if c := bytes.Compare(a.Key, b.Key); c != 0 {
			return c
		}
		switch {
		case a.IntervalEnd && !b.IntervalEnd:
			return -1
		case !a.IntervalEnd && b.IntervalEnd:
			return 1
		}
		return 0
	})
	out := map[uint32][]string{}
	for i, e := range els {
		if e.IntervalEnd {
			continue
		}
		if len(e.Key) != 4 || i+1 >= len(els) || len(els[i+1].Key) != 4 {
			return nil, fmt.Errorf("element %x: not the start of an interval with an end", e.Key)
		}
		from, end := binary.BigEndian.Uint32(e.Key), binary.BigEndian.Uint32(els[i+1].Key)
		block := from / blockRange
		if end <= from || end > (block+1)*blockRange {
			return nil, fmt.Errorf("interval from %d ends at %d, in another block", from, end)
		}
		to := fmt.Sprint(end - block*blockRange)
		if !els[i+1].IntervalEnd {
			to += " (next start)"
		}
		target, err := endpointTarget(s, e.Val)
		if err != nil {
			return nil, fmt.Errorf("element %x: %w", e.Key, err)
		}
		out[block] = append(out[block], fmt.Sprintf("[%d,%s)→%s %q", from-block*blockRange, to, target, e.Comment))
	}
	return out, nil
}

// endpointTarget decodes an endpoint map's value: address . port (each
// padded to 4 bytes).
func endpointTarget(s *nftables.Set, val []byte) (string, error) {
	switch {
	case strings.HasPrefix(s.Name, "endpoints-v4") && len(val) == 8:
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(val[:4])), binary.BigEndian.Uint16(val[4:6])).String(), nil
	case strings.HasPrefix(s.Name, "endpoints-v6") && len(val) == 20:
		return netip.AddrPortFrom(netip.AddrFrom16([16]byte(val[:16])), binary.BigEndian.Uint16(val[16:18])).String(), nil
	}
	return "", fmt.Errorf("value %x is not an endpoint", val)
}

// ruleText is a rule's expressions in order; for a rule drawing from an
// endpoint map, m is the map and block the block it draws from (its
// numgen's offset / blockRange), which the text leaves out.
func ruleText(exprs []expr.Any) (text, m string, block uint32) {
	for _, e := range exprs {
		if l, ok := e.(*expr.Lookup); ok && strings.HasPrefix(l.SetName, "endpoints-v") {
			m = l.SetName
		}
	}
	parts := make([]string, 0, len(exprs))
	for _, e := range exprs {
		switch v := e.(type) {
		case *expr.Numgen:
			if m != "" {
				block = v.Offset / blockRange
				c := *v
				c.Offset = 0
				parts = append(parts, exprText(&c)+" offset of the block")
				continue
			}
		case *expr.Lookup:
			if v.SetName == m && m != "" {
				c := *v
				c.SetName, c.SetID = "endpoints", 0
				parts = append(parts, exprText(&c))
				continue
			}
			c := *v
			c.SetID = 0 // a transaction's own number, not listed back
			parts = append(parts, exprText(&c))
			continue
		case *expr.Dynset:
			c := *v
			c.SetID = 0
			parts = append(parts, exprText(&c))
			continue
		}
		parts = append(parts, exprText(e))
	}
	return strings.Join(parts, "; "), m, block
}

// exprText writes an expression with its type and every field, following
// pointers and nested expressions.
func exprText(e any) string {
	var b strings.Builder
	writeValue(&b, reflect.ValueOf(e))
	return b.String()
}

func writeValue(b *strings.Builder, v reflect.Value) {
	switch v.Kind() {
	case reflect.Invalid:
		b.WriteString("nil")
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			b.WriteString("nil")
			return
		}
		writeValue(b, v.Elem())
	case reflect.Struct:
		b.WriteString(v.Type().Name() + "{")
		first := true
		for i := range v.NumField() {
			f := v.Type().Field(i)
			if !f.IsExported() || v.Field(i).IsZero() {
				continue
			}
			if !first {
				b.WriteString(" ")
			}
			first = false
			b.WriteString(f.Name + ":")
			writeValue(b, v.Field(i))
		}
		b.WriteString("}")
	case reflect.Slice, reflect.Array:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			fmt.Fprintf(b, "%x", v.Bytes())
			return
		}
		b.WriteString("[")
		for i := range v.Len() {
			if i > 0 {
				b.WriteString(" ")
			}
			writeValue(b, v.Index(i))
		}
		b.WriteString("]")
	default:
		fmt.Fprint(b, v.Interface())
	}
}

// freshNetNS creates a network namespace that only the returned file
// descriptor holds (no name, no bind mount: cheaper than netns.New when a
// test needs thousands); closing the descriptor releases it.
func freshNetNS(tb testing.TB) int {
	tb.Helper()
	type result struct {
		fd  int
		err error
	}
	done := make(chan result, 1)
	go func() {
		// The thread enters the new namespace and is never unlocked: the
		// runtime ends it with this goroutine.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			done <- result{err: fmt.Errorf("unshare: %w", err)}
			return
		}
		fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		done <- result{fd, err}
	}()
	r := <-done
	if r.err != nil {
		tb.Fatalf("new network namespace: %v", r.err)
	}
	return r.fd
}

// freshKernelTable programs items as a new sink's first Sync does (a new
// tracker, its whole ruleset in one transaction: applier.Full) in a new
// network namespace, and reads its table back: what a cold start
// programs. (The sink's conntrack cleanup, which follows the transaction
// and costs a netlink socket, is left out.)
func freshKernelTable(tb testing.TB, name string, opts Options, items []*model.ServiceEndpoints) *kernelTable {
	tb.Helper()
	fd := freshNetNS(tb)
	defer unix.Close(fd)
	newConn := ConnInNetNS(fd)
	rs, _ := buildRuleset(TableName(name), opts, items)
	a := newApplier(newConn, rs.Table)
	defer a.Close()
	if _, err := a.Full(rs); err != nil {
		tb.Fatalf("fresh table: %v", err)
	}
	return mustReadKernelTable(tb, newConn, rs.Table)
}

// mustReadKernelTable reads a table back on a new connection from
// newConn, failing tb on an error.
func mustReadKernelTable(tb testing.TB, newConn func(...nftables.ConnOption) (*nftables.Conn, error), table string) *kernelTable {
	tb.Helper()
	conn, err := newConn(nftables.AsLasting())
	if err != nil {
		tb.Fatalf("read table %s: %v", table, err)
	}
	defer conn.CloseLasting()
	kt, err := readKernelTable(conn, table)
	if err != nil {
		tb.Fatalf("read table %s: %v", table, err)
	}
	return kt
}

// diffKernelTables returns the differences between two tables read back
// (-want +got), "" when they are the same.
func diffKernelTables(want, got *kernelTable) string {
	return cmp.Diff(want, got)
}

// conntrackAt is a Config.Conntrack for the network namespace open as fd.
func conntrackAt(fd int) func() (*vnetlink.Handle, error) {
	return func() (*vnetlink.Handle, error) {
		return vnetlink.NewHandleAt(vnetns.NsHandle(fd), unix.NETLINK_NETFILTER)
	}
}
