//go:build linux

package nft

import (
	"bytes"
	"encoding/binary"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"sigs.k8s.io/kpng/model"
)

// recordingConns returns a connection factory whose connections send
// nothing to a kernel: every flushed message is recorded (its nftables
// message type) and acknowledged. The applier's unprivileged tests use it.
func recordingConns() (func(...nftables.ConnOption) (*nftables.Conn, error), func() []string) {
	var mu sync.Mutex
	var sent []string
	dial := func(req []netlink.Message) ([]netlink.Message, error) {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range req {
			name := msgTypeName(m.Header.Type)
			if (name == "newtable" || name == "deltable") && len(m.Data) > 0 {
				name += " " + map[byte]string{unix.NFPROTO_INET: "inet", unix.NFPROTO_IPV4: "ip", unix.NFPROTO_IPV6: "ip6"}[m.Data[0]]
			}
			sent = append(sent, name)
		}
		return req, nil
	}
	newConn := func(opts ...nftables.ConnOption) (*nftables.Conn, error) {
		// Socket options need a real socket: keep the others only.
		return nftables.New(nftables.WithTestDial(dial))
	}
	take := func() []string {
		mu.Lock()
		defer mu.Unlock()
		out := sent
		sent = nil
		return out
	}
	return newConn, take
}

// setUserDataSent returns the user data of the sets created by msgs (by
// name): what the kernel is sent.
func setUserDataSent(t *testing.T, msgs []netlink.Message) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for _, m := range msgs {
		if m.Header.Type != newSetMessage {
			continue
		}
		attrs, err := netlink.UnmarshalAttributes(m.Data[4:])
		if err != nil {
			t.Fatalf("NEWSET message: %v", err)
		}
		var name string
		var ud []byte
		for _, a := range attrs {
			switch a.Type {
			case unix.NFTA_SET_NAME:
				name = strings.TrimSuffix(string(a.Data), "\x00")
			case unix.NFTA_SET_USERDATA:
				ud = a.Data
			}
		}
		out[name] = ud
	}
	return out
}

// TestApplierSetUserData checks, without privileges, that the maps keyed
// by a random number are created with the user data of their typeof
// declaration (typeof.go, written into the message by the relay), and
// that the other sets keep what google/nftables writes: the kernel test
// TestKernelListingReloads checks that it is what nft writes.
func TestApplierSetUserData(t *testing.T) {
	var msgs []netlink.Message
	var mu sync.Mutex
	dial := func(req []netlink.Message) ([]netlink.Message, error) {
		mu.Lock()
		defer mu.Unlock()
		msgs = append(msgs, req...)
		return req, nil
	}
	a := newApplier(func(...nftables.ConnOption) (*nftables.Conn, error) { return nftables.New(nftables.WithTestDial(dial)) }, "kpng-unit")
	defer a.Close()
	rs, _ := buildRuleset("kpng-unit", goldenOptions["every-rule-kind"], goldenCases()["every-rule-kind"])
	if _, err := a.Full(rs); err != nil {
		t.Fatalf("Full: %v", err)
	}
	sent := setUserDataSent(t, msgs)
	typed := 0
	for _, s := range rs.Sets {
		want := s.userData()
		if want == nil {
			continue
		}
		typed++
		if got := sent[s.Name]; !bytes.Equal(got, want) {
			t.Errorf("set %s: user data\n% x, want\n% x", s.Name, got, want)
		}
	}
	if typed < 4 {
		t.Errorf("%d maps with typeof user data, want the endpoint and balance maps of both families", typed)
	}
	// google/nftables' own: the key's byte order only.
	if got, want := sent[mapServices(ipv4)], []byte{0, 4, 2, 0, 0, 0}; !bytes.Equal(got, want) && sent[mapServices(ipv4)] != nil {
		t.Errorf("%s: user data % x, want google/nftables' % x or none", mapServices(ipv4), got, want)
	}
}

// TestWithUserData checks the rewriting of a NEWSET message's attributes:
// the user data replaced or added, the other attributes kept byte for
// byte (a last one without its padding included), other sets untouched,
// a malformed message refused.
func TestWithUserData(t *testing.T) {
	attr := func(typ uint16, data []byte) []byte {
		b := binary.NativeEndian.AppendUint16(nil, uint16(4+len(data)))
		b = binary.NativeEndian.AppendUint16(b, typ)
		return append(b, data...)
	}
	pad := func(b []byte) []byte { return append(b, make([]byte, nlaAlign(len(b))-len(b))...) }
	header := []byte{unix.NFPROTO_INET, 0, 0, 0}
	name := pad(attr(unix.NFTA_SET_NAME, []byte("m\x00")))
	keyLen := pad(attr(unix.NFTA_SET_KEY_LEN, []byte{0, 0, 0, 4}))
	oldUD := attr(unix.NFTA_SET_USERDATA, []byte{0, 4, 2, 0, 0, 0})
	newUD := []byte{1, 2, 3}
	ud := map[string][]byte{"m": newUD}
	want := slices.Concat(header, name, keyLen, pad(attr(unix.NFTA_SET_USERDATA, newUD)))
	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"replaced", slices.Concat(header, name, pad(oldUD), keyLen)},
		{"added", slices.Concat(header, name, keyLen)},
		{"last attribute unpadded", slices.Concat(header, name, pad(oldUD), attr(unix.NFTA_SET_KEY_LEN, []byte{0, 0, 0, 4})[:8])},
	} {
		got, err := withUserData(tc.in, ud)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: % x, %v; want % x", tc.name, got, err, want)
		}
	}
	other := slices.Concat(header, pad(attr(unix.NFTA_SET_NAME, []byte("other\x00"))), pad(oldUD))
	if got, err := withUserData(other, ud); err != nil || !bytes.Equal(got, other) {
		t.Errorf("another set: % x, %v; want it unchanged", got, err)
	}
	for _, bad := range [][]byte{{1}, slices.Concat(header, []byte{2, 0}), slices.Concat(header, attr(unix.NFTA_SET_NAME, []byte("m"))[:4])} {
		if _, err := withUserData(bad, ud); err == nil {
			t.Errorf("% x: no error", bad)
		}
	}
}

// msgTypeName names an nftables netlink message type (batch markers
// included).
func msgTypeName(t netlink.HeaderType) string {
	switch t {
	case unix.NFNL_MSG_BATCH_BEGIN:
		return "batch-begin"
	case unix.NFNL_MSG_BATCH_END:
		return "batch-end"
	}
	names := map[int]string{
		unix.NFT_MSG_NEWTABLE: "newtable", unix.NFT_MSG_DELTABLE: "deltable",
		unix.NFT_MSG_NEWCHAIN: "newchain", unix.NFT_MSG_DELCHAIN: "delchain",
		unix.NFT_MSG_NEWRULE: "newrule", unix.NFT_MSG_DELRULE: "delrule",
		unix.NFT_MSG_NEWSET: "newset", unix.NFT_MSG_DELSET: "delset",
		unix.NFT_MSG_NEWSETELEM: "newsetelem", unix.NFT_MSG_DELSETELEM: "delsetelem",
	}
	if n, ok := names[int(t)&0xff]; ok {
		return n
	}
	return "other"
}

// TestApplierMessages checks, without privileges, what the applier sends:
// a full write is one batch that adds, deletes and adds each family's
// table, then their content, the first one of an applier after adding and
// deleting the inet table of an earlier kpng (later ones do not); an
// endpoint change is one batch of element messages only, as many as
// Stats says.
func TestApplierMessages(t *testing.T) {
	newConn, take := recordingConns()
	a := newApplier(newConn, "kpng-unit")
	defer a.Close()
	tr := newTracker(Options{})
	web := svc("default", "web", ipset("10.96.0.10", "fd00:10:96::10"), tcp(80, 6000))
	eps := []*model.Endpoint{ep("10.1.0.1", true), ep("10.1.0.2", false)}
	tr.Update(web.Key(), &model.ServiceEndpoints{Service: web, Endpoints: eps})
	tr.Done()
	stats, err := a.Full(tr.Ruleset("kpng-unit"))
	if err != nil {
		t.Fatalf("Full: %v", err)
	}
	sent := take()
	if len(sent) != stats.Messages+2 || sent[0] != "batch-begin" || sent[len(sent)-1] != "batch-end" {
		t.Fatalf("full write: %d messages %v, want a batch of the %d Stats counts", len(sent), sent, stats.Messages)
	}
	tables := func(sent []string) []string {
		var out []string
		for _, m := range sent {
			if strings.Contains(m, "table") {
				out = append(out, m)
			}
		}
		return out
	}
	want := []string{"newtable inet", "deltable inet", "newtable ip", "deltable ip", "newtable ip", "newtable ip6", "deltable ip6", "newtable ip6"}
	if diff := cmp.Diff(want, sent[1:9]); diff != "" {
		t.Errorf("first full write starts (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, tables(sent)); diff != "" {
		t.Errorf("first full write's table messages (-want +got):\n%s", diff)
	}
	if _, err := a.Full(tr.Ruleset("kpng-unit")); err != nil {
		t.Fatalf("second Full: %v", err)
	}
	if diff := cmp.Diff(want[2:], tables(take())); diff != "" {
		t.Errorf("second full write's table messages, the inet table no longer deleted (-want +got):\n%s", diff)
	}

	// One endpoint replaced by another: elements only.
	tr.Update(web.Key(), &model.ServiceEndpoints{Service: web, Endpoints: []*model.Endpoint{eps[0], ep("10.1.0.3", false)}})
	d := tr.Done()
	stats, err = a.Partial(d)
	if err != nil {
		t.Fatalf("Partial: %v", err)
	}
	sent = take()
	if len(sent) != stats.Messages+2 || stats.Messages == 0 {
		t.Fatalf("endpoint change: %d messages %v, Stats says %d", len(sent), sent, stats.Messages)
	}
	for _, m := range sent[1 : len(sent)-1] {
		if m != "newsetelem" && m != "delsetelem" {
			t.Errorf("endpoint change sent a %s message: %v, want set elements only", m, sent)
		}
	}
	if stats.ChainsAdded+stats.ChainsFlushed+stats.Rules+stats.SetsAdded != 0 {
		t.Errorf("endpoint change stats %+v: chains, rules or sets touched", stats)
	}
}
