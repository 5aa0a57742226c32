package localsink

import (
	"errors"
	"fmt"
	"time"

	"sigs.k8s.io/kpng/model"
)

// Tee returns a Sink that forwards every call to each of sinks, in order:
// several backends fed by one source (rules and a health server, say).
//
// The tee is a ClusterSink: the cluster-level facts reach the sinks that
// implement ClusterSink.
//
// Its Sync fails when any sink's does; the error names the sink. The retry
// that follows reaches only the sinks that failed, with the newer changes
// when there are some (every sink gets those). A sink that asks for the
// whole state (ErrResync) gets it with a Reset, and so do the others.
// The tee reports the problems of the sinks that report some
// (ProblemReporter) and passes trigger times to those that take them
// (TriggerSink).
func Tee(sinks ...Sink) Sink {
	t := &tee{branches: make([]teeBranch, len(sinks))}
	for i, s := range sinks {
		t.branches[i].sink = s
	}
	return t
}

type tee struct{ branches []teeBranch }

var _ ClusterSink = (*tee)(nil)

// teeBranch is one sink of a tee: called says it got a Reset or an Update
// in this round, failed that its last Sync failed; it needs a Sync when
// either is true.
type teeBranch struct {
	sink           Sink
	called, failed bool
}

func (t *tee) Reset() {
	for i := range t.branches {
		t.branches[i].called = true
		t.branches[i].sink.Reset()
	}
}

// SetCluster implements ClusterSink: the sinks that want the facts get
// them.
func (t *tee) SetCluster(c *model.Cluster) {
	for i := range t.branches {
		if cs, ok := t.branches[i].sink.(ClusterSink); ok {
			t.branches[i].called = true
			cs.SetCluster(c)
		}
	}
}

func (t *tee) Update(key model.ServiceKey, prev, cur *model.ServiceEndpoints) {
	for i := range t.branches {
		t.branches[i].called = true
		t.branches[i].sink.Update(key, prev, cur)
	}
}

func (t *tee) Sync() error {
	var errs []error
	for i := range t.branches {
		b := &t.branches[i]
		if !b.called && !b.failed {
			continue // nothing new, and it applied what it has
		}
		b.called = false
		err := b.sink.Sync()
		b.failed = err != nil
		if err != nil {
			errs = append(errs, fmt.Errorf("sink %d of %d: %w", i+1, len(t.branches), err))
		}
	}
	return errors.Join(errs...)
}

// Problems implements ProblemReporter: the problems of every sink that
// reports some, in order.
func (t *tee) Problems() []model.Problem {
	var out []model.Problem
	for _, b := range t.branches {
		if pr, ok := b.sink.(ProblemReporter); ok {
			out = append(out, pr.Problems()...)
		}
	}
	return out
}

// Triggered implements TriggerSink: it passes the times to every sink
// that takes them.
func (t *tee) Triggered(key model.ServiceKey, times []time.Time) {
	for _, b := range t.branches {
		if ts, ok := b.sink.(TriggerSink); ok {
			ts.Triggered(key, times)
		}
	}
}
