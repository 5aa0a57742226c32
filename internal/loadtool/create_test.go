package loadtool

import (
	"context"
	"errors"
	"sync"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestCreateAllRetriesTimeouts: an object whose create times out is tried
// again and the load completes; a permanent error stops the load and is
// returned.
func TestCreateAllRetriesTimeouts(t *testing.T) {
	var mu sync.Mutex
	tries := map[int]int{}
	err := CreateAll(context.Background(), 20, 4, t.Logf, func(_ context.Context, i int) error {
		mu.Lock()
		defer mu.Unlock()
		tries[i]++
		if i%5 == 0 && tries[i] == 1 {
			return apierrors.NewInternalError(errors.New("etcdserver: request timed out"))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("CreateAll: %v", err)
	}
	for i := range 20 {
		want := 1
		if i%5 == 0 {
			want = 2
		}
		if tries[i] != want {
			t.Errorf("object %d tried %d times, want %d", i, tries[i], want)
		}
	}

	denied := apierrors.NewForbidden(schema.GroupResource{Resource: "services"}, "s3", errors.New("no"))
	err = CreateAll(context.Background(), 20, 2, t.Logf, func(_ context.Context, i int) error {
		if i == 3 {
			return denied
		}
		return nil
	})
	if !apierrors.IsForbidden(err) {
		t.Errorf("CreateAll = %v, want the Forbidden error", err)
	}
	full := apierrors.NewInternalError(errors.New("failed to allocate a serviceIP: range is full"))
	n := 0
	if err := Retry(context.Background(), func() error { n++; return full }); err == nil || n != 1 {
		t.Errorf("a permanent internal error: tried %d times (%v), want once", n, err)
	}
	if IgnoreExists(apierrors.NewAlreadyExists(schema.GroupResource{Resource: "services"}, "s")) != nil || IgnoreExists(denied) == nil {
		t.Error("IgnoreExists: want nil for AlreadyExists only")
	}
}
