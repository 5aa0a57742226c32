package iptables

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"sigs.k8s.io/kpng/backends/nfmonitor"
)

// TestDeletedJumps: the monitor's transactions allow a repair of the jumps
// alone only when all they did was delete rules of built-in chains (the
// sink's jumps), every kind of change named.
func TestDeletedJumps(t *testing.T) {
	del := func(family uint8, table, chain string) nfmonitor.Change {
		return nfmonitor.Change{Type: unix.NFT_MSG_DELRULE, Family: family, Table: table, Chain: chain}
	}
	for _, tc := range []struct {
		what    string
		foreign []nfmonitor.Batch
		want    []builtinRef
	}{
		{"no transaction (notifications lost)", nil, nil},
		{"one jump", []nfmonitor.Batch{{Changes: []nfmonitor.Change{del(unix.NFPROTO_IPV4, "nat", "OUTPUT")}, Count: 1}},
			[]builtinRef{{ipv4, "nat", "OUTPUT"}}},
		{"jumps of both families, twice the same", []nfmonitor.Batch{
			{Changes: []nfmonitor.Change{del(unix.NFPROTO_IPV6, "filter", "FORWARD"), del(unix.NFPROTO_IPV4, "nat", "PREROUTING")}, Count: 2},
			{Changes: []nfmonitor.Change{del(unix.NFPROTO_IPV6, "filter", "FORWARD")}, Count: 1},
		}, []builtinRef{{ipv6, "filter", "FORWARD"}, {ipv4, "nat", "PREROUTING"}}},
		{"a jump and a kpng chain flushed", []nfmonitor.Batch{{Changes: []nfmonitor.Change{
			del(unix.NFPROTO_IPV4, "nat", "OUTPUT"), del(unix.NFPROTO_IPV4, "nat", "KPNG-X-SERVICES")}, Count: 2}}, nil},
		{"a built-in chain deleted", []nfmonitor.Batch{{Changes: []nfmonitor.Change{
			{Type: unix.NFT_MSG_DELCHAIN, Family: unix.NFPROTO_IPV4, Table: "nat", Chain: "OUTPUT"}}, Count: 1}}, nil},
		{"a table deleted", []nfmonitor.Batch{{Changes: []nfmonitor.Change{
			{Type: unix.NFT_MSG_DELTABLE, Family: unix.NFPROTO_IPV4, Table: "nat"}}, Count: 1}}, nil},
		{"more kinds than a batch names", []nfmonitor.Batch{{Changes: []nfmonitor.Change{del(unix.NFPROTO_IPV4, "nat", "OUTPUT")}, Count: 9, Truncated: true}}, nil},
		{"an earlier transaction's end lost", []nfmonitor.Batch{{Changes: []nfmonitor.Change{del(unix.NFPROTO_IPV4, "nat", "OUTPUT")}, Count: 1, Cut: true}}, nil},
	} {
		if diff := cmp.Diff(tc.want, deletedJumps(tc.foreign), cmp.AllowUnexported(builtinRef{})); diff != "" {
			t.Errorf("%s: deletedJumps (-want +got):\n%s", tc.what, diff)
		}
	}
}

// TestTouchedTables: a repair writes only the tables the transactions
// touched when they name them all; not after a loss (no batch, or a Cut
// one), nor when a batch touched more tables than it names.
func TestTouchedTables(t *testing.T) {
	table := func(family uint8, name string) nfmonitor.Change {
		return nfmonitor.Change{Family: family, Table: name}
	}
	for _, tc := range []struct {
		what    string
		foreign []nfmonitor.Batch
		want    map[builtinRef]bool
	}{
		{"no transaction (notifications lost)", nil, nil},
		{"two tables, one of them twice", []nfmonitor.Batch{
			{Tables: []nfmonitor.Change{table(unix.NFPROTO_IPV4, "nat")}},
			{Tables: []nfmonitor.Change{table(unix.NFPROTO_IPV6, "filter"), table(unix.NFPROTO_IPV4, "nat")}},
		}, map[builtinRef]bool{{family: ipv4, table: "nat"}: true, {family: ipv6, table: "filter"}: true}},
		{"a batch cut by a loss", []nfmonitor.Batch{{Tables: []nfmonitor.Change{table(unix.NFPROTO_IPV4, "nat")}, Cut: true}}, nil},
		{"more tables than a batch names", []nfmonitor.Batch{{ManyTables: true}}, nil},
	} {
		if diff := cmp.Diff(tc.want, touchedTables(tc.foreign), cmp.AllowUnexported(builtinRef{})); diff != "" {
			t.Errorf("%s: touchedTables (-want +got):\n%s", tc.what, diff)
		}
	}
}
