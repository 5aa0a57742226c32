//go:build linux

package nft

import (
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"sigs.k8s.io/kpng/client/model"
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
			sent = append(sent, msgTypeName(m.Header.Type))
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
// a full write is one batch that adds, deletes and adds the table, then
// its content; an endpoint change is one batch of element messages only,
// as many as Stats says.
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
	if diff := cmp.Diff([]string{"newtable", "deltable", "newtable"}, sent[1:4]); diff != "" {
		t.Errorf("full write starts (-want +got):\n%s", diff)
	}

	// One endpoint added: elements only.
	tr.Update(web.Key(), &model.ServiceEndpoints{Service: web, Endpoints: append(eps[:2:2], ep("10.1.0.3", false))})
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
