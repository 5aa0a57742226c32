//go:build linux

package nft

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/google/nftables"

	"sigs.k8s.io/kpng/client/metrics"
	"sigs.k8s.io/kpng/internal/churn"
	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

// faultRig is what the fault tests share: a sink programming the table of
// name in a network namespace of its own, fed as kpng feeds it by a
// Feeder that retries after 300 ms and reports its rounds to a Recorder,
// holding the first 8 services of a seeded churn.
type faultRig struct {
	ns      *netns.NS
	name    string
	table   string
	opts    Options
	state   []*model.ServiceEndpoints
	rec     *metrics.Recorder
	results chan SyncResult
	sink    *Sink
	feeder  *localsink.Feeder
	newConn func(...nftables.ConnOption) (*nftables.Conn, error)
}

// newFaultRig makes the rig and applies its first state.
func newFaultRig(t *testing.T, name string, seed uint64) *faultRig {
	t.Helper()
	r := &faultRig{ns: netns.New(t, name), name: name, table: TableName(name),
		opts:    Options{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}},
		rec:     metrics.New(metrics.Options{ServiceProxyName: name}),
		results: make(chan SyncResult, 10)}
	gen := churn.New(seed, churnPools)
	for len(gen.State()) < 8 {
		gen.Round()
	}
	r.state = gen.State()
	r.newConn = connIn(t, r.ns)
	// The monitor is off: the rig's tests change the table by hand to
	// make the kernel reject a transaction, which it would repair first.
	s, err := New(context.Background(), Config{ServiceProxyName: name, Options: r.opts, Conn: r.newConn, Conntrack: conntrackIn(t, r.ns), NoMonitor: true,
		AfterSync: func(res SyncResult) { r.results <- res }})
	if err != nil {
		t.Fatal(err)
	}
	r.sink = s
	r.feeder = localsink.NewFeeder(s, localsink.FeederOptions{MinRetry: 300 * time.Millisecond, MaxRetry: time.Second, Observe: r.rec.Observe, Queued: r.rec.Queued})
	t.Cleanup(r.feeder.Close)
	r.feeder.SetAll(r.state)
	if err := r.feeder.Sync(); err != nil {
		t.Fatal(err)
	}
	<-r.results
	return r
}

// read reads the rig's table back from the kernel.
func (r *faultRig) read(t *testing.T) *kernelTable {
	t.Helper()
	return mustReadKernelTable(t, r.newConn, r.table)
}

// expectRetried checks what follows one failed round without a new one:
// the failure counted once, then the Feeder's retry, a successful full
// transaction, leaving the table as a fresh sink writes next, and counted
// as a retry round.
func (r *faultRig) expectRetried(t *testing.T, next []*model.ServiceEndpoints) {
	t.Helper()
	if got := counter(t, r.rec.Registry(), "kpng_sync_proxy_rules_failures_total", ""); got != 1 {
		t.Errorf("kpng_sync_proxy_rules_failures_total = %v, want 1", got)
	}
	select {
	case res := <-r.results:
		if res.Err != nil || !res.Full {
			t.Fatalf("the retry: %+v, want a successful full transaction", res)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no retry within 10 s")
	}
	if diff := diffKernelTables(freshKernelTable(t, r.name, r.opts, next), r.read(t)); diff != "" {
		t.Fatalf("after the retry (-fresh +sink):\n%s", diff)
	}
	deadline := time.Now().Add(5 * time.Second)
	for counter(t, r.rec.Registry(), "kpng_rounds_total", "retry") != 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // Observe follows AfterSync
	}
	if got := counter(t, r.rec.Registry(), "kpng_rounds_total", "retry"); got != 1 {
		t.Errorf("kpng_rounds_total{kind=retry} = %v, want 1", got)
	}
	if got := counter(t, r.rec.Registry(), "kpng_sync_proxy_rules_failures_total", ""); got != 1 {
		t.Errorf("kpng_sync_proxy_rules_failures_total = %v after the retry, want 1", got)
	}
}
