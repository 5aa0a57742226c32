//go:build linux

package nft

import (
	"errors"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/model"
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
			r := newFaultRig(t, "nlfault", 9)
			state := r.state
			// armed is how many more times the fault fires; injected
			// how many times it did.
			var armed, injected atomic.Int32
			r.sink.applier.fault = func(op relayOp) error {
				if op != tc.op || armed.Add(-1) < 0 {
					return nil
				}
				injected.Add(1)
				return tc.err
			}
			before := r.read(t)

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
			armed.Store(1)
			r.feeder.SetAll(next)
			err := r.feeder.Sync()
			var errno syscall.Errno
			if !errors.As(tc.err, &errno) || !errors.Is(err, errno) || !strings.Contains(err.Error(), tc.wantText) {
				t.Fatalf("Sync with the injected %v: %v, want that error, saying %q", tc.err, err, tc.wantText)
			}
			if got := injected.Load(); got != 1 {
				t.Fatalf("the fault fired %d times, want 1", got)
			}
			if res := <-r.results; res.Err == nil || res.Full {
				t.Fatalf("the failed transaction: %+v, want a failed partial one", res)
			}
			want, wantName := before, "the state before the round"
			if tc.applied {
				want, wantName = freshKernelTable(t, r.name, r.opts, next), "the round's state"
			}
			if diff := diffKernelTables(want, r.read(t)); diff != "" {
				t.Fatalf("after the failure the table is not %s (-want +got):\n%s", wantName, diff)
			}
			// No new round: the Feeder's retry rewrites the table.
			r.expectRetried(t, next)
		})
	}
}
