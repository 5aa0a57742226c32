package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestWatchSlicesResumes checks the tool's watch of EndpointSlices on a
// fake clientset: a watch the API server ends is watched again from the
// version of its last event, the events of both watches come in order,
// and an error event ends it, logged, with the channel closed.
func TestWatchSlicesResumes(t *testing.T) {
	c := fake.NewClientset()
	c.PrependReactor("list", "endpointslices", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, &discovery.EndpointSliceList{ListMeta: metav1.ListMeta{ResourceVersion: "10"}}, nil
	})
	watchers := []*watch.FakeWatcher{watch.NewFakeWithChanSize(4, false), watch.NewFakeWithChanSize(4, false)}
	var mu sync.Mutex
	var from []string
	c.PrependWatchReactor("endpointslices", func(a k8stesting.Action) (bool, watch.Interface, error) {
		mu.Lock()
		defer mu.Unlock()
		from = append(from, a.(k8stesting.WatchActionImpl).WatchRestrictions.ResourceVersion)
		if len(from) > len(watchers) {
			return true, nil, fmt.Errorf("watch %d: not expected", len(from))
		}
		return true, watchers[len(from)-1], nil
	})
	slice := func(rv string) *discovery.EndpointSlice {
		return &discovery.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "s00001", Namespace: "scale", ResourceVersion: rv}}
	}
	var logged []string
	w := &world{c: c, ns: "scale", logf: func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		logged = append(logged, fmt.Sprintf(format, args...))
	}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events, err := w.watchSlices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The first watch: one event, then the API server ends it.
	watchers[0].Add(slice("11"))
	watchers[0].Stop()
	// The second: one event, then an error.
	watchers[1].Modify(slice("12"))
	watchers[1].Error(&metav1.Status{Status: metav1.StatusFailure, Message: "too old resource version", Code: 410, Reason: metav1.StatusReasonExpired})

	var got []string
	timeout := time.After(30 * time.Second)
	for done := false; !done; {
		select {
		case ev, ok := <-events:
			if !ok {
				done = true
				break
			}
			got = append(got, ev.name+"@"+ev.version)
		case <-timeout:
			t.Fatalf("the channel is still open after the error event; events %v", got)
		}
	}
	if want := []string{"s00001@11", "s00001@12"}; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("events %v, want %v", got, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"10", "11"}; strings.Join(from, " ") != strings.Join(want, " ") {
		t.Errorf("watched from versions %q, want %q (the list's, then the last event's)", from, want)
	}
	if len(logged) != 1 || !strings.Contains(logged[0], "too old resource version") {
		t.Errorf("logged %q, want the watch's error once", logged)
	}
}
