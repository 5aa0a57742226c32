package localsink_test

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/localsink/sinktest"
	"sigs.k8s.io/kpng/model"
)

// TestTee checks that every call reaches every sink in order, each seeing
// a valid stream, and that the retry after one sink failed reaches only
// that sink.
func TestTee(t *testing.T) {
	first, second := sinktest.NewChecker(nil), sinktest.NewChecker(nil)
	f, whole := newChecked(t, localsink.FeederOptions{MinRetry: 10 * time.Millisecond})
	whole.Next = localsink.Tee(first, second)
	a := svcEps(testService("ns", "a"), endpoints("10.0.0.1")...)
	b := svcEps(testService("ns", "b"))

	f.Update(key("ns", "a"), a)
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	second.FailSyncs(errors.New("boom"))
	f.Update(key("ns", "b"), b)
	if err := f.Sync(); err == nil {
		t.Fatalf("Sync with the second sink failing: %v, want an error", err)
	}
	whole.WaitSyncs(t, 3, 5*time.Second)
	if diff := cmp.Diff([]string{"Reset", "Update ns/a service +10.0.0.1", "Sync", "Update ns/b service", "Sync"}, first.TakeCalls()); diff != "" {
		t.Errorf("first sink (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"Reset", "Update ns/a service +10.0.0.1", "Sync", "Update ns/b service", "Sync failed", "Sync"}, second.TakeCalls()); diff != "" {
		t.Errorf("second sink (-want +got):\n%s", diff)
	}
	for i, c := range []*sinktest.Checker{first, second} {
		if err := c.Err(); err != nil {
			t.Errorf("sink %d: contract broken: %v", i+1, err)
		}
		if diff := cmp.Diff([]*model.ServiceEndpoints{a, b}, c.State()); diff != "" {
			t.Errorf("sink %d state (-want +got):\n%s", i+1, diff)
		}
	}
}

// TestTeeCluster checks that the cluster-level facts reach the sinks that
// want them, and that a sink without SetCluster is left out of a round of
// the facts alone.
func TestTeeCluster(t *testing.T) {
	wants, plain := sinktest.NewChecker(nil), &countSink{}
	f2 := localsink.NewFeeder(localsink.Tee(wants, plain), localsink.FeederOptions{NoRetry: true})
	defer f2.Close()
	f2.Update(key("ns", "a"), svcEps(testService("ns", "a")))
	_ = f2.Sync()
	f2.SetCluster(&model.Cluster{ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}})
	_ = f2.Sync()
	if diff := cmp.Diff([]string{"Reset", "Update ns/a service", "Sync", "SetCluster service CIDRs 10.96.0.0/16", "Sync"}, wants.TakeCalls()); diff != "" {
		t.Errorf("sink with SetCluster (-want +got):\n%s", diff)
	}
	if plain.syncs != 1 {
		t.Errorf("the sink without SetCluster got %d Syncs, want 1", plain.syncs)
	}
	if err := wants.Err(); err != nil {
		t.Error(err)
	}
}
