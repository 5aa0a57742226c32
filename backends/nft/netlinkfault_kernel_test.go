//go:build linux

package nft

import (
	"errors"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"sigs.k8s.io/kpng/client/metrics"
	"sigs.k8s.io/kpng/client/model"
	"sigs.k8s.io/kpng/internal/churn"
	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/localsink"
)

// TestKernelNetlinkErrors injects the socket errors a busy or overrun
// netlink socket gives, through the relay's seam (faultFunc), into a
// partial transaction of a sink in a network namespace, fed by a Feeder
// as kpng feeds it:
//
//   - the send of the batch fails with EBUSY (nothing reached the
//     kernel): the table reads back exactly as before the round;
//   - the receive of the kernel's answers fails with ENOBUFS (an overrun:
//     the kernel applied the batch, its answers are lost): the table is
//     the round's whole, as a fresh sink writes it, since a netlink batch
//     is applied whole or not at all.
//
// Either way the Sync fails with the error, the round is counted as failed
// (kpng_sync_proxy_rules_failures_total), and the Feeder's retry (no new
// round) writes the whole table, which then reads back as a fresh sink's.
func TestKernelNetlinkErrors(t *testing.T) {
	netns.RequirePrivileged(t)
	for _, tc := range []struct {
		name string
		op   relayOp
		err  error
		// applied: the kernel holds the round after the failure (else
		// the state before it).
		applied bool
		// wantText is in the error: what it says of the kernel's state.
		wantText string
	}{
		{name: "busy on send", op: relaySend, err: os.NewSyscallError("sendmsg", unix.EBUSY), wantText: "nothing of it applied"},
		{name: "receive buffer overrun", op: relayReceive, err: os.NewSyscallError("recvmsg", unix.ENOBUFS), applied: true,
			wantText: "applied whole or not at all"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := netns.New(t, "nlfault")
			const name = "nlfault"
			table := TableName(name)
			opts := Options{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}}
			gen := churn.New(9, churnPools)
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
			// armed is how many more times the fault fires; injected
			// how many times it did.
			var armed, injected atomic.Int32
			s.(*sink).applier.fault = func(op relayOp) error {
				if op != tc.op || armed.Add(-1) < 0 {
					return nil
				}
				injected.Add(1)
				return tc.err
			}
			f := localsink.NewFeeder(s, localsink.FeederOptions{MinRetry: 300 * time.Millisecond, MaxRetry: time.Second, Observe: rec.Observe, Queued: rec.Queued})
			t.Cleanup(f.Close)
			f.SetAll(state)
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			<-results
			before := mustReadKernelTable(t, newConn, table)

			// The round: a service deleted, one endpoint fewer for
			// another, a new service.
			next := slices.Clone(state[1:])
			for i, se := range next {
				if len(se.Endpoints) > 1 {
					c := *se
					c.Endpoints = c.Endpoints[1:]
					next[i] = &c
					break
				}
			}
			next = append(next, &model.ServiceEndpoints{
				Service:   svc("churn", "zz-added", ipset("10.96.0.99", "fd00::99"), tcp(8080, 8080)),
				Endpoints: []*model.Endpoint{ep("10.1.0.1", true), ep("1100::1", false)},
			})
			fresh := freshKernelTable(t, name, opts, next)

			armed.Store(1)
			f.SetAll(next)
			err = f.Sync()
			var errno syscall.Errno
			if !errors.As(tc.err, &errno) || !errors.Is(err, errno) || !strings.Contains(err.Error(), tc.wantText) {
				t.Fatalf("Sync with the injected %v: %v, want that error, saying %q", tc.err, err, tc.wantText)
			}
			if got := injected.Load(); got != 1 {
				t.Fatalf("the fault fired %d times, want 1", got)
			}
			if r := <-results; r.Err == nil || r.Full {
				t.Fatalf("the failed transaction: %+v, want a failed partial one", r)
			}
			want, wantName := before, "the state before the round"
			if tc.applied {
				want, wantName = fresh, "the round's state"
			}
			if diff := diffKernelTables(want, mustReadKernelTable(t, newConn, table)); diff != "" {
				t.Fatalf("after the failure the table is not %s (-want +got):\n%s", wantName, diff)
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
			if diff := diffKernelTables(fresh, mustReadKernelTable(t, newConn, table)); diff != "" {
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
		})
	}
}
