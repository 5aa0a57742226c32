//go:build linux

package nft

import (
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/model"
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
	r := newFaultRig(t, "reject", 5)
	state := r.state

	// The round: the first service with a chain of its own deleted, a
	// new service, another service with one endpoint fewer.
	var deleted model.ServiceKey
	var deletedChain string
	for _, c := range r.sink.tracker.ChainNames() {
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

	// By hand: a rule jumping to the chain the round deletes (in a base
	// chain: the round may write the services chain again, for a shard
	// it adds or deletes).
	if _, stderr, err := r.ns.Exec(nil, "nft", "add", "rule", "ip", r.table, chainNATPrerouting, "jump", deletedChain); err != nil {
		t.Fatalf("nft add rule: %v: %s", err, stderr)
	}
	before := r.read(t)

	r.feeder.SetAll(next)
	err := r.feeder.Sync()
	if err == nil || !strings.Contains(err.Error(), "nothing of it applied") {
		t.Fatalf("Sync of the round the kernel rejects: %v, want the rejection", err)
	}
	if res := <-r.results; res.Err == nil || res.Full || res.Stats.ChainsAdded == 0 || res.Stats.ChainsDeleted == 0 {
		t.Fatalf("the rejected transaction: %+v, want a partial one creating and deleting chains", res)
	}
	if diff := diffKernelTables(before, r.read(t)); diff != "" {
		t.Fatalf("the rejected transaction left something in the kernel (-before +after):\n%s", diff)
	}
	// No new round: the Feeder's retry rewrites the table.
	r.expectRetried(t, next)
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
