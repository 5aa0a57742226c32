//go:build linux

package nft

import (
	"bytes"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"

	"sigs.k8s.io/kpng/model"
)

// elementCases are sets and elements of every kind kpng sends (and the
// other kinds google/nftables marshals), for the marshaling tests.
func elementCases() []struct {
	name string
	set  *nftables.Set
	els  []nftables.SetElement
} {
	table := &nftables.Table{Name: "kpng-unit", Family: nftables.TableFamilyINet}
	ep := endpointElement{Family: ipv4, Slot: 70, From: 0, To: blockRange / 2, Target: netip.MustParseAddrPort("10.1.0.2:8080")}
	ep6 := endpointElement{Family: ipv6, Slot: 3, From: blockRange / 2, To: blockRange, Target: netip.MustParseAddrPort("[fd00::2]:53")}
	start, end := endpointMapElements(ep, "svc4 default/web/tcp/80", false)[0], endpointMapElements(ep, "", false)[1]
	start6 := endpointMapElements(ep6, "", false)[0]
	delStart := endpointMapElements(ep, "", true)[0]
	key, err := keyBytes(mapKey{Addr: netip.MustParseAddr("10.96.0.10"), Proto: model.TCP, Port: 80})
	if err != nil {
		panic(err)
	}
	many := make([]nftables.SetElement, 300)
	for i := range many {
		many[i] = hairpinElement(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}))
	}
	return []struct {
		name string
		set  *nftables.Set
		els  []nftables.SetElement
	}{
		{"endpoint map intervals", &nftables.Set{Table: table, Name: "endpoints-v4-1", ID: 7, IsMap: true, Interval: true},
			[]nftables.SetElement{start, end, start6, delStart}},
		{"service map verdicts", &nftables.Set{Table: table, Name: "service-ips-v4", ID: 1 << 30, IsMap: true},
			[]nftables.SetElement{
				{Key: key, VerdictData: verdictExpr(verdict{Goto: "svc4-ABCDEFGH-default/web/tcp/80"}), Comment: "default/web"},
				{Key: key, VerdictData: verdictExpr(verdict{})},
				{Key: key, VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: "abc"}}, // a name whose NUL ends on a boundary
			}},
		{"hairpin set", &nftables.Set{Table: table, Name: "hairpin-v4"}, many},
		{"cluster IPs, one element", &nftables.Set{Table: table, Name: "cluster-ips-v6"}, []nftables.SetElement{addrElement(netip.MustParseAddr("fd00:10:96::1"))}},
		{"timeouts and key ends", &nftables.Set{Table: table, Name: "x", HasTimeout: true, Concatenation: true},
			[]nftables.SetElement{{Key: []byte{1, 2, 3}, KeyEnd: []byte{4, 5, 6, 7, 8}, Timeout: 3 * time.Second, Comment: strings.Repeat("c", 100)}}},
		{"no elements", &nftables.Set{Table: table, Name: "empty"}, nil},
	}
}

// googleElementMessage returns the message google/nftables' own
// SetAddElements (or SetDeleteElements) sends for els in s.
func googleElementMessage(t *testing.T, s *nftables.Set, els []nftables.SetElement, del bool) netlink.Message {
	t.Helper()
	var sent []netlink.Message
	conn, err := nftables.New(nftables.WithTestDial(func(req []netlink.Message) ([]netlink.Message, error) {
		sent = append(sent, req...)
		return req, nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	if del {
		err = conn.SetDeleteElements(s, els)
	} else {
		err = conn.SetAddElements(s, els)
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}
	if len(sent) != 3 {
		t.Fatalf("google/nftables sent %d messages, want a batch of one", len(sent))
	}
	return sent[1]
}

// TestMarshalElementsAsGoogleNftables: kpng's marshaling of set elements
// gives google/nftables' bytes, element for element.
func TestMarshalElementsAsGoogleNftables(t *testing.T) {
	var scratch []byte
	for _, tc := range elementCases() {
		t.Run(tc.name, func(t *testing.T) {
			want := googleElementMessage(t, tc.set, tc.els, false)
			l, err := newElementList(tc.set, 0, len(tc.els), sliceElem(tc.els), &scratch)
			if err != nil {
				t.Fatal(err)
			}
			got := make([]byte, l.size)
			if err := l.write(got); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want.Data[nfgenmsgLen:]) {
				t.Errorf("payload differs from google/nftables':\n got %x\nwant %x", got, want.Data[nfgenmsgLen:])
			}
			// Written into a larger buffer, it stays in its place.
			big := bytes.Repeat([]byte{0xee}, l.size+8)
			if err := l.write(big[:l.size]); err != nil || !bytes.Equal(big[:l.size], got) || !bytes.Equal(big[l.size:], bytes.Repeat([]byte{0xee}, 8)) {
				t.Errorf("written into a larger buffer: %v, %x", err, big)
			}
		})
	}
}

// sliceElem returns the elem function of newElementList for els.
func sliceElem(els []nftables.SetElement) func(int) (nftables.SetElement, error) {
	return func(i int) (nftables.SetElement, error) { return els[i], nil }
}

// TestElementListChanged: elements that no longer have the size measured
// when the transaction was built are an error, not a batch that
// overwrites its next message.
func TestElementListChanged(t *testing.T) {
	c := elementCases()[1]
	els := slices.Clone(c.els)
	var scratch []byte
	l, err := newElementList(c.set, 0, len(els), sliceElem(els), &scratch)
	if err != nil {
		t.Fatal(err)
	}
	els[0].Comment += "longer"
	big := make([]byte, l.size+64)
	if err := l.write(big[:l.size]); err == nil || !strings.Contains(err.Error(), "changed size") {
		t.Errorf("write of grown elements: %v, want an error", err)
	}
	if !bytes.Equal(big[l.size:], make([]byte, 64)) {
		t.Errorf("write of grown elements wrote past its size")
	}
}

// TestMarshalElementsTooLong: elements over a 16-bit attribute are an
// error, not a length that wraps.
func TestMarshalElementsTooLong(t *testing.T) {
	table := &nftables.Table{Name: "kpng-unit", Family: nftables.TableFamilyINet}
	els := make([]nftables.SetElement, 4000)
	for i := range els {
		els[i] = hairpinElement(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}))
	}
	var scratch []byte
	if _, err := newElementList(&nftables.Set{Table: table, Name: "hairpin-v4"}, 0, len(els), sliceElem(els), &scratch); err == nil {
		t.Fatal("4,000 hairpin elements (80,000 bytes) in one message: no error")
	}
}

// relayConn returns a connection sending through a relay to a test dial
// that records the batches sent, and the record.
func relayConn(t *testing.T) (*nftables.Conn, *relay, *[]netlink.Message) {
	t.Helper()
	var sent []netlink.Message
	conn, err := nftables.New(nftables.WithTestDial(func(req []netlink.Message) ([]netlink.Message, error) {
		for _, m := range req {
			m.Data = bytes.Clone(m.Data)
			sent = append(sent, m)
		}
		return req, nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	r, err := newRelay(conn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return conn, r, &sent
}

// TestElementsThroughRelay: a transaction's messages of set elements, as
// placeholders filled by the relay, reach the socket as google/nftables
// would have sent them, in their place in the batch, for additions and
// deletions, with a message of google/nftables' own in between.
func TestElementsThroughRelay(t *testing.T) {
	conn, r, sent := relayConn(t)
	tx := &txn{tables: familyTables("kpng-unit"), conn: conn, relay: r}
	r.begin()
	cases := elementCases()
	var want []netlink.Message
	for i, tc := range cases {
		del := i%2 == 1
		if err := tx.elements(tc.set, 0, len(tc.els), sliceElem(tc.els), del); err != nil {
			t.Fatal(err)
		}
		want = append(want, googleElementMessage(t, tc.set, tc.els, del))
		if i == 2 {
			// google/nftables' own elements pass as they are, also
			// when their last bytes look like an empty list.
			own := []nftables.SetElement{addrElement(netip.MustParseAddr("10.96.0.1")), addrElement(netip.MustParseAddr("4.0.3.128"))}
			if err := conn.SetAddElements(cases[3].set, own); err != nil {
				t.Fatal(err)
			}
			want = append(want, googleElementMessage(t, cases[3].set, own, false))
		}
	}
	if err := conn.Flush(); err != nil {
		t.Fatal(err)
	}
	got := (*sent)[1 : len(*sent)-1]
	if len(got) != len(want) {
		t.Fatalf("%d messages sent, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i].Header.Type != want[i].Header.Type || !bytes.Equal(got[i].Data, want[i].Data) {
			t.Errorf("message %d: type %v %x, want type %v %x", i, got[i].Header.Type, got[i].Data, want[i].Header.Type, want[i].Data)
		}
		if got[i].Header.Length != uint32(nlaAlign(16+len(got[i].Data))) {
			t.Errorf("message %d: length %d for %d bytes of data", i, got[i].Header.Length, len(got[i].Data))
		}
	}
	if stats := tx.stats; stats.Messages != len(cases) {
		t.Errorf("Stats.Messages = %d, want %d", stats.Messages, len(cases))
	}
}

// TestRelayUnmatchedElements: a placeholder without its elements, or
// elements without a placeholder, fail the transaction before anything
// is sent.
func TestRelayUnmatchedElements(t *testing.T) {
	set := elementCases()[2].set
	els := elementCases()[2].els[:2]
	for _, tc := range []struct {
		name string
		add  func(conn *nftables.Conn, r *relay) error
		want string
	}{
		{"placeholder alone", func(conn *nftables.Conn, _ *relay) error {
			return conn.SetAddElements(set, nil)
		}, "without its elements"},
		{"elements alone", func(conn *nftables.Conn, r *relay) error {
			var scratch []byte
			l, err := newElementList(set, 0, len(els), sliceElem(els), &scratch)
			r.elements = append(r.elements, l)
			conn.AddTable(set.Table)
			return err
		}, "without their place"},
		{"elements of another set", func(conn *nftables.Conn, r *relay) error {
			var scratch []byte
			l, err := newElementList(&nftables.Set{Table: set.Table, Name: "other"}, 0, len(els), sliceElem(els), &scratch)
			r.elements = append(r.elements, l)
			if err != nil {
				return err
			}
			return conn.SetAddElements(set, nil)
		}, "not the placeholder's"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, r, sent := relayConn(t)
			r.begin()
			if err := tc.add(conn, r); err != nil {
				t.Fatal(err)
			}
			err := conn.Flush()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Flush: %v, want an error saying %q", err, tc.want)
			}
			if len(*sent) != 0 {
				t.Errorf("%d messages sent", len(*sent))
			}
		})
	}
}

// BenchmarkMarshalElements compares kpng's marshaling of a full message
// of endpoint map elements with google/nftables'.
func BenchmarkMarshalElements(b *testing.B) {
	table := &nftables.Table{Name: "kpng-bench", Family: nftables.TableFamilyINet}
	set := &nftables.Set{Table: table, Name: "endpoints-v4-0", IsMap: true, Interval: true}
	var els []nftables.SetElement
	for i := range 256 {
		e := endpointElement{Family: ipv4, Slot: uint32(i / 10), From: uint32(i%10) * blockRange / 10, To: uint32(i%10+1) * blockRange / 10,
			Target: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), 8080)}
		pair := endpointMapElements(e, fmt.Sprintf("svc4 default/svc-%05d/tcp/80", i/10), false)
		els = append(els, pair[0], pair[1])
	}
	b.Run("kpng", func(b *testing.B) {
		// What a full sync does: the size measured, then the payload
		// written into the batch's buffer.
		var scratch, buf []byte
		b.ReportAllocs()
		for b.Loop() {
			l, err := newElementList(set, 0, len(els), sliceElem(els), &scratch)
			if err != nil {
				b.Fatal(err)
			}
			buf = slices.Grow(buf[:0], l.size)[:l.size]
			if err := l.write(buf); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("google-nftables", func(b *testing.B) {
		dial := nftables.WithTestDial(func(req []netlink.Message) ([]netlink.Message, error) { return req, nil })
		b.ReportAllocs()
		for b.Loop() {
			// A connection each time, so that the messages do not pile up.
			conn, err := nftables.New(dial)
			if err != nil {
				b.Fatal(err)
			}
			if err := conn.SetAddElements(set, els); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestBlockElementsAsListed: a full sync's endpoint elements, made from
// the blocks (blockElements), are the messages that the listed elements
// make (endpointElements of ruleset.endpoints, what the text shows), for
// blocks of both families over several endpoint maps.
func TestBlockElementsAsListed(t *testing.T) {
	var items []*model.ServiceEndpoints
	for i := range 150 {
		se := benchServiceEndpoints(i)
		se.Endpoints = se.Endpoints[:1+i%4] // in 4 shard maps
		if i%3 == 0 {
			se.Service.IPs.ClusterIPs.V6 = []string{fmt.Sprintf("fd00:10:96::%x", i+1)}
			se.Endpoints = append(se.Endpoints, ep(fmt.Sprintf("fd00:1::%x", i+1), false))
		}
		items = append(items, se)
	}
	rs, problems := buildRuleset("kpng-unit", Options{}, items)
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	maps := map[string]bool{}
	for _, bl := range rs.Blocks {
		maps[bl.Map()] = true
	}
	if len(maps) < 3 {
		t.Fatalf("blocks in %d endpoint maps, want both families and more than one map of a family", len(maps))
	}
	send := func(add func(tx *txn) error) []netlink.Message {
		conn, r, sent := relayConn(t)
		tx := &txn{tables: familyTables("kpng-unit"), conn: conn, relay: r, sets: map[string]*nftables.Set{}}
		r.begin()
		if err := add(tx); err != nil {
			t.Fatal(err)
		}
		if err := conn.Flush(); err != nil {
			t.Fatal(err)
		}
		return *sent
	}
	// The maps come in another order (the blocks' is by shard, the
	// listed elements' by slot, which the tracker hands out as services
	// come): the messages are compared as a set.
	byData := func(a, b netlink.Message) int { return bytes.Compare(a.Data, b.Data) }
	got := send(func(tx *txn) error { return tx.blockElements(rs.Blocks) })
	want := send(func(tx *txn) error { return tx.endpointElements(rs.endpoints(), commentsOf(rs.Blocks), false) })
	slices.SortFunc(got, byData)
	slices.SortFunc(want, byData)
	if len(got) != len(want) || len(got) < 4 {
		t.Fatalf("%d messages, want %d (more than one)", len(got), len(want))
	}
	for i := range want {
		if !bytes.Equal(got[i].Data, want[i].Data) {
			t.Errorf("message %d differs:\n got %x\nwant %x", i, got[i].Data, want[i].Data)
		}
	}
}
