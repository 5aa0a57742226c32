package iptables

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"sigs.k8s.io/kpng/backends/nfmonitor"
	"sigs.k8s.io/kpng/model"
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

// TestRepairWritesTouchedTables checks, with a fake runner, which tables
// a repair writes: only those the foreign transactions touched after a
// successful sync, without moving the time of the last full sync; every
// table after a failed sync, and after a failed repair.
func TestRepairWritesTouchedTables(t *testing.T) {
	r := &fakeRunner{fail: map[string]error{}}
	s := newSink(context.Background(), Config{ServiceProxyName: "test", Runner: r}, VariantLegacy, &fakeJumper{})
	web := &model.ServiceEndpoints{
		Service:   svc("web", ipset("10.96.0.10", "fd00:10:96::10"), port(model.TCP, 80, 8080)),
		Endpoints: []*model.Endpoint{ep("10.1.0.2", false)},
	}
	s.Update(web.Service.Key(), nil, web)
	if err := s.Sync(); err != nil {
		t.Fatalf("first Sync: %v", err)
	}
	r.take()
	natV4 := []nfmonitor.Batch{{Tables: []nfmonitor.Change{{Family: unix.NFPROTO_IPV4, Table: "nat"}}, Count: 1,
		Changes: []nfmonitor.Change{{Type: unix.NFT_MSG_DELRULE, Family: unix.NFPROTO_IPV4, Table: "nat", Chain: ChainPrefix("test") + chainServices}}}}
	restores := func() []string {
		var out []string
		for _, c := range r.take() {
			if strings.HasSuffix(c.Name, "-restore") {
				table, _, _ := strings.Cut(strings.TrimPrefix(c.Stdin, "*"), "\n")
				out = append(out, c.Name+" "+table)
			}
		}
		return out
	}
	every := []string{"iptables-legacy-restore nat", "iptables-legacy-restore filter", "ip6tables-legacy-restore nat", "ip6tables-legacy-restore filter"}

	lastFull := s.lastFull
	s.repair("a kpng chain flushed", natV4)
	if diff := cmp.Diff([]string{"iptables-legacy-restore nat"}, restores()); diff != "" {
		t.Errorf("a repair after a successful sync: restores (-want +got):\n%s", diff)
	}
	if !s.lastFull.Equal(lastFull) || s.needFull || s.onlyTables != nil {
		t.Errorf("after a restricted repair: lastFull moved %v, needFull %v, onlyTables %v; want neither, and no tables kept", !s.lastFull.Equal(lastFull), s.needFull, s.onlyTables)
	}

	// A failed sync: the next repair writes every table.
	r.fail["ip6tables-legacy-restore"] = errors.New("injected")
	s.Update(web.Service.Key(), web, nil) // its chains in every table deleted
	if err := s.Sync(); err == nil {
		t.Fatal("Sync with ip6tables-legacy-restore failing: no error")
	}
	r.take()
	s.repair("a kpng chain flushed", natV4)
	if diff := cmp.Diff(every[:3], restores()); diff != "" {
		t.Errorf("a repair after a failed sync (ip6 still failing): restores (-want +got):\n%s", diff)
	}
	// The failed repair: the next one writes every table too.
	delete(r.fail, "ip6tables-legacy-restore")
	s.repair("a kpng chain flushed", natV4)
	if diff := cmp.Diff(every, restores()); diff != "" {
		t.Errorf("a repair after a failed repair: restores (-want +got):\n%s", diff)
	}
	if s.needFull || s.onlyTables != nil {
		t.Errorf("after a full repair: needFull %v, onlyTables %v", s.needFull, s.onlyTables)
	}
}
