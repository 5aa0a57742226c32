//go:build linux

package main

import (
	"context"
	"fmt"
	"time"

	discovery "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// sliceWatch is a watch of the benchmark's EndpointSlices of its own,
// beside the proxiers': when it receives an update is the API server's
// share of a change (write, watch cache, the stream to a client), with no
// proxier's code in it.
type sliceWatch struct {
	events chan watched
	cancel context.CancelFunc
	done   chan struct{}
}

// watched is an EndpointSlice event: when it was received, the slice's
// name and resource version.
type watched struct {
	at       time.Time
	name, rv string
}

// newSliceWatch starts watching the slices of the benchmark's namespace
// from now on: it lists to learn the resource version, then watches from
// it, again from the last version seen when the stream ends, and from a
// new list when that version is too old.
func newSliceWatch(c kubernetes.Interface) (*sliceWatch, error) {
	ctx, cancel := context.WithCancel(context.Background())
	list := func() (string, error) {
		l, err := c.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{Limit: 1})
		if err != nil {
			return "", fmt.Errorf("list endpointslices: %w", err)
		}
		return l.ResourceVersion, nil
	}
	rv, err := list()
	if err != nil {
		cancel()
		return nil, err
	}
	s := &sliceWatch{events: make(chan watched, 1<<16), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for ctx.Err() == nil {
			w, err := c.DiscoveryV1().EndpointSlices(ns).Watch(ctx, metav1.ListOptions{ResourceVersion: rv})
			if err != nil {
				if ctx.Err() == nil {
					logf("endpointslice watch: %v", err)
					time.Sleep(time.Second)
				}
				continue
			}
			for ev := range w.ResultChan() {
				at := time.Now()
				if ev.Type == watch.Error {
					if apierrors.IsResourceExpired(apierrors.FromObject(ev.Object)) || apierrors.IsGone(apierrors.FromObject(ev.Object)) {
						if rv, err = list(); err != nil && ctx.Err() == nil {
							logf("endpointslice watch: %v", err)
						}
					}
					break
				}
				sl, ok := ev.Object.(*discovery.EndpointSlice)
				if !ok {
					continue
				}
				rv = sl.ResourceVersion
				sendDropOldest(s.events, watched{at: at, name: sl.Name, rv: sl.ResourceVersion})
			}
			w.Stop()
		}
	}()
	return s, nil
}

// wait returns when the update of slice name to resource version rv was
// received.
func (s *sliceWatch) wait(name, rv string, timeout time.Duration) (time.Time, error) {
	deadline := time.After(timeout)
	for {
		select {
		case ev := <-s.events:
			if ev.name == name && ev.rv == rv {
				return ev.at, nil
			}
		case <-deadline:
			return time.Time{}, fmt.Errorf("no watch event for %s at version %s within %s", name, rv, timeout)
		}
	}
}

// close stops the watch.
func (s *sliceWatch) close() {
	s.cancel()
	<-s.done
}

// sendDropOldest sends v on ch, first dropping the oldest values when ch
// is full: ch's only sender never blocks on a reader that went away.
func sendDropOldest[T any](ch chan T, v T) {
	for {
		select {
		case ch <- v:
			return
		default:
			select {
			case <-ch:
			default:
			}
		}
	}
}
