//go:build linux

package iptables

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/localsink/sinktest"
	"sigs.k8s.io/kpng/model"
)

// call is one command the fake runner ran.
type call struct {
	Name  string
	Args  string
	Stdin string
}

// fakeRunner records the commands and answers from its tables: save
// output per binary and table, errors per binary.
type fakeRunner struct {
	calls []call
	save  map[string]string
	fail  map[string]error
}

// Run implements Runner.
func (r *fakeRunner) Run(_ context.Context, name string, args []string, stdin []byte) ([]byte, error) {
	r.calls = append(r.calls, call{Name: name, Args: strings.Join(args, " "), Stdin: string(stdin)})
	if err := r.fail[name]; err != nil {
		return nil, err
	}
	return []byte(r.save[name+" "+strings.Join(args, " ")]), nil
}

// take returns the calls since the last take.
func (r *fakeRunner) take() []call {
	c := r.calls
	r.calls = nil
	return c
}

// fakeJumper is the jumper of the tests without root.
type fakeJumper struct{}

func (j *fakeJumper) Remove(family, []jump) error { return nil }
func (j *fakeJumper) RandomFully(family) bool     { return true }
func (j *fakeJumper) CanaryIntact(family, string) (bool, error) {
	return true, nil
}

// jumpsOf returns the number of jumps from the built-in chains of the
// table that the restore input in names ("*nat\n…").
func jumpsOf(prefix, in string) int {
	table, _, _ := strings.Cut(strings.TrimPrefix(in, "*"), "\n")
	n := 0
	for _, j := range jumps(prefix) {
		if j.Table == table {
			n++
		}
	}
	return n
}

// names returns the binaries and arguments of calls.
func names(calls []call) []string {
	var out []string
	for _, c := range calls {
		out = append(out, strings.TrimSpace(c.Name+" "+c.Args))
	}
	return out
}

// TestSinkSync checks the commands of Syncs, without root: the first
// lists the chains and deletes a stale one, writes each family and table
// with the plan's restore input and ensures the jumps; the next one
// writes without listing and deletes the chains of a deleted service; a
// failed restore is returned and makes the next Sync a full one.
func TestSinkSync(t *testing.T) {
	prefix := ChainPrefix("test")
	stale := prefix + "SVC-OLDOLDOLDOLD"
	r := &fakeRunner{save: map[string]string{
		"iptables-legacy-save -t nat": "*nat\n:PREROUTING ACCEPT [0:0]\n:" + stale + " - [0:0]\n:KUBE-SERVICES - [0:0]\nCOMMIT\n",
	}}
	j := &fakeJumper{}
	// The counters cmd/kpng keeps with AfterSync.
	var failures, partialFailures int
	s := newSink(context.Background(), Config{ServiceProxyName: "test", Runner: r, AfterSync: func(res SyncResult) {
		if res.RestoreFailed {
			failures++
			if !res.Full {
				partialFailures++
			}
		}
	}}, VariantLegacy, j)

	web := &model.ServiceEndpoints{
		Service:   svc("web", ipset("10.96.0.10", "fd00:10:96::10"), port(model.UDP, 53, 5353)),
		Endpoints: []*model.Endpoint{ep("10.1.0.2", false)},
	}
	s.Update(web.Service.Key(), nil, web)
	if err := s.Sync(); err != nil {
		t.Fatalf("first Sync: %v", err)
	}
	// Each table listed just before its restore, nat first (a family's
	// DNAT is back before its filter table is even listed).
	want := []string{
		"iptables-legacy-save -t nat", "iptables-legacy-restore --noflush --wait",
		"iptables-legacy-save -t filter", "iptables-legacy-restore --noflush --wait",
		"ip6tables-legacy-save -t nat", "ip6tables-legacy-restore --noflush --wait",
		"ip6tables-legacy-save -t filter", "ip6tables-legacy-restore --noflush --wait",
	}
	calls := r.take()
	if diff := cmp.Diff(want, names(calls)); diff != "" {
		t.Fatalf("first Sync's commands (-want +got):\n%s", diff)
	}
	p, _ := s.planner.build([]*model.ServiceEndpoints{web})
	var inserts []string
	for _, j := range jumps(prefix) {
		if j.Table == "nat" {
			inserts = append(inserts, j.insertLine("test"))
		}
	}
	if got, want := calls[1].Stdin, string(restoreInput("nat", &p.Families[ipv4].NAT, []string{stale}, inserts...)); got != want {
		t.Errorf("IPv4 nat input:\n%s\nwant:\n%s", got, want)
	}
	if !strings.Contains(calls[1].Stdin, "\n-X "+stale+"\n") || strings.Contains(calls[1].Stdin, "KUBE-SERVICES") {
		t.Errorf("IPv4 nat input does not delete %s only:\n%s", stale, calls[1].Stdin)
	}
	for _, c := range calls {
		if strings.HasSuffix(c.Name, "-restore") && strings.Count(c.Stdin, "\n-I ") != jumpsOf(prefix, c.Stdin) {
			t.Errorf("%s: want the %d jumps of its table inserted:\n%s", c.Name, jumpsOf(prefix, c.Stdin), c.Stdin)
		}
	}

	// A partial round: no listing, no jumps; the service's chains deleted.
	s.Update(web.Service.Key(), web, nil)
	if err := s.Sync(); err != nil {
		t.Fatalf("second Sync: %v", err)
	}
	calls = r.take()
	// IPv4: the nat table and the filter table (its cluster IP check);
	// IPv6: the filter table (web rejected there: no IPv6 endpoint; and
	// its cluster IP check).
	if diff := cmp.Diff([]string{"iptables-legacy-restore --noflush --wait", "iptables-legacy-restore --noflush --wait", "ip6tables-legacy-restore --noflush --wait"}, names(calls)); diff != "" {
		t.Fatalf("second Sync's commands (-want +got):\n%s", diff)
	}
	var svcChain string
	for _, c := range p.Families[ipv4].NAT.Chains {
		if strings.HasPrefix(c.Name, prefix+kindCluster+"-") {
			svcChain = c.Name
		}
	}
	if !strings.Contains(calls[0].Stdin, "\n-X "+svcChain+"\n") {
		t.Errorf("the deleted service's chain %s is not deleted:\n%s", svcChain, calls[0].Stdin)
	}
	for _, c := range calls {
		if strings.Contains(c.Stdin, "\n-I ") {
			t.Errorf("jumps inserted again in a partial round:\n%s", c.Stdin)
		}
	}

	// A failed restore: the error names the table, the next Sync lists
	// the chains again and ensures the jumps.
	r.fail = map[string]error{"ip6tables-legacy-restore": errors.New("line 3 failed")}
	s.Update(web.Service.Key(), nil, web)
	err := s.Sync()
	if err == nil || !strings.Contains(err.Error(), "IPv6 table filter") || !strings.Contains(err.Error(), "line 3 failed") {
		t.Fatalf("Sync with a failing ip6tables-restore: %v, want the IPv6 filter table's error", err)
	}
	if f, p := failures, partialFailures; f != 1 || p != 1 {
		t.Errorf("after a failed partial restore: %v restore failures, %v partial ones; want 1 and 1", f, p)
	}
	r.take()
	// The full sync that follows fails too: counted, not as partial.
	if err := s.Sync(); err == nil {
		t.Fatal("full Sync with a failing ip6tables-restore: no error")
	}
	if f, p := failures, partialFailures; f != 2 || p != 1 {
		t.Errorf("after a failed full restore: %v restore failures, %v partial ones; want 2 and 1", f, p)
	}
	r.take()
	r.fail = nil
	if err := s.Sync(); err != nil {
		t.Fatalf("Sync after the failure: %v", err)
	}
	calls = r.take()
	if diff := cmp.Diff(want, names(calls)); diff != "" {
		t.Errorf("Sync after a failure: commands (-want +got):\n%s", diff)
	}
	for _, c := range calls {
		if strings.HasSuffix(c.Name, "-restore") && strings.Count(c.Stdin, "\n-I ") != jumpsOf(prefix, c.Stdin) {
			t.Errorf("after a failure, %s: want the %d jumps of its table inserted (the fake listing has none):\n%s", c.Name, jumpsOf(prefix, c.Stdin), c.Stdin)
		}
	}
}

// TestDetectVariant checks the choice of the variant with more rules.
func TestDetectVariant(t *testing.T) {
	rules := func(n int) string { return "*nat\n" + strings.Repeat("-A X -j RETURN\n", n) + "COMMIT\n" }
	for _, tc := range []struct {
		name    string
		save    map[string]string
		fail    map[string]error
		want    string
		wantErr bool
	}{
		{name: "nothing anywhere: nft", want: VariantNFT},
		{name: "legacy has more", save: map[string]string{"iptables-legacy-save ": rules(3), "ip6tables-nft-save ": rules(2)}, want: VariantLegacy},
		{name: "nft has more", save: map[string]string{"iptables-legacy-save ": rules(1), "ip6tables-nft-save ": rules(2)}, want: VariantNFT},
		{name: "equal: nft", save: map[string]string{"ip6tables-legacy-save ": rules(2), "iptables-nft-save ": rules(2)}, want: VariantNFT},
		{name: "legacy fails", save: map[string]string{"iptables-legacy-save ": rules(5)}, fail: map[string]error{"iptables-legacy-save": errors.New("no"), "ip6tables-legacy-save": errors.New("no")}, want: VariantNFT},
		{name: "everything fails", fail: map[string]error{"iptables-legacy-save": errors.New("a"), "ip6tables-legacy-save": errors.New("b"), "iptables-nft-save": errors.New("c"), "ip6tables-nft-save": errors.New("d")}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DetectVariant(context.Background(), &fakeRunner{save: tc.save, fail: tc.fail})
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("DetectVariant = %q, %v; want %q (error: %v)", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

// TestStaleFlows checks the UDP flows a change makes stale.
func TestStaleFlows(t *testing.T) {
	d := func(s string) dst { return dst{Family: ipv4, Proto: model.UDP, Addr: mustAddrPort(s)} }
	before := map[dst][]netip.AddrPort{
		d("10.96.0.10:53"): {mustAddrPort("10.1.0.2:5353"), mustAddrPort("10.1.0.3:5353")},
		d("10.96.0.11:53"): {mustAddrPort("10.1.0.4:53")},
	}
	after := map[dst][]netip.AddrPort{
		d("10.96.0.10:53"): {mustAddrPort("10.1.0.3:5353")},
		d("10.96.0.12:53"): {mustAddrPort("10.1.0.5:53")},
	}
	var got []string
	for _, f := range staleFlows(ipv4, before, after) {
		got = append(got, fmt.Sprintf("%s->%s", f.Dst, f.Endpoint))
	}
	want := []string{"10.96.0.10:53->10.1.0.2:5353", "10.96.0.11:53->10.1.0.4:53", "10.96.0.12:53->invalid AddrPort"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("stale flows (-want +got):\n%s", diff)
	}
}

func mustAddrPort(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// TestSinkPartialSync checks what a partial sync writes: only the chains
// whose rules changed (an endpoint removed: the service's SVC chain, two
// rules; not the dispatch, not the unchanged service web), nothing for a
// family without change; and that
// FullSyncPeriod makes a sync full again.
func TestSinkPartialSync(t *testing.T) {
	r := &fakeRunner{}
	j := &fakeJumper{}
	s := newSink(context.Background(), Config{ServiceProxyName: "test", Runner: r}, VariantNFT, j)
	web := &model.ServiceEndpoints{Service: svc("web", ipset("10.96.0.10", "fd00:10:96::10"), port(model.TCP, 80, 8080)), Endpoints: []*model.Endpoint{ep("10.1.0.2", false), ep("fd00:1::2", false)}}
	db := &model.ServiceEndpoints{Service: svc("db", ipset("10.96.0.20"), port(model.TCP, 5432, 5432)), Endpoints: []*model.Endpoint{ep("10.1.0.3", false), ep("10.1.0.4", false)}}
	s.Update(db.Service.Key(), nil, db)
	s.Update(web.Service.Key(), nil, web)
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	before, _ := s.planner.build([]*model.ServiceEndpoints{db, web})
	r.take()

	db2 := &model.ServiceEndpoints{Service: db.Service, Endpoints: db.Endpoints[:1]}
	s.Update(db.Service.Key(), db, db2)
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	calls := r.take()
	if diff := cmp.Diff([]string{"iptables-nft-restore --noflush --wait"}, names(calls)); diff != "" {
		t.Fatalf("partial sync's commands (-want +got):\n%s", diff)
	}
	after, _ := s.planner.build([]*model.ServiceEndpoints{db2, web})
	var written, deleted []string
	for _, line := range strings.Split(calls[0].Stdin, "\n") {
		if name, ok := strings.CutPrefix(line, ":"); ok {
			written = append(written, strings.Fields(name)[0])
		}
		if name, ok := strings.CutPrefix(line, "-X "); ok {
			deleted = append(deleted, name)
		}
	}
	var wantWritten, wantDeleted []string
	for _, c := range s.st.frags[db.Service.Key()].Families[ipv4].NAT.Chains {
		if strings.Contains(c.Name, "-"+kindCluster+"-") {
			wantWritten = append(wantWritten, c.Name)
		}
	}
	for _, c := range before.Families[ipv4].NAT.Chains {
		if _, ok := after.Families[ipv4].NAT.byName[c.Name]; !ok {
			wantDeleted = append(wantDeleted, c.Name)
		}
	}
	if len(wantWritten) != 1 || len(wantDeleted) != 0 {
		t.Fatalf("test bug: want one chain written (%v) and none deleted (%v)", wantWritten, wantDeleted)
	}
	if diff := cmp.Diff(wantWritten, written); diff != "" {
		t.Errorf("chains declared in the IPv4 nat input (-want +got):\n%s\n%s", diff, calls[0].Stdin)
	}
	if len(deleted) != 0 {
		t.Errorf("chains deleted: %v, want none", deleted)
	}
	if want := "-A " + wantWritten[0] + " -p tcp -j DNAT --to-destination 10.1.0.3:5432\n"; !strings.Contains(calls[0].Stdin, want) || strings.Count(calls[0].Stdin, "\n-A ") != 1 {
		t.Errorf("IPv4 nat input: want %q only:\n%s", want, calls[0].Stdin)
	}

	// web's IPv6 endpoint goes: only the IPv6 nat table is written, with
	// the dispatch unchanged.
	web2 := &model.ServiceEndpoints{Service: web.Service, Endpoints: web.Endpoints[:1]}
	s.Update(web.Service.Key(), web, web2)
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	calls = r.take()
	if len(calls) != 2 || calls[0].Name != "ip6tables-nft-restore" || calls[1].Name != "ip6tables-nft-restore" {
		t.Fatalf("IPv6 endpoint removed: %v, want the IPv6 nat (SVC chain gone) and filter (reject) restores", names(calls))
	}
	if !strings.Contains(calls[1].Stdin, "REJECT") {
		t.Errorf("IPv6 filter input without the reject rule:\n%s", calls[1].Stdin)
	}

	// A round after the full-sync period is full: listing, jumps.
	s.cfg.FullSyncPeriod = time.Nanosecond
	s.Update(web.Service.Key(), web2, &model.ServiceEndpoints{Service: web.Service})
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	if got := names(r.take()); len(got) != 8 {
		t.Errorf("sync after the full-sync period: %v; want a full sync", got)
	}
}

// goneCanary is a jumper whose canary chains are gone.
type goneCanary struct{ fakeJumper }

func (j *goneCanary) CanaryIntact(family, string) (bool, error) { return false, nil }

// TestCheckCanaryRetriesAndPeriodicSync: the check tries again a full sync
// that failed (kpng only retries the Syncs it made), and runs the periodic
// full sync when no Sync comes.
func TestCheckCanaryRetriesAndPeriodicSync(t *testing.T) {
	r := &fakeRunner{fail: map[string]error{}}
	s := newSink(context.Background(), Config{ServiceProxyName: "test", Runner: r}, VariantLegacy, &goneCanary{})
	web := webService("10.96.0.10")
	s.Update(web.Service.Key(), nil, web)
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	r.take()
	r.fail["iptables-legacy-restore"] = errors.New("transient")
	s.check() // the canary is gone; the rewrite fails
	if !s.needFull {
		t.Fatal("a failed full sync left needFull unset")
	}
	delete(r.fail, "iptables-legacy-restore")
	r.take()
	s.check()
	if calls := r.take(); len(calls) == 0 || s.needFull {
		t.Errorf("the check after a failed full sync: %d commands, needFull %v; want the full sync done", len(calls), s.needFull)
	}

	// The period ran out without a Sync (the canary intact).
	p := newSink(context.Background(), Config{ServiceProxyName: "test", Runner: r, FullSyncPeriod: time.Minute}, VariantLegacy, &fakeJumper{})
	p.Update(web.Service.Key(), nil, web)
	if err := p.Sync(); err != nil {
		t.Fatal(err)
	}
	r.take()
	listJumps(r, VariantLegacy, ChainPrefix("test"), nil)
	p.check()
	for _, c := range r.take() {
		if !strings.HasSuffix(c.Name, "-save") {
			t.Errorf("a check within the period, the canary and jumps there, ran %s %s", c.Name, c.Args)
		}
	}
	p.lastFull = p.lastFull.Add(-2 * time.Minute)
	p.check()
	if calls := r.take(); len(calls) == 0 || time.Since(p.lastFull) > time.Minute {
		t.Errorf("a check after the period: %v, last full sync %v ago; want a full sync", names(calls), time.Since(p.lastFull))
	}
}

// listJumps makes r's listings of the nat and filter tables of both
// families hold the jumps from the built-in chains but those of drop.
func listJumps(r *fakeRunner, variant, prefix string, drop *jump) {
	if r.save == nil {
		r.save = map[string]string{}
	}
	for _, f := range families {
		for _, table := range tables {
			var b strings.Builder
			for _, j := range jumps(prefix) {
				if j.Table == table && (drop == nil || j.From != drop.From || j.To != drop.To) {
					b.WriteString("-A " + j.From + " " + strings.Join(j.rule("test"), " ") + "\n")
				}
			}
			r.save[binary(variant, f, "-save")+" -t "+table] = b.String()
		}
	}
}

// TestCheckJumps: the check finds each jump from a built-in chain
// deleted (the canary chains intact, as after an iptables -D or a
// firewall's restore of its own chains) and rewrites every chain, which
// inserts the jump again; with every jump there, it writes nothing.
func TestCheckJumps(t *testing.T) {
	prefix := ChainPrefix("test")
	for _, gone := range jumps(prefix) {
		t.Run(gone.Table+" "+gone.From+" to "+gone.To, func(t *testing.T) {
			r := &fakeRunner{}
			s := newSink(context.Background(), Config{ServiceProxyName: "test", Runner: r}, VariantLegacy, &fakeJumper{})
			web := webService("10.96.0.10")
			s.Update(web.Service.Key(), nil, web)
			if err := s.Sync(); err != nil {
				t.Fatal(err)
			}
			listJumps(r, VariantLegacy, prefix, nil)
			r.take()
			s.check()
			for _, c := range r.take() {
				if !strings.HasSuffix(c.Name, "-save") {
					t.Fatalf("every jump there: the check ran %s %s", c.Name, c.Args)
				}
			}
			listJumps(r, VariantLegacy, prefix, &gone)
			s.check()
			inserted := false
			for _, c := range r.take() {
				if strings.HasSuffix(c.Name, "-restore") && strings.HasPrefix(c.Stdin, "*"+gone.Table+"\n") && strings.Contains(c.Stdin, gone.insertLine("test")) {
					inserted = true
				}
			}
			if !inserted {
				t.Errorf("the jump from %s %s to %s gone: the check did not insert it again", gone.Table, gone.From, gone.To)
			}
		})
	}
}

// TestChangeInputProportional checks that one endpoint change hands
// iptables-restore the same input at 100 and at 5,000 services: the
// change's size, not the table's (as a full rewrite of the dispatch or
// of every service would not).
func TestChangeInputProportional(t *testing.T) {
	input := func(n int) int {
		r := &countingRunner{}
		s := newSink(context.Background(), Config{ServiceProxyName: "prop", Runner: r}, VariantLegacy, &fakeJumper{})
		state := benchState(n, 10)
		for _, se := range state {
			s.Update(se.Service.Key(), nil, se)
		}
		if err := s.Sync(); err != nil {
			t.Fatal(err)
		}
		se := state[n/2]
		moved := &model.ServiceEndpoints{Service: se.Service, Endpoints: append([]*model.Endpoint{ep("10.200.0.1", false)}, se.Endpoints[1:]...)}
		r.bytes = 0
		s.Update(se.Service.Key(), se, moved)
		if err := s.Sync(); err != nil {
			t.Fatal(err)
		}
		return r.bytes
	}
	small, big := input(100), input(5000)
	// The same up to the length of names and addresses.
	if small == 0 || big > small+32 || big > 2000 {
		t.Errorf("one endpoint change: %d bytes of restore input at 100 services, %d at 5,000; want about the same, under 2 kB", small, big)
	}
}

// TestSinkProblems: the sink reports the problems of its plan
// (localsink.ProblemReporter), with the field and the reason, in key
// order, as of the last Sync: the Feeder puts them in the round's record;
// an address conflict is the loser's, and follows the owner when the
// first owner goes. Without root: a fake runner.
func TestSinkProblems(t *testing.T) {
	r := &fakeRunner{}
	s := newSink(context.Background(), Config{ServiceProxyName: "test", Runner: r}, VariantLegacy, &fakeJumper{})
	var rounds []localsink.Round
	c := sinktest.NewChecker(s)
	f := localsink.NewFeeder(c, localsink.FeederOptions{NoRetry: true, Observe: func(r localsink.Round) { rounds = append(rounds, r) }})
	defer f.Close()

	bad := svc("bad", ipset("10.96.0.99"), port(model.ProtocolUnknown, 1, 1), port(model.TCP, 70000, 1), port(model.TCP, 80, 8080), port(model.TCP, 80, 9090))
	bad.IPs.ExternalIPs = ipset("2001:db8::9") // no IPv6 cluster IP
	state := append(conflicts(), &model.ServiceEndpoints{Service: bad, Endpoints: []*model.Endpoint{ep("10.1.0.2", false)}})
	f.SetAll(state)
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	key := func(name string) model.ServiceKey { return model.ServiceKey{Namespace: "default", Name: name} }
	badProblems := []model.Problem{
		{Service: key("bad"), Field: "spec.ports[0].protocol", Reason: model.ReasonUnsupportedProtocol,
			Message: `service default/bad port "": protocol 0 (Unknown) not supported`},
		{Service: key("bad"), Field: "spec.ports[1].port", Reason: model.ReasonBadField,
			Message: `service default/bad port "": port 70000 out of range`},
		{Service: key("bad"), Field: "spec.ports[3]", Reason: model.ReasonBadField,
			Message: `service default/bad port "": protocol and port TCP/80 already used by port "": ignored`},
		{Service: key("bad"), Field: "spec.externalIPs", Reason: model.ReasonBadField,
			Message: "service default/bad: externalIPs: 2001:db8::9 ignored: the service has no IPv6 cluster IP (as kube-proxy)"},
	}
	conflict := func(loser, field, what, owner string) model.Problem {
		path := map[string]string{"clusterIPs": "spec.clusterIPs", "externalIPs": "spec.externalIPs", "nodePort": "spec.ports[0].nodePort"}[field]
		return model.Problem{Service: key(loser), Field: path, Reason: model.ReasonAddressConflict,
			Message: fmt.Sprintf("service default/%s: %s: %s/tcp already used by service default/%s: ignored", loser, field, what, owner)}
	}
	want := slices.Concat(
		[]model.Problem{conflict("b", "externalIPs", "192.0.2.1 80", "a"), conflict("b", "nodePort", "node port 30080", "a")},
		badProblems,
		[]model.Problem{conflict("c", "clusterIPs", "10.96.0.1 80", "a"), conflict("c", "externalIPs", "192.0.2.1 80", "a"), conflict("c", "nodePort", "node port 30080", "a")},
	)
	if diff := cmp.Diff(want, s.Problems()); diff != "" {
		t.Errorf("problems (-want +got):\n%s", diff)
	}
	if len(rounds) != 1 || !slices.Equal(rounds[0].Problems, want) || !slices.Equal(rounds[0].NewProblems, want) {
		t.Errorf("round records: %+v, want one with the problems, all new", rounds)
	}

	// a goes: c keeps the cluster IP, and loses the rest to b, first in
	// order after a.
	f.Update(key("a"), nil)
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	fresh := []model.Problem{conflict("c", "externalIPs", "192.0.2.1 80", "b"), conflict("c", "nodePort", "node port 30080", "b")}
	want = slices.Concat(badProblems, fresh)
	if diff := cmp.Diff(want, s.Problems()); diff != "" {
		t.Errorf("problems after a left (-want +got):\n%s", diff)
	}
	if len(rounds) != 2 || !slices.Equal(rounds[1].NewProblems, fresh) {
		t.Errorf("new problems after a left: %+v, want %+v", rounds[len(rounds)-1].NewProblems, fresh)
	}
	if err := c.Err(); err != nil {
		t.Errorf("Sink contract broken:\n%v", err)
	}
}
