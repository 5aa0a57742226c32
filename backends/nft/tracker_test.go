package nft

import (
	"fmt"
	"maps"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"

	"sigs.k8s.io/kpng/diffstore"
	"sigs.k8s.io/kpng/model"
)

// nodePortSvc returns a NodePort service of one TCP port, 80 → 8080 on
// node port np: not plain, so served by service chains.
func nodePortSvc(ns, name, clusterIP string, np int32) *model.Service {
	s := svc(ns, name, ipset(clusterIP), &model.PortMapping{Protocol: model.TCP, Port: 80, TargetPort: 8080, NodePort: np})
	s.Type = "NodePort"
	return s
}

// TestTrackerDeltaIsProportionalToTheChange checks, without the kernel,
// that an endpoint replaced in one of 100 plain services (all in one
// shard) changes only elements (the endpoint's, the hairpin set), that an
// endpoint added moves the service to the next shard (its chain and map
// with it, the service's element and endpoints), and that deleting the
// service removes exactly its objects.
func TestTrackerDeltaIsProportionalToTheChange(t *testing.T) {
	tr := newTracker(Options{})
	var items []*model.ServiceEndpoints
	for i := range 100 {
		se := &model.ServiceEndpoints{
			Service:   svc("ns", fmt.Sprintf("s%03d", i), ipset(fmt.Sprintf("10.%d.%d.1", 96+i/16, i%16*16)), tcp(80, 8080)),
			Endpoints: []*model.Endpoint{ep("10.1.0.2", false)},
		}
		items = append(items, se)
		tr.Update(se.Service.Key(), se)
	}
	if d := tr.Done(); len(d.Chains.Created) != 1 || len(d.Elements.Created) != 100 || len(d.Endpoints.Created) != 100 || len(d.Hairpin.Created) != 1 || len(d.Sets.Created) != 2 {
		t.Fatalf("first round: %d chains, %d elements, %d endpoint elements, %d hairpin addresses, %d sets created; want 1 (shard 1's), 100 (the keys), 100, 1, 2 (shard 1's map and set)",
			len(d.Chains.Created), len(d.Elements.Created), len(d.Endpoints.Created), len(d.Hairpin.Created), len(d.Sets.Created))
	}
	se := items[42]
	tr.Update(se.Service.Key(), &model.ServiceEndpoints{Service: se.Service, Endpoints: []*model.Endpoint{ep("10.1.0.3", false)}})
	d := tr.Done()
	if len(d.Endpoints.Updated) != 1 || len(d.Hairpin.Created) != 1 || d.Len() != 2 {
		t.Errorf("one endpoint replaced: %d endpoint elements updated, %d hairpin addresses created, %d in all; want 1, 1, 2",
			len(d.Endpoints.Updated), len(d.Hairpin.Created), d.Len())
	}
	if got := d.Services(); len(got) != 1 || got[0] != se.Service.Key() {
		t.Errorf("Services() = %v", got)
	}
	tr.Update(se.Service.Key(), &model.ServiceEndpoints{Service: se.Service, Endpoints: []*model.Endpoint{ep("10.1.0.3", false), ep("10.1.0.4", false)}})
	d = tr.Done()
	if !slices.Equal(keysOf(d.Chains.Created), []string{"shard4-2"}) || len(d.Sets.Created) != 2 || len(d.Elements.Updated) != 1 ||
		len(d.Endpoints.Updated)+len(d.Endpoints.Created) != 2 || len(d.Hairpin.Created) != 1 || d.Len() != 7 {
		t.Errorf("one endpoint added: chains created %v, %d sets created, %d elements updated, %d endpoint elements updated and %d created, %d hairpin addresses created, %d in all; want shard4-2, 2 (its map and set), 1, 2 in all, 1, 7",
			keysOf(d.Chains.Created), len(d.Sets.Created), len(d.Elements.Updated), len(d.Endpoints.Updated), len(d.Endpoints.Created), len(d.Hairpin.Created), d.Len())
	}
	tr.Update(se.Service.Key(), nil)
	d = tr.Done()
	if d.Chains.Len() != 1 || d.Sets.Len() != 2 || len(d.Endpoints.Deleted) != 2 || len(d.Elements.Deleted) != 1 || len(d.Hairpin.Deleted) != 2 || len(d.ClusterIPs.Deleted) != 1 || d.Len() != 9 {
		t.Errorf("service deleted: %d chains, %d sets changed, %d endpoint elements, %d elements, %d hairpin addresses, %d cluster IPs deleted, %d in all; want 1, 2, 2, 1, 2, 1, 9",
			d.Chains.Len(), d.Sets.Len(), len(d.Endpoints.Deleted), len(d.Elements.Deleted), len(d.Hairpin.Deleted), len(d.ClusterIPs.Deleted), d.Len())
	}
	if rs := tr.Ruleset("t"); len(rs.Chains) != 1 || len(rs.Elements) != 99 || len(rs.endpoints()) != 99 || len(rs.Hairpin) != 1 {
		t.Errorf("ruleset after deletion: %d chains, %d elements, %d endpoint elements, %d hairpin addresses; want 1, 99, 99, 1", len(rs.Chains), len(rs.Elements), len(rs.endpoints()), len(rs.Hairpin))
	}
}

// TestTrackerShards checks the life of a shard and of the services in it:
// the first plain service port of N endpoints brings shard N's chain and
// map, the next of N endpoints only its elements; a service port whose
// number of endpoints changes moves to the shard of the new number; the
// last one gone takes a shard's chain and map away; a service port that
// stops being plain (a node port, more than maxShardEndpoints endpoints,
// session affinity) leaves the shards for a chain of its own, and comes
// back.
func TestTrackerShards(t *testing.T) {
	tr := newTracker(Options{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16")}})
	eps := []*model.Endpoint{ep("10.1.0.2", false), ep("10.1.0.3", false)}
	a := &model.ServiceEndpoints{Service: svc("ns", "a", ipset("10.96.0.7"), tcp(80, 8080)), Endpoints: eps}
	b := &model.ServiceEndpoints{Service: svc("ns", "b", ipset("10.96.16.7"), udp(53, 53)), Endpoints: eps}
	tr.Update(a.Service.Key(), a)
	d := tr.Done()
	if len(d.Chains.Created) != 1 || d.Chains.Created[0].Key != "shard4-2" || !slices.Equal(keysOf(d.Sets.Created), []string{"shard-endpoints-v4-2", "shard-ips-v4-2"}) ||
		len(d.Elements.Created) != 1 || len(d.Endpoints.Created) != 2 {
		t.Fatalf("first service of 2 endpoints: chains %v, sets %v, %d elements, %d endpoints; want shard4-2, shard-endpoints-v4-2 and shard-ips-v4-2, 1 (a's key), 2",
			keysOf(d.Chains.Created), keysOf(d.Sets.Created), len(d.Elements.Created), len(d.Endpoints.Created))
	}
	chain := d.Chains.Created[0].Value
	for i, want := range []string{"ip saddr != 10.0.0.0/16 jump mark-for-masquerade", "dnat ip to ip daddr . meta l4proto . tcp dport . numgen random mod 2 map @shard-endpoints-v4-2"} {
		if got := chain.Rules[i].String(); got != want {
			t.Errorf("shard chain's rule %d %q, want %q", i, got, want)
		}
	}
	if e := d.Elements.Created[0].Value; e.Key.String() != "10.96.0.7 . tcp . 80" || e.Verdict.String() != "goto shard4-2" || e.Verdict.Shard != 2 {
		t.Errorf("a's element %s : %s, want 10.96.0.7 . tcp . 80 : goto shard4-2", e.Key, e.Verdict)
	}
	var draws []uint32
	for _, it := range d.Endpoints.Created {
		first, last := it.Value.keys()
		if first != last || it.Value.Map() != "shard-endpoints-v4-2" {
			t.Errorf("endpoint element %+v: want one draw in shard-endpoints-v4-2", it.Value)
		}
		draws = append(draws, first)
	}
	if slices.Sort(draws); !slices.Equal(draws, []uint32{0, 1}) {
		t.Errorf("draws %v, want 0 and 1", draws)
	}
	tr.Update(b.Service.Key(), b)
	if d := tr.Done(); d.Chains.Len() != 0 || d.Sets.Len() != 0 || len(d.Elements.Created) != 1 || len(d.Endpoints.Created) != 2 {
		t.Errorf("second service of 2 endpoints: %d chains, %d sets, %d elements, %d endpoints changed; want 0, 0, 1 (b's key), 2", d.Chains.Len(), d.Sets.Len(), len(d.Elements.Created), len(d.Endpoints.Created))
	}
	// An endpoint replaced: one element's target, nothing else.
	moved := []*model.Endpoint{ep("10.1.0.2", false), ep("10.1.0.9", false)}
	tr.Update(b.Service.Key(), &model.ServiceEndpoints{Service: b.Service, Endpoints: moved})
	if d := tr.Done(); d.Chains.Len() != 0 || d.Sets.Len() != 0 || d.Elements.Len() != 0 || len(d.Endpoints.Updated) != 1 || len(d.Endpoints.Created)+len(d.Endpoints.Deleted) != 0 {
		t.Errorf("an endpoint of b replaced: %d chains, %d sets, %d elements, endpoints %d updated, %d created, %d deleted; want only 1 updated",
			d.Chains.Len(), d.Sets.Len(), d.Elements.Len(), len(d.Endpoints.Updated), len(d.Endpoints.Created), len(d.Endpoints.Deleted))
	}
	// a gets a node port: a chain of its own, its endpoints go from the
	// shard's map to an endpoint map; the shard keeps b.
	np := svc("ns", "a", ipset("10.96.0.7"), &model.PortMapping{Protocol: model.TCP, Port: 80, TargetPort: 8080, NodePort: 30080})
	np.Type = "NodePort"
	tr.Update(a.Service.Key(), &model.ServiceEndpoints{Service: np, Endpoints: eps})
	d = tr.Done()
	var toChain bool
	for _, it := range d.Elements.Updated {
		toChain = toChain || (it.Prev.Verdict.Shard > 0 && strings.HasPrefix(it.Value.Verdict.Goto, "svc4-"))
	}
	if !toChain || len(d.Endpoints.Deleted)+len(d.Endpoints.Updated) != 2 || len(d.Endpoints.Created)+len(d.Endpoints.Updated) != 2 || slices.Contains(keysOf(d.Chains.Deleted), "shard4-2") {
		t.Errorf("a with a node port: elements %+v, endpoints %d created, %d updated, %d deleted, chains deleted %v; want a's key to go to its chain, its 2 endpoints moved, shard4-2 kept",
			d.Elements, len(d.Endpoints.Created), len(d.Endpoints.Updated), len(d.Endpoints.Deleted), keysOf(d.Chains.Deleted))
	}
	for _, e := range tr.Ruleset("t").endpoints() {
		if e.Shard.Addr.IsValid() != (e.Shard.Port == 53) {
			t.Errorf("endpoint element %+v: only b's are in a shard map", e)
		}
	}
	// b gets a third endpoint: it moves to shard 3, shard 2 empties.
	three := append(slices.Clip(eps), ep("10.1.0.4", false))
	tr.Update(b.Service.Key(), &model.ServiceEndpoints{Service: b.Service, Endpoints: three})
	d = tr.Done()
	if !slices.Equal(keysOf(d.Chains.Created), []string{"shard4-3"}) || !slices.Equal(keysOf(d.Chains.Deleted), []string{"shard4-2"}) ||
		!slices.Equal(keysOf(d.Sets.Created), []string{"shard-endpoints-v4-3", "shard-ips-v4-3"}) || !slices.Equal(keysOf(d.Sets.Deleted), []string{"shard-endpoints-v4-2", "shard-ips-v4-2"}) {
		t.Errorf("b with 3 endpoints: chains created %v, deleted %v, sets created %v, deleted %v; want shard 3 for shard 2",
			keysOf(d.Chains.Created), keysOf(d.Chains.Deleted), keysOf(d.Sets.Created), keysOf(d.Sets.Deleted))
	}
	if len(d.Elements.Updated) != 1 || d.Elements.Updated[0].Value.Verdict.Goto != "shard4-3" {
		t.Errorf("b with 3 endpoints: elements %+v; want b's key updated to goto shard4-3", d.Elements)
	}
	var inThree int
	for _, e := range tr.Ruleset("t").endpoints() {
		if e.Map() == "shard-endpoints-v4-3" {
			inThree++
		} else if e.Shard.Addr.IsValid() {
			t.Errorf("endpoint element %+v left in %s", e, e.Map())
		}
	}
	if inThree != 3 {
		t.Errorf("%d endpoint elements in shard-endpoints-v4-3, want 3", inThree)
	}
	// b gets more endpoints than a shard takes: no shard is left.
	var many []*model.Endpoint
	for i := range maxShardEndpoints + 1 {
		many = append(many, ep(fmt.Sprintf("10.2.%d.%d", i/200, 1+i%200), false))
	}
	tr.Update(b.Service.Key(), &model.ServiceEndpoints{Service: b.Service, Endpoints: many})
	d = tr.Done()
	if !slices.Contains(keysOf(d.Chains.Deleted), "shard4-3") || !slices.Contains(keysOf(d.Sets.Deleted), "shard-endpoints-v4-3") || !slices.Contains(keysOf(d.Sets.Deleted), "shard-ips-v4-3") {
		t.Errorf("shard 3 empty: chains deleted %v, sets deleted %v; want its chain, map and set gone", keysOf(d.Chains.Deleted), keysOf(d.Sets.Deleted))
	}
	for _, e := range tr.Ruleset("t").Elements {
		if e.Verdict.Shard > 0 {
			t.Errorf("element %s in %s still goes to a shard", e.Key, e.Map)
		}
	}
	// Back to two endpoints, with session affinity: still a chain.
	sticky := svc("ns", "b", ipset("10.96.16.7"), udp(53, 53))
	sticky.ClientIPAffinity = &model.ClientIPAffinity{TimeoutSeconds: 60}
	tr.Update(b.Service.Key(), &model.ServiceEndpoints{Service: sticky, Endpoints: eps})
	if d := tr.Done(); d.Sets.Len() == 0 || slices.Contains(keysOf(d.Chains.Created), "shard4-2") {
		t.Errorf("b with affinity: chains created %v; want no shard", keysOf(d.Chains.Created))
	}
	tr.Update(b.Service.Key(), b)
	if d := tr.Done(); !slices.Contains(keysOf(d.Chains.Created), "shard4-2") {
		t.Errorf("b plain again: chains created %v; want shard4-2 back", keysOf(d.Chains.Created))
	}
}

// TestTrackerShardSwaps checks rounds in which service ports cross between
// shards: p (2 endpoints) and q (3) swapping their numbers leave both
// shards in place, only their elements and endpoints moving; p leaving
// shard 2 for 3 while r comes from 1 to 2 keeps shard 2 (no chain or set
// change for it) and empties shard 1.
func TestTrackerShardSwaps(t *testing.T) {
	tr := newTracker(Options{})
	eps := func(n int) []*model.Endpoint {
		var out []*model.Endpoint
		for i := range n {
			out = append(out, ep(fmt.Sprintf("10.1.0.%d", 2+i), false))
		}
		return out
	}
	state := map[model.ServiceKey]*model.ServiceEndpoints{}
	set := func(name, ip string, n int) {
		se := &model.ServiceEndpoints{Service: svc("ns", name, ipset(ip), tcp(80, 8080)), Endpoints: eps(n)}
		tr.Update(se.Service.Key(), se)
		state[se.Service.Key()] = se
	}
	set("p", "10.96.0.1", 2)
	set("q", "10.96.0.2", 3)
	tr.Done()
	set("p", "10.96.0.1", 3)
	set("q", "10.96.0.2", 2)
	d := tr.Done()
	if d.Chains.Len() != 0 || d.Sets.Len() != 0 || len(d.Elements.Updated) != 2 {
		t.Errorf("p and q swap shards: chains %+v, sets %+v, %d elements updated; want no chain or set change, 2 elements updated", d.Chains, d.Sets, len(d.Elements.Updated))
	}
	shardOfPort := func(rs *ruleset, port string) map[string]int {
		out := map[string]int{}
		for _, e := range rs.endpoints() {
			if e.Shard.Addr.String() == port {
				out[e.Map()]++
			}
		}
		return out
	}
	rs := tr.Ruleset("t")
	if got := shardOfPort(rs, "10.96.0.1"); len(got) != 1 || got["shard-endpoints-v4-3"] != 3 {
		t.Errorf("p's endpoint elements by map %v, want 3 in shard-endpoints-v4-3", got)
	}
	if got := shardOfPort(rs, "10.96.0.2"); len(got) != 1 || got["shard-endpoints-v4-2"] != 2 {
		t.Errorf("q's endpoint elements by map %v, want 2 in shard-endpoints-v4-2", got)
	}
	set("r", "10.96.0.3", 1)
	tr.Done()
	set("q", "10.96.0.2", 3) // leaves shard 2 for 3
	set("r", "10.96.0.3", 2) // leaves shard 1 (emptied) for 2
	d = tr.Done()
	if !slices.Equal(keysOf(d.Chains.Deleted), []string{"shard4-1"}) || len(d.Chains.Created) != 0 || !slices.Equal(keysOf(d.Sets.Deleted), []string{"shard-endpoints-v4-1", "shard-ips-v4-1"}) || len(d.Sets.Created) != 0 {
		t.Errorf("q out of shard 2 as r comes in: chains %+v, sets %+v; want only shard 1's chain, map and set deleted", d.Chains, d.Sets)
	}
	fresh, _ := buildRuleset("t", Options{}, slices.Collect(maps.Values(state)))
	if diff := cmp.Diff(canonicalize(fresh), canonicalize(tr.Ruleset("t")), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("the tracker differs from a fresh build (-fresh +incremental):\n%s", diff)
	}
}

// keysOf returns the keys of items.
func keysOf[V any](items []diffstore.Item[string, V]) []string {
	var out []string
	for _, it := range items {
		out = append(out, it.Key)
	}
	return out
}

// serviceElements returns the elements of its, as created or updated.
func serviceElements(its []diffstore.Item[string, mapElement]) []mapElement {
	var out []mapElement
	for _, it := range its {
		out = append(out, it.Value)
	}
	return out
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
	if c := serviceElements(d.Elements.Created); len(c) != 1 || c[0].Map != mapNoEndpoints(ipv4) || len(serviceElements(d.Elements.Deleted)) != 1 {
		t.Errorf("moving to the no-endpoint map: %+v", d.Elements)
	}
	if len(d.Blocks.Created) != 0 {
		t.Errorf("b has a block while a owns the key: %+v", d.Blocks.Created)
	}
	// a goes: b did not change, and gets the key in the same round, with
	// its block in the shard map.
	tr.Update(a.Service.Key(), nil)
	d = tr.Done()
	if c := serviceElements(d.Elements.Created); len(c) != 1 || c[0].Service != b.Service.Key() || len(d.Blocks.Created) != 1 || d.Blocks.Created[0].Value.Service != b.Service.Key() {
		t.Errorf("a let the key go: elements created %+v, blocks %+v, want b's", d.Elements.Created, d.Blocks.Created)
	}
	rs := tr.Ruleset("t")
	if els := rs.Elements; len(els) != 1 || els[0].Service != b.Service.Key() || els[0].Verdict.Goto != "shard4-1" {
		t.Errorf("elements %+v, want b's only, to shard4-1", rs.Elements)
	}
}

// TestTrackerConflictTakesTheShardBlock checks that a service taking a key
// from one after it in key order (which had it first) takes its place in
// the shard map: the other's block goes with its key, in the same round.
func TestTrackerConflictTakesTheShardBlock(t *testing.T) {
	tr := newTracker(Options{})
	a := &model.ServiceEndpoints{Service: svc("ns", "a", ipset("10.96.0.1"), tcp(80, 80)), Endpoints: []*model.Endpoint{ep("10.1.0.2", false)}}
	b := &model.ServiceEndpoints{Service: svc("ns", "b", ipset("10.96.0.1"), tcp(80, 81)), Endpoints: []*model.Endpoint{ep("10.1.0.3", false)}}
	tr.Update(b.Service.Key(), b)
	tr.Done()
	if problems := tr.Update(a.Service.Key(), a); len(problems) != 1 || !strings.Contains(problems[0].Error(), "taken by service ns/a") {
		t.Errorf("conflict problems: %v", problems)
	}
	d := tr.Done()
	if len(d.Blocks.Deleted) != 1 || d.Blocks.Deleted[0].Prev.Service != b.Service.Key() || len(d.Blocks.Created) != 1 || d.Blocks.Created[0].Value.Service != a.Service.Key() {
		t.Errorf("blocks deleted %+v, created %+v; want b's gone, a's come", d.Blocks.Deleted, d.Blocks.Created)
	}
	for _, e := range tr.Ruleset("t").endpoints() {
		if e.Target.Addr() != netip.MustParseAddr("10.1.0.2") {
			t.Errorf("interval %+v: want a's endpoint only", e)
		}
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
		setClusterIPs(ipv4), setClusterIPs(ipv6), chainNodePortReject(ipv4), chainNodePortReject(ipv6), chainNodePortDrop(ipv4), chainNodePortDrop(ipv6),
		shardsChainName(ipv4), shardsChainName(ipv6), shardSetName(ipv4, maxShardEndpoints), shardChainName(ipv6, maxShardEndpoints)} {
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
	// Node ports: service chains, their blocks in the endpoint maps.
	a := &model.ServiceEndpoints{Service: nodePortSvc("ns", "a", "10.96.0.1", 30001), Endpoints: eps}
	b := &model.ServiceEndpoints{Service: nodePortSvc("ns", "b", "10.96.0.2", 30002), Endpoints: eps}
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
	// Node ports: service chains, their blocks in the endpoint maps.
	b := &model.ServiceEndpoints{Service: nodePortSvc("ns", "b", "10.96.0.2", 30002), Endpoints: []*model.Endpoint{ep("10.1.0.2", false)}}
	dupPorts := nodePortSvc("ns", "a", "10.96.0.1", 30001)
	dupPorts.Ports = append(dupPorts.Ports, &model.PortMapping{Protocol: model.TCP, Port: 80, TargetPort: 8080, NodePort: 30003})
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
	c := &model.ServiceEndpoints{Service: nodePortSvc("ns", "c", "10.96.0.3", 30004), Endpoints: []*model.Endpoint{ep("10.1.0.4", false)}}
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

// TestTrackerEndpointChangeKeepsChains checks that an endpoint added to a
// service with chains (a node port) changes elements only: its chains,
// whose DNAT rule names the block's slot, are stored once the block is
// placed, and compare equal to themselves.
func TestTrackerEndpointChangeKeepsChains(t *testing.T) {
	tr := newTracker(Options{})
	s := nodePortSvc("ns", "a", "10.96.0.1", 30001)
	tr.Update(s.Key(), &model.ServiceEndpoints{Service: s, Endpoints: []*model.Endpoint{ep("10.1.0.2", false)}})
	tr.Done()
	tr.Update(s.Key(), &model.ServiceEndpoints{Service: s, Endpoints: []*model.Endpoint{ep("10.1.0.2", false), ep("10.1.0.3", false)}})
	if d := tr.Done(); d.Chains.Len() != 0 || d.Endpoints.Len() != 2 {
		t.Errorf("endpoint added: chains changed %v %v, %d intervals changed; want none, 2 (the first endpoint's shrunk, the second's)", keysOf(d.Chains.Updated), keysOf(d.Chains.Created), d.Endpoints.Len())
	}
}

// TestNoShardMaps checks Options.NoShardMaps (--shard-maps=false): a
// plain service gets its chain and block in an endpoint map, as before
// the shard maps, and no shard.
func TestNoShardMaps(t *testing.T) {
	se := &model.ServiceEndpoints{Service: svc("ns", "a", ipset("10.96.0.7"), tcp(80, 8080)), Endpoints: []*model.Endpoint{ep("10.1.0.2", false)}}
	for _, noShards := range []bool{false, true} {
		rs, _ := buildRuleset("t", Options{NoShardMaps: noShards}, []*model.ServiceEndpoints{se})
		var chains []string
		for _, c := range rs.Chains {
			chains = append(chains, c.Name)
		}
		sharded := len(rs.Blocks) == 1 && rs.Blocks[0].sharded()
		if want := "shard4-1"; noShards == slices.Contains(chains, want) || noShards == sharded {
			t.Errorf("NoShardMaps %v: chains %v, block sharded %v", noShards, chains, sharded)
		}
		if noShards && (len(chains) != 1 || !strings.HasPrefix(chains[0], "svc4-") || rs.Elements[0].Verdict.Goto != chains[0]) {
			t.Errorf("NoShardMaps: chains %v, elements %+v; want the service chain and its element", chains, rs.Elements)
		}
	}
}
