//go:build linux

package nft

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"sigs.k8s.io/kpng/client/metrics"
	"sigs.k8s.io/kpng/client/model"
	"sigs.k8s.io/kpng/internal/churn"
	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/localsink"
)

// TestKernelRejectedTransactionAtomic makes the kernel reject a partial
// transaction at its end, after it created a service's chains and elements,
// changed another's endpoints and deleted a third's map elements: a rule
// added by hand jumps to the chain the transaction deletes last, which
// the kernel refuses (EBUSY). Nothing of the transaction may stay: the
// table reads back exactly as before the round. The round is counted as
// failed (kpng_sync_proxy_rules_failures_total, through the Feeder's
// Observe as kpng wires it), retried by the Feeder without a new round,
// and the retry's full transaction (which also drops the rule added by
// hand) leaves the table as a fresh sink's.
func TestKernelRejectedTransactionAtomic(t *testing.T) {
	netns.RequirePrivileged(t)
	netns.RequireCommands(t, "nft")
	ns := netns.New(t, "reject")
	const name = "reject"
	table := TableName(name)
	opts := Options{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}}

	gen := churn.New(5, churnPools)
	for len(gen.State()) < 8 {
		gen.Round()
	}
	state := gen.State()

	rec := metrics.New(metrics.Options{ServiceProxyName: name})
	results := make(chan SyncResult, 10)
	newConn := connIn(t, ns)
	s, err := NewSink(Config{ServiceProxyName: name, Options: opts, Conn: newConn, Conntrack: conntrackIn(t, ns),
		AfterSync: func(r SyncResult) { results <- r }})
	if err != nil {
		t.Fatal(err)
	}
	f := localsink.NewFeeder(s, localsink.FeederOptions{MinRetry: 300 * time.Millisecond, MaxRetry: time.Second, Observe: rec.Observe, Queued: rec.Queued})
	t.Cleanup(f.Close)
	f.SetAll(state)
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	<-results

	// The round: the first service with a chain of its own deleted, a
	// new service, another service with one endpoint fewer.
	var deleted model.ServiceKey
	var deletedChain string
	for _, c := range s.(*sink).tracker.ChainNames() {
		for _, se := range state {
			if strings.HasPrefix(c, "svc4-") && strings.Contains(c, "-"+se.Service.Namespace+"/"+se.Service.Name+"/") {
				deleted, deletedChain = se.Service.Key(), c
				break
			}
		}
		if deletedChain != "" {
			break
		}
	}
	if deletedChain == "" {
		t.Fatal("no service with a chain of its own in the state")
	}
	next := slices.DeleteFunc(slices.Clone(state), func(se *model.ServiceEndpoints) bool { return se.Service.Key() == deleted })
	for i, se := range next {
		if len(se.Endpoints) > 1 {
			c := *se
			c.Endpoints = c.Endpoints[1:]
			next[i] = &c
			break
		}
	}
	added := &model.ServiceEndpoints{
		Service:   svc("churn", "zz-added", ipset("10.96.0.99", "fd00::99"), tcp(8080, 8080), udp(8080, 8080)),
		Endpoints: []*model.Endpoint{ep("10.1.0.1", true), ep("1100::1", false)},
	}
	next = append(next, added)

	// By hand: a rule jumping to the chain the round deletes.
	if _, stderr, err := ns.Exec(nil, "nft", "add", "rule", "inet", table, chainServices, "jump", deletedChain); err != nil {
		t.Fatalf("nft add rule: %v: %s", err, stderr)
	}
	before := mustReadKernelTable(t, newConn, table)

	f.SetAll(next)
	err = f.Sync()
	if err == nil || !strings.Contains(err.Error(), "nothing of it applied") {
		t.Fatalf("Sync of the round the kernel rejects: %v, want the rejection", err)
	}
	if r := <-results; r.Err == nil || r.Full || r.Stats.ChainsAdded == 0 || r.Stats.ChainsDeleted == 0 {
		t.Fatalf("the rejected transaction: %+v, want a partial one creating and deleting chains", r)
	}
	if diff := diffKernelTables(before, mustReadKernelTable(t, newConn, table)); diff != "" {
		t.Fatalf("the rejected transaction left something in the kernel (-before +after):\n%s", diff)
	}
	if got := counter(t, rec.Registry(), "kpng_sync_proxy_rules_failures_total", ""); got != 1 {
		t.Errorf("kpng_sync_proxy_rules_failures_total = %v, want 1", got)
	}

	// No new round: the Feeder's retry rewrites the table.
	select {
	case r := <-results:
		if r.Err != nil || !r.Full {
			t.Fatalf("the retry: %+v, want a successful full transaction", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no retry within 10 s")
	}
	if diff := diffKernelTables(freshKernelTable(t, name, opts, next), mustReadKernelTable(t, newConn, table)); diff != "" {
		t.Fatalf("after the retry (-fresh +sink):\n%s", diff)
	}
	deadline := time.Now().Add(5 * time.Second)
	for counter(t, rec.Registry(), "kpng_rounds_total", "retry") != 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // Observe follows AfterSync
	}
	if got := counter(t, rec.Registry(), "kpng_rounds_total", "retry"); got != 1 {
		t.Errorf("kpng_rounds_total{kind=retry} = %v, want 1", got)
	}
	if got := counter(t, rec.Registry(), "kpng_sync_proxy_rules_failures_total", ""); got != 1 {
		t.Errorf("kpng_sync_proxy_rules_failures_total = %v after the retry, want 1", got)
	}
}

// counter returns the value of the counter name (with the label kind, if
// not empty) in reg.
func counter(t *testing.T, reg *prometheus.Registry, name, kind string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, fam := range families {
		if fam.GetName() != name {
			continue
		}
		for _, m := range fam.GetMetric() {
			match := kind == ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == kind {
					match = true
				}
			}
			if match {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
