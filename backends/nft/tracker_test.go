package nft

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"sigs.k8s.io/kpng/model"
)

// TestTrackerDeltaIsProportionalToTheChange checks, without the kernel,
// that one endpoint added to one of 100 services changes only elements
// (the block's intervals, the hairpin set), and that deleting the service
// removes exactly its objects.
func TestTrackerDeltaIsProportionalToTheChange(t *testing.T) {
	tr := newTracker(Options{})
	var items []*model.ServiceEndpoints
	for i := range 100 {
		se := &model.ServiceEndpoints{
			Service:   svc("ns", fmt.Sprintf("s%03d", i), ipset(fmt.Sprintf("10.96.%d.%d", i/200, 1+i%200)), tcp(80, 8080)),
			Endpoints: []*model.Endpoint{ep("10.1.0.2", false)},
		}
		items = append(items, se)
		tr.Update(se.Service.Key(), se)
	}
	if d := tr.Done(); len(d.Chains.Created) != 100 || len(d.Elements.Created) != 100 || len(d.Endpoints.Created) != 100 || len(d.Hairpin.Created) != 1 || len(d.Sets.Created) != (100+blocksPerMap-1)/blocksPerMap {
		t.Fatalf("first round: %d chains, %d elements, %d endpoint intervals, %d hairpin addresses, %d sets created; want 100, 100, 100, 1, and the endpoint maps of 100 blocks",
			len(d.Chains.Created), len(d.Elements.Created), len(d.Endpoints.Created), len(d.Hairpin.Created), len(d.Sets.Created))
	}
	se := items[42]
	changed := &model.ServiceEndpoints{Service: se.Service, Endpoints: append(se.Endpoints, ep("10.1.0.3", false))}
	tr.Update(se.Service.Key(), changed)
	d := tr.Done()
	if len(d.Endpoints.Updated) != 1 || len(d.Endpoints.Created) != 1 || len(d.Hairpin.Created) != 1 || d.Len() != 3 {
		t.Errorf("one endpoint added: %d intervals updated, %d created, %d hairpin addresses created, %d in all; want 1, 1, 1, 3",
			len(d.Endpoints.Updated), len(d.Endpoints.Created), len(d.Hairpin.Created), d.Len())
	}
	if got := d.Services(); len(got) != 1 || got[0] != se.Service.Key() {
		t.Errorf("Services() = %v", got)
	}
	tr.Update(se.Service.Key(), nil)
	d = tr.Done()
	if len(d.Chains.Deleted) != 1 || len(d.Endpoints.Deleted) != 2 || len(d.Elements.Deleted) != 1 || len(d.Hairpin.Deleted) != 1 || len(d.ClusterIPs.Deleted) != 1 || d.Len() != 6 {
		t.Errorf("service deleted: %d chains, %d intervals, %d elements, %d hairpin addresses, %d cluster IPs deleted, %d in all; want 1, 2, 1, 1, 1, 6",
			len(d.Chains.Deleted), len(d.Endpoints.Deleted), len(d.Elements.Deleted), len(d.Hairpin.Deleted), len(d.ClusterIPs.Deleted), d.Len())
	}
	if rs := tr.Ruleset("t"); len(rs.Chains) != 99 || len(rs.Elements) != 99 || len(rs.endpoints()) != 99 || len(rs.Hairpin) != 1 {
		t.Errorf("ruleset after deletion: %d chains, %d elements, %d intervals, %d hairpin addresses", len(rs.Chains), len(rs.Elements), len(rs.endpoints()), len(rs.Hairpin))
	}
}

// TestTrackerConflictOwnership checks that the first service to claim an
// address, protocol and port keeps it, including when it moves between
// maps, and that the key is free again once its owner lets it go.
func TestTrackerConflictOwnership(t *testing.T) {
	tr := newTracker(Options{})
	a := &model.ServiceEndpoints{Service: svc("ns", "a", ipset("10.96.0.1"), tcp(80, 80)), Endpoints: []*model.Endpoint{ep("10.1.0.2", false)}}
	b := &model.ServiceEndpoints{Service: svc("ns", "b", ipset("10.96.0.1"), tcp(80, 81)), Endpoints: []*model.Endpoint{ep("10.1.0.3", false)}}
	tr.Update(a.Service.Key(), a)
	if problems := tr.Update(b.Service.Key(), b); len(problems) != 1 || !strings.Contains(problems[0].Error(), "already used by service ns/a") {
		t.Errorf("conflict problems: %v", problems)
	}
	tr.Done()
	// a loses its endpoints: its element moves to the no-endpoint map and
	// a keeps the key.
	tr.Update(a.Service.Key(), &model.ServiceEndpoints{Service: a.Service})
	if problems := tr.Update(b.Service.Key(), b); len(problems) != 1 {
		t.Errorf("a still owns the key, want a conflict for b: %v", problems)
	}
	d := tr.Done()
	if len(d.Elements.Created) != 1 || d.Elements.Created[0].Value.Map != mapNoEndpoints(ipv4) || len(d.Elements.Deleted) != 1 {
		t.Errorf("moving to the no-endpoint map: %+v", d.Elements)
	}
	// a goes: b did not change, and gets the key in the same round.
	tr.Update(a.Service.Key(), nil)
	d = tr.Done()
	if len(d.Elements.Created) != 1 || d.Elements.Created[0].Value.Service != b.Service.Key() {
		t.Errorf("a let the key go: elements created %+v, want b's", d.Elements.Created)
	}
	rs := tr.Ruleset("t")
	if len(rs.Elements) != 1 || rs.Elements[0].Service != b.Service.Key() {
		t.Errorf("elements %+v, want b's only", rs.Elements)
	}
}

// TestChainNames checks that names are deterministic, differ with every
// part of the identity, and stay within the kernel's limit.
func TestChainNames(t *testing.T) {
	k := model.ServiceKey{Namespace: "ns", Name: "web"}
	p := tcp(80, 8080)
	n := serviceChainName("svc", ipv4, k, p)
	if n != serviceChainName("svc", ipv4, k, p) || !strings.HasPrefix(n, "svc4-") || !strings.HasSuffix(n, "-ns/web/tcp/80") {
		t.Errorf("service chain name %q", n)
	}
	seen := map[string]bool{}
	for _, name := range []string{
		n, serviceChainName("svc", ipv6, k, p), serviceChainName("ext", ipv4, k, p),
		serviceChainName("svc", ipv4, k, udp(80, 8080)), serviceChainName("svc", ipv4, k, tcp(81, 8080)),
		serviceChainName("svc", ipv4, model.ServiceKey{Namespace: "ns", Name: "web2"}, p),
		endpointChainName(ipv4, k, p, "10.1.0.2/8080"), endpointChainName(ipv4, k, p, "10.1.0.2/8081"),
	} {
		if seen[name] {
			t.Errorf("duplicate chain name %q", name)
		}
		seen[name] = true
	}
	long := model.ServiceKey{Namespace: strings.Repeat("n", 63), Name: strings.Repeat("s", 63)}
	a := endpointChainName(ipv6, long, p, strings.Repeat("f", 200)+"/1")
	b := endpointChainName(ipv6, long, p, strings.Repeat("f", 200)+"/2")
	if len(a) > maxNameLen || len(b) > maxNameLen || a == b {
		t.Errorf("long names: %d and %d bytes, equal %v", len(a), len(b), a == b)
	}
}

// nftIdentifier is the syntax of a name in nft's language (nftables
// 1.0.6, src/scanner.l): a listing prints names unquoted, and nft -f
// reads back only these.
var nftIdentifier = regexp.MustCompile(`^[a-zA-Z_.][a-zA-Z0-9/_.-]*$`)

// TestNamesReadBackByNft checks that every object of the golden cases
// (both families, every kind of chain and set, IPv6 endpoints among them)
// is named with nft's syntax for names and not with a keyword of it that
// the layout could use: what a listing must hold to be loaded back
// (TestKernelListingReloads loads them).
func TestNamesReadBackByNft(t *testing.T) {
	keywords := map[string]bool{"reject": true, "drop": true, "accept": true, "return": true, "jump": true, "goto": true, "masquerade": true}
	check := func(kind, name string) {
		if !nftIdentifier.MatchString(name) || keywords[name] {
			t.Errorf("%s %q: not a name nft reads back", kind, name)
		}
	}
	for _, c := range baseChains {
		check("base chain", c.name)
	}
	for _, lc := range lookupChains {
		check("chain", lc.name)
	}
	for _, name := range []string{chainReject, chainMasquerading, chainMarkForMasquerade, chainClusterIPsCheck, mapHairpin(ipv4), mapHairpin(ipv6),
		setClusterIPs(ipv4), setClusterIPs(ipv6), setServiceCIDRs(ipv4), setServiceCIDRs(ipv6)} {
		check("object", name)
	}
	for name, items := range goldenCases() {
		rs, _ := buildRuleset(TableName(name), goldenOptions[name], items)
		check("table", rs.Table)
		for _, c := range rs.Chains {
			check("chain", c.Name)
		}
		for _, s := range rs.Sets {
			check("set", s.Name)
		}
		for _, f := range []ipFamily{ipv4, ipv6} {
			for _, k := range mapKinds {
				check("map", k.name(f))
			}
		}
	}
}

// TestTrackerSlotTakenOver checks that a block taking, in one round, the
// slot of a deleted block with the same endpoint has its elements sent
// again: the kernel's copy of an element carries the comment of its
// block, which must name the new one.
func TestTrackerSlotTakenOver(t *testing.T) {
	tr := newTracker(Options{})
	eps := []*model.Endpoint{ep("10.1.0.2", false)}
	a := &model.ServiceEndpoints{Service: svc("ns", "a", ipset("10.96.0.1"), tcp(80, 8080)), Endpoints: eps}
	b := &model.ServiceEndpoints{Service: svc("ns", "b", ipset("10.96.0.2"), tcp(80, 8080)), Endpoints: eps}
	tr.Update(a.Service.Key(), a)
	tr.Done()
	// In key order, as a round is delivered: a's slot is free when b
	// takes one.
	tr.Update(a.Service.Key(), nil)
	tr.Update(b.Service.Key(), b)
	d := tr.Done()
	if len(d.Blocks.Created) != 1 || d.Blocks.Created[0].Value.Slot != 0 {
		t.Fatalf("b's block: %+v, want it created on a's slot 0", d.Blocks.Created)
	}
	if len(d.Endpoints.Updated) != 1 || d.Endpoints.Updated[0].Value.Owner != ownerOf(d.Blocks.Created[0].Value.ID) {
		t.Fatalf("endpoint elements changed %+v, want a's element updated to b's", d.Endpoints)
	}
	comments := commentsOf([]*block{d.Blocks.Created[0].Value})
	if got, want := comments.of(d.Endpoints.Updated[0].Value), "svc4 ns/b/tcp/80"; got != want {
		t.Errorf("comment %q, want %q", got, want)
	}
}

// TestComments checks the comments of map elements: the service of a
// verdict map element, the chain kind and service port of an endpoint
// map element, and the cut at nft's 128 bytes (a longer comment does not
// load back).
func TestComments(t *testing.T) {
	// Longer than the API server allows (63 and 63): a state file may.
	long := model.ServiceKey{Namespace: strings.Repeat("n", 63), Name: strings.Repeat("s", 100)}
	el := mapElement{Service: long}
	if c := el.Comment(); len(c) != maxCommentLen || !strings.HasPrefix(c, long.String()[:100]) {
		t.Errorf("comment of %s: %q (%d bytes)", long, c, len(c))
	}
	if c := (mapElement{Service: model.ServiceKey{Namespace: "default", Name: "web"}}).Comment(); c != "default/web" {
		t.Errorf("comment %q", c)
	}
	bl := &block{ID: "ext6/" + portID(long, udp(53, 53))}
	if c := bl.Comment(); len(c) != maxCommentLen || !strings.HasPrefix(c, "ext6 "+long.Namespace) {
		t.Errorf("block comment %q (%d bytes)", c, len(c))
	}
}

// TestCommentsOfHostileNames: whatever a name holds (names from a state
// file or another controller are not checked by Kubernetes), a comment
// holds no quote, backslash, NUL, newline or other control character, is
// UTF-8 and at most 128 bytes, cut on a character boundary: nft lists it
// between quotes and must read it back.
func TestCommentsOfHostileNames(t *testing.T) {
	for _, name := range []string{
		"a\"b", "a\nb", "a\x00b", "a\\b", "a;b}", "\xff\xfe", "a\tb\rc", strings.Repeat("é", 100), strings.Repeat("x", 127) + "é",
		"\"; flush ruleset; \"", strings.Repeat("\u65e5", 60),
	} {
		key := model.ServiceKey{Namespace: "ns", Name: name}
		for _, c := range []string{mapElement{Service: key}.Comment(), (&block{ID: "svc4/" + portID(key, tcp(80, 80))}).Comment()} {
			if len(c) > maxCommentLen || !utf8.ValidString(c) || strings.ContainsAny(c, "\"\\\x00\n\r\t") {
				t.Errorf("name %q: comment %q (%d bytes)", name, c, len(c))
			}
		}
	}
	// A cut in a character drops the whole character.
	key := model.ServiceKey{Namespace: "ns", Name: strings.Repeat("x", 124) + "é"}
	if c := (mapElement{Service: key}).Comment(); c != "ns/"+strings.Repeat("x", 124) {
		t.Errorf("comment %q (%d bytes), want the é dropped whole", c, len(c))
	}
}

// TestNameSafe: object names keep only what nft reads back unquoted.
func TestNameSafe(t *testing.T) {
	for in, want := range map[string]string{
		"default/web/tcp/80":        "default/web/tcp/80",
		"ns/w/tcp/80__fd00::1/8080": "ns/w/tcp/80__fd00..1/8080",
		"ns/a\"b\n}; c\x00é/tcp/80": "ns/a_b____c__/tcp/80",
	} {
		if got := nameSafe(in); got != want {
			t.Errorf("nameSafe(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestTrackerDuplicatePort checks that a service listing the same protocol
// and port twice (the API server refuses it, other sources may not) gets
// one block, with a problem for the second port, and that deleting it
// releases its slot once: another service keeps its own slot and map.
func TestTrackerDuplicatePort(t *testing.T) {
	tr := newTracker(Options{})
	b := &model.ServiceEndpoints{Service: svc("ns", "b", ipset("10.96.0.2"), tcp(80, 80)), Endpoints: []*model.Endpoint{ep("10.1.0.2", false)}}
	dupPorts := svc("ns", "a", ipset("10.96.0.1"), tcp(80, 8080), tcp(80, 8080))
	dupPorts.Ports[1].Name = "again"
	a := &model.ServiceEndpoints{Service: dupPorts, Endpoints: []*model.Endpoint{ep("10.1.0.3", false)}}
	tr.Update(b.Service.Key(), b)
	problems := tr.Update(a.Service.Key(), a)
	if len(problems) != 1 || !strings.Contains(problems[0].Error(), `port "again": protocol and port TCP/80 already used`) {
		t.Errorf("problems: %v", problems)
	}
	tr.Done()
	tr.Update(a.Service.Key(), nil)
	if d := tr.Done(); len(d.Sets.Deleted) != 0 || len(d.Endpoints.Deleted) != 1 {
		t.Errorf("a deleted: %d sets, %d intervals deleted; want 0, 1", len(d.Sets.Deleted), len(d.Endpoints.Deleted))
	}
	c := &model.ServiceEndpoints{Service: svc("ns", "c", ipset("10.96.0.3"), tcp(80, 80)), Endpoints: []*model.Endpoint{ep("10.1.0.4", false)}}
	tr.Update(c.Service.Key(), c)
	tr.Done()
	slots := map[uint32]string{}
	for _, key := range tr.ServiceKeys() {
		for _, bl := range tr.services[key].Blocks {
			if other, ok := slots[bl.Slot]; ok {
				t.Errorf("slot %d held by %s and %s", bl.Slot, other, key)
			}
			slots[bl.Slot] = key.String()
		}
	}
	if len(slots) != 2 {
		t.Errorf("slots %v, want b's and c's", slots)
	}
}

// TestTrackerProblems: the problems of the services held, each naming its
// service, field and reason: a conflict is the loser's, whoever came
// first, and goes when the winner lets the address go; a bad field stays
// with its service until it changes.
func TestTrackerProblems(t *testing.T) {
	tr := newTracker(Options{})
	a := &model.ServiceEndpoints{Service: svc("ns", "a", ipset("10.96.0.1"), tcp(80, 80))}
	b := &model.ServiceEndpoints{Service: svc("ns", "b", ipset("10.96.0.1"), tcp(80, 81))}
	unknown := &model.PortMapping{Name: "s", Protocol: model.ProtocolUnknown, Port: 90}
	c := &model.ServiceEndpoints{Service: svc("ns", "c", ipset("10.96.0.3"), tcp(80, 80), unknown)}
	bKey := b.Service.Key()
	conflict := model.Problem{Service: bKey, Field: "spec.clusterIPs", Reason: model.ReasonAddressConflict}
	badProto := model.Problem{Service: c.Service.Key(), Field: "spec.ports[1].protocol", Reason: model.ReasonUnsupportedProtocol}
	check := func(what string, want ...model.Problem) {
		t.Helper()
		got := tr.Problems()
		for i := range got {
			got[i].Message = "" // compared apart
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: problems %+v, want %+v", what, got, want)
		}
	}
	// b first, then a, before it in key order: a takes the address.
	tr.Update(bKey, b)
	tr.Update(a.Service.Key(), a)
	tr.Update(c.Service.Key(), c)
	tr.Done()
	check("b yielded to a", conflict, badProto)
	if p := tr.Problems()[0].Message; p != "service ns/b: ipv4 10.96.0.1 . tcp . 80 is taken by service ns/a, first in order: ignored" {
		t.Errorf("the conflict's message: %q", p)
	}
	// b updated while a holds it: still a conflict, said by b itself.
	tr.Update(bKey, &model.ServiceEndpoints{Service: b.Service, Endpoints: []*model.Endpoint{ep("10.1.0.3", false)}})
	tr.Done()
	check("b updated", conflict, badProto)
	// a goes: b gets the address, its problem is gone.
	tr.Update(a.Service.Key(), nil)
	tr.Done()
	check("a gone", badProto)
	tr.Update(c.Service.Key(), nil)
	tr.Done()
	check("c gone")
}
