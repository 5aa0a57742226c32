package watcher_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	discovery "k8s.io/api/discovery/v1"

	"sigs.k8s.io/kpng/client/watcher"
	"sigs.k8s.io/kpng/internal/kubetest"
)

// TestWatchReadyAddresses: the ready addresses of one service's
// EndpointSlices (IPv4 and IPv6 slices, an address in two slices once, a
// not-ready endpoint left out, one without a ready condition kept, an FQDN
// slice left out), against the real API server, told whole the first time
// (not slice by slice), then each change: an endpoint becoming ready, a
// slice deleted. Another service's slices in the same namespace are not
// counted, and the function returns when its context ends.
func TestWatchReadyAddresses(t *testing.T) {
	cp.Require(t)
	kc := kubetest.Client{T: t, C: cp.Client()}
	ns := kubetest.Namespace(t, cp.Client())
	ctl := kc.CreateService(kubetest.Service(ns, "ctl", ""))
	other := kc.CreateService(kubetest.Service(ns, "other", ""))
	kc.CreateSlice(kubetest.Slice(ctl, "ctl-a", kubetest.EP{IP: "10.4.0.1"}, kubetest.EP{IP: "10.4.0.2", NotReady: true}))
	kc.CreateSlice(kubetest.Slice(ctl, "ctl-b", kubetest.EP{IP: "fd00::4"}))
	kc.CreateSlice(kubetest.Slice(ctl, "ctl-c", kubetest.EP{IP: "10.4.0.1"}))
	unknown := kubetest.Slice(ctl, "ctl-d", kubetest.EP{IP: "10.4.0.5"})
	unknown.Endpoints[0].Conditions.Ready = nil
	kc.CreateSlice(unknown)
	fqdn := kubetest.Slice(ctl, "ctl-e", kubetest.EP{IP: "ctl.example.com"})
	fqdn.AddressType = discovery.AddressTypeFQDN
	kc.CreateSlice(fqdn)
	kc.CreateSlice(kubetest.Slice(other, "other-a", kubetest.EP{IP: "10.4.0.9"}))

	ctx, cancel := context.WithCancel(context.Background())
	lists := make(chan []string, 16)
	done := make(chan error, 1)
	go func() {
		done <- watcher.WatchReadyAddresses(ctx, cp.Client(), ns, "ctl", func(a []string) {
			select {
			case lists <- a:
			case <-ctx.Done():
			}
		})
	}()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("WatchReadyAddresses: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("WatchReadyAddresses did not return within 30 s of its context's end")
		}
	}()
	// await waits for the list want (the first lists may be partial: the
	// informer hands the slices over one by one).
	await := func(what string, want ...string) {
		t.Helper()
		var last []string
		deadline := time.After(30 * time.Second)
		for {
			select {
			case last = <-lists:
				if cmp.Equal(want, last) {
					return
				}
			case <-deadline:
				t.Fatalf("%s: the last addresses were %q, want %q", what, last, want)
			}
		}
	}
	select {
	case first := <-lists:
		if diff := cmp.Diff([]string{"10.4.0.1", "10.4.0.5", "fd00::4"}, first); diff != "" {
			t.Errorf("the first list, not the whole first state (-want +got):\n%s", diff)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no list within 30 s")
	}
	kc.UpdateSlice(kubetest.Slice(ctl, "ctl-a", kubetest.EP{IP: "10.4.0.1"}, kubetest.EP{IP: "10.4.0.2"}))
	await("10.4.0.2 ready", "10.4.0.1", "10.4.0.2", "10.4.0.5", "fd00::4")
	kc.DeleteSlice(ns, "ctl-b")
	await("the IPv6 slice deleted", "10.4.0.1", "10.4.0.2", "10.4.0.5")

	if err := watcher.WatchReadyAddresses(ctx, cp.Client(), "", "ctl", func([]string) {}); err == nil {
		t.Error("no error without a namespace")
	}
}
