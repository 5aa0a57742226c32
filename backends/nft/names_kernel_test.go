//go:build linux

package nft

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/model"
)

// TestKernelHostileNamesListingLoads programs, through the sink (past the
// inputs' name checks: a backend must not rely on them), services whose
// namespaces, names and port names hold quotes, newlines, NUL, ";", "}",
// backslashes, bytes that are not UTF-8 and long multi-byte names, lists
// the table with `nft list table`, and loads that listing with `nft -c
// -f` and then `nft -f` into a fresh namespace: both must succeed (a node
// saving and restoring its ruleset must not fail on kpng's table, and a
// name must not write rules into a listing), and the reloaded table must
// list the same. The listing holds no NUL, CR or byte that is not UTF-8,
// and loading it makes no other table (one name writes a table of its
// own if it is not rewritten).
func TestKernelHostileNamesListingLoads(t *testing.T) {
	b := kernelTopology(t)
	s := newTestSink(t, b, "hostile")
	names := []string{
		`q"uote`, "new\nline", "n\x00ul", "semi;colon", "brace}", `back\slash`, "bad\xff\xfeutf8",
		"\"; flush ruleset; add table inet pwned { chain c { type filter hook input priority 0; drop; } } #",
		strings.Repeat("é", 90), strings.Repeat("日本", 40) + "\n}",
	}
	var state []*model.ServiceEndpoints
	for i, name := range names {
		port := &model.PortMapping{Name: "p\"\n;}" + name, Protocol: model.TCP, Port: 80, TargetPort: 6000}
		sv := svc("ns\"\n"+name, name, ipset(
			fmt.Sprintf("10.96.7.%d", i+1), fmt.Sprintf("fd00:10:96::7:%d", i+1)), port)
		sv.IPs.ExternalIPs = ipset(fmt.Sprintf("192.0.2.%d", i+1))
		sv.ClientIPAffinity = &model.ClientIPAffinity{TimeoutSeconds: 60}
		eps := podEndpoints(netns.PodID, netns.Pod2ID)
		for _, e := range eps {
			e.NodeName = "node\n" + name
		}
		state = append(state, &model.ServiceEndpoints{Service: sv, Endpoints: eps})
	}
	s.setAll(state...)
	s.sync()
	table := "kpng-hostile"
	listing := nftList(t, b.Node, table)
	for _, bad := range []string{"\x00", "\xff", "\r"} {
		if strings.Contains(listing, bad) {
			t.Errorf("the listing holds %q:\n%s", bad, listing)
		}
	}
	dst := netns.New(t, "reloaded")
	if _, stderr, err := dst.Exec([]byte(listing), "nft", "-c", "-f", "-"); err != nil {
		t.Fatalf("nft -c -f of the listing: %v\n%s\nlisting:\n%s", err, stderr, listing)
	}
	if _, stderr, err := dst.Exec([]byte(listing), "nft", "-f", "-"); err != nil {
		t.Fatalf("nft -f of the listing: %v\n%s\nlisting:\n%s", err, stderr, listing)
	}
	if out, _, err := dst.Exec(nil, "nft", "list", "tables"); err != nil || strings.TrimSpace(out) != "table ip "+table+"\ntable ip6 "+table {
		t.Errorf("tables after loading the listing: %q (%v), want only ip and ip6 %s", out, err, table)
	}
	again := nftList(t, dst, table)
	want, err := parseListing(listing)
	if err != nil {
		t.Fatalf("parse the listing: %v", err)
	}
	got, err := parseListing(again)
	if err != nil {
		t.Fatalf("parse the reloaded listing: %v", err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the reloaded table differs (-listed +reloaded):\n%s", diff)
	}
}
