//go:build linux

package nfmonitor

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
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

// notification is a message of type typ from port pid, as the monitor's
// socket receives it.
func notification(t *testing.T, typ uint8, pid, seq uint32, family uint8, attrs func(ae *netlink.AttributeEncoder)) netlink.Message {
	t.Helper()
	return netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | uint16(typ)), PID: pid, Sequence: seq},
		Data:   message(t, family, attrs),
	}
}

// newGen is a NEWGEN message of generation id from port pid (a
// transaction's end, or the reply to a request of the monitor's, port 1).
func newGen(t *testing.T, pid, seq, id uint32) netlink.Message {
	t.Helper()
	return notification(t, unix.NFT_MSG_NEWGEN, pid, seq, unix.NFPROTO_UNSPEC, func(ae *netlink.AttributeEncoder) {
		ae.Uint32(unix.NFTA_GEN_ID, id)
		ae.Uint32(unix.NFTA_GEN_PROC_PID, 4321)
		ae.String(unix.NFTA_GEN_PROC_NAME, "nft")
	})
}

// ruleAdded is a rule added to chain c of table inet kpng-x, from port pid.
func ruleAdded(t *testing.T, pid uint32) netlink.Message {
	t.Helper()
	return notification(t, unix.NFT_MSG_NEWRULE, pid, 0, unix.NFPROTO_INET, func(ae *netlink.AttributeEncoder) {
		ae.String(unix.NFTA_RULE_TABLE, "kpng-x")
		ae.String(unix.NFTA_RULE_CHAIN, "c")
	})
}

// overrun stands, in TestReadGenerationReplies' messages, for the
// socket's ENOBUFS.
var overrun = netlink.Message{Header: netlink.Header{Type: 0xffff}}

// TestReadGenerationReplies feeds the reader (through its receive seam)
// messages as the monitor's socket would get them around Mute, and
// checks what it posts. The monitor's own requests for the generation
// come from port 1: sequence 1 a resync's (Start, an unmute), sequence 2
// a mute's; other programs commit from port 99.
//   - A mute with nothing unseen posts only the batch of the foreign
//     transaction read before it (the control).
//   - A generation counted but never ended by a NEWGEN read when muting
//     (a transaction whose notifications came after the group was left)
//     posts a loss; changes not ended when muting are posted Cut, and a
//     loss.
//   - Changes not ended when a resync's reply comes are posted Cut, and
//     lost.
//   - While resyncing, a jump in the generations is not a loss; after the
//     reply it is again, also the reply to an earlier request of the
//     resync (asked again after an overrun).
//   - A reply no longer waited for does not end a transaction's changes
//     (they end with their committer's NEWGEN, from port 99).
//   - An overrun (ENOBUFS) is a loss, and its time is kept (Mute).
func TestReadGenerationReplies(t *testing.T) {
	for _, tc := range []struct {
		name      string
		resyncing bool
		mute      bool
		msgs      func(t *testing.T) []netlink.Message
		// want describes each batch posted: "foreign" (from port 99),
		// "cut", or the port of another; lost whether a loss was
		// posted.
		want []string
		lost bool
	}{
		{"muted, nothing unseen", true, true, func(t *testing.T) []netlink.Message {
			return []netlink.Message{newGen(t, 1, 1, 5), ruleAdded(t, 99), newGen(t, 99, 7, 6), newGen(t, 1, 2, 6)}
		}, []string{"foreign"}, false},
		{"a generation counted but not ended when muting", true, true, func(t *testing.T) []netlink.Message {
			return []netlink.Message{newGen(t, 1, 1, 5), newGen(t, 1, 2, 6)}
		}, nil, true},
		{"changes not ended when muting", true, true, func(t *testing.T) []netlink.Message {
			return []netlink.Message{newGen(t, 1, 1, 5), ruleAdded(t, 99), newGen(t, 1, 2, 5)}
		}, []string{"cut"}, true},
		{"changes not ended when the resync's reply comes", true, false, func(t *testing.T) []netlink.Message {
			return []netlink.Message{ruleAdded(t, 99), newGen(t, 1, 1, 7)}
		}, []string{"cut"}, true},
		{"a jump while resyncing", true, false, func(t *testing.T) []netlink.Message {
			return []netlink.Message{newGen(t, 99, 7, 5), newGen(t, 99, 8, 9), newGen(t, 1, 1, 9)}
		}, nil, false},
		{"a jump after the resync's reply", true, false, func(t *testing.T) []netlink.Message {
			return []netlink.Message{newGen(t, 1, 1, 9), newGen(t, 99, 8, 12)}
		}, nil, true},
		{"a jump after the reply to an earlier request of the resync", true, false, func(t *testing.T) []netlink.Message {
			return []netlink.Message{newGen(t, 1, 0, 9), newGen(t, 99, 8, 12)}
		}, nil, true},
		{"a stale reply amid a transaction's changes", false, false, func(t *testing.T) []netlink.Message {
			return []netlink.Message{newGen(t, 99, 7, 5), ruleAdded(t, 99), newGen(t, 1, 9, 5), newGen(t, 99, 8, 6)}
		}, []string{"foreign"}, false},
		{"an overrun", true, false, func(t *testing.T) []netlink.Message {
			return []netlink.Message{newGen(t, 1, 1, 5), overrun}
		}, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			msgs := tc.msgs(t)
			m := &Monitor{
				cfg:    Config{Watch: func(c Change, _ []byte) bool { return c.Table == "kpng-x" }},
				ctx:    ctx,
				logger: klog.Background(),
				wake:   make(chan struct{}, 1),
				receive: func() ([]netlink.Message, error) {
					if len(msgs) == 0 {
						cancel()
						return nil, context.Canceled
					}
					msg := msgs[0]
					msgs = msgs[1:]
					if msg.Header.Type == overrun.Header.Type {
						return nil, unix.ENOBUFS
					}
					return []netlink.Message{msg}, nil
				},
				pid:       1,
				resyncing: tc.resyncing,
			}
			if tc.resyncing {
				m.genReq = &netlink.Header{PID: 1, Sequence: 1}
			}
			if tc.mute {
				m.muteReq = &netlink.Header{PID: 1, Sequence: 2}
			}
			m.read(ctx)
			var got []string
			for _, b := range m.pending {
				switch {
				case b.Cut:
					got = append(got, "cut")
				case b.PortID == 99:
					got = append(got, "foreign")
				default:
					got = append(got, fmt.Sprint("port ", b.PortID))
				}
			}
			if !slices.Equal(got, tc.want) || m.lost != tc.lost {
				t.Errorf("posted %v, lost %v; want %v, lost %v", got, m.lost, tc.want, tc.lost)
			}
			if tc.name == "an overrun" && m.lossAt.IsZero() {
				t.Error("an overrun: its time not kept")
			}
		})
	}
}
