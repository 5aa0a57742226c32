//go:build linux

package nfmonitor

import (
	"encoding/binary"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// message returns the payload of a notification: nfgenmsg of family,
// then the attributes.
func message(t *testing.T, family uint8, attrs func(ae *netlink.AttributeEncoder)) []byte {
	t.Helper()
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.BigEndian
	attrs(ae)
	b, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return append([]byte{family, unix.NFNETLINK_V0, 0, 0}, b...)
}

// TestParseChange reads the family, table and chain of each kind of
// notification, as the kernel lays them out (the table is attribute 1 of
// every kind; a chain's name and a rule's chain are others), and refuses
// the messages that name no table.
func TestParseChange(t *testing.T) {
	for _, tc := range []struct {
		typ   uint8
		attrs func(ae *netlink.AttributeEncoder)
		want  Change
		ok    bool
	}{
		{unix.NFT_MSG_DELTABLE, func(ae *netlink.AttributeEncoder) { ae.String(unix.NFTA_TABLE_NAME, "kpng-x") },
			Change{Type: unix.NFT_MSG_DELTABLE, Family: unix.NFPROTO_INET, Table: "kpng-x"}, true},
		{unix.NFT_MSG_DELCHAIN, func(ae *netlink.AttributeEncoder) {
			ae.String(unix.NFTA_CHAIN_TABLE, "kpng-x")
			ae.Uint64(unix.NFTA_CHAIN_HANDLE, 7)
			ae.String(unix.NFTA_CHAIN_NAME, "nat-output")
		}, Change{Type: unix.NFT_MSG_DELCHAIN, Family: unix.NFPROTO_INET, Table: "kpng-x", Chain: "nat-output"}, true},
		{unix.NFT_MSG_DELRULE, func(ae *netlink.AttributeEncoder) {
			ae.String(unix.NFTA_RULE_TABLE, "kpng-x")
			ae.String(unix.NFTA_RULE_CHAIN, "services")
		}, Change{Type: unix.NFT_MSG_DELRULE, Family: unix.NFPROTO_INET, Table: "kpng-x", Chain: "services"}, true},
		{unix.NFT_MSG_NEWSETELEM, func(ae *netlink.AttributeEncoder) {
			ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, "kpng-x")
			ae.String(unix.NFTA_SET_ELEM_LIST_SET, "service-ips-v4")
		}, Change{Type: unix.NFT_MSG_NEWSETELEM, Family: unix.NFPROTO_INET, Table: "kpng-x"}, true},
		// A set's name is its attribute 2, not a chain.
		{unix.NFT_MSG_DELSET, func(ae *netlink.AttributeEncoder) {
			ae.String(unix.NFTA_SET_TABLE, "kpng-x")
			ae.String(unix.NFTA_SET_NAME, "hairpin-v4")
		}, Change{Type: unix.NFT_MSG_DELSET, Family: unix.NFPROTO_INET, Table: "kpng-x"}, true},
		{unix.NFT_MSG_NEWGEN, func(ae *netlink.AttributeEncoder) { ae.Uint32(unix.NFTA_GEN_ID, 3) }, Change{Type: unix.NFT_MSG_NEWGEN, Family: unix.NFPROTO_INET}, false},
		{unix.NFT_MSG_DELRULE, func(ae *netlink.AttributeEncoder) { ae.String(unix.NFTA_RULE_CHAIN, "services") }, Change{Type: unix.NFT_MSG_DELRULE, Family: unix.NFPROTO_INET, Chain: "services"}, false},
	} {
		got, ok := parseChange(tc.typ, message(t, unix.NFPROTO_INET, tc.attrs))
		if ok != tc.ok || (ok && got != tc.want) {
			t.Errorf("type %d: %+v, %v; want %+v, %v", tc.typ, got, ok, tc.want, tc.ok)
		}
	}
}

// TestParseGen reads the generation and the committing process of a
// NEWGEN message (its attributes are big-endian).
func TestParseGen(t *testing.T) {
	data := message(t, unix.NFPROTO_UNSPEC, func(ae *netlink.AttributeEncoder) {
		ae.Uint32(unix.NFTA_GEN_ID, 42)
		ae.Uint32(unix.NFTA_GEN_PROC_PID, 1234)
		ae.String(unix.NFTA_GEN_PROC_NAME, "nft")
	})
	id, pid, name := parseGen(data[4:])
	if id != 42 || pid != 1234 || name != "nft" {
		t.Errorf("parseGen = %d, %d, %q; want 42, 1234, nft", id, pid, name)
	}
}

// TestBatchKeep: a batch keeps its first changes of distinct kinds, and
// always a table's deletion (the last change of a flush), counting all,
// and says when it dropped a kind (Truncated).
func TestBatchKeep(t *testing.T) {
	var b Batch
	for i := range 10 {
		b.keep(Change{Type: unix.NFT_MSG_DELRULE, Family: unix.NFPROTO_INET, Table: "kpng-x", Chain: []string{"a", "b", "c", "d", "e"}[i%5]})
	}
	b.keep(Change{Type: unix.NFT_MSG_DELTABLE, Family: unix.NFPROTO_INET, Table: "kpng-x"})
	b.ProcName, b.ProcPID = "nft", 99
	want := "delete rule inet kpng-x a, delete rule inet kpng-x b, delete rule inet kpng-x c, delete table inet kpng-x (11 changes) (by nft, pid 99)"
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("String (-want +got):\n%s", diff)
	}
	if !strings.Contains(b.String(), "delete table") || b.Count != 11 {
		t.Errorf("batch %+v: the table's deletion dropped or a change not counted", b)
	}
	if !b.Truncated {
		t.Errorf("batch %+v: kinds of changes dropped, not Truncated", b)
	}
	if want := []Change{{Family: unix.NFPROTO_INET, Table: "kpng-x"}}; !cmp.Equal(b.Tables, want) || b.ManyTables {
		t.Errorf("batch tables %v (many: %v), want %v", b.Tables, b.ManyTables, want)
	}
	var many Batch
	for i := range maxTables + 1 {
		many.keep(Change{Type: unix.NFT_MSG_NEWRULE, Family: unix.NFPROTO_IPV4, Table: fmt.Sprint("t", i), Chain: "c"})
	}
	if !many.ManyTables || many.Tables != nil {
		t.Errorf("a batch of %d tables: Tables %d long, ManyTables %v; want none named, ManyTables", maxTables+1, len(many.Tables), many.ManyTables)
	}
	var few Batch
	for range 3 {
		few.keep(Change{Type: unix.NFT_MSG_DELRULE, Family: unix.NFPROTO_IPV4, Table: "nat", Chain: "OUTPUT"})
	}
	if few.Truncated || len(few.Changes) != 1 || few.Count != 3 {
		t.Errorf("batch %+v: one kind of change three times: want it kept, counted 3, not Truncated", few)
	}
}
