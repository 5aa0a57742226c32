package localsink_test

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

// recordSink is a Sink whose Sync fails while fail is set, that reports
// problems and takes trigger times.
type recordSink struct {
	countSink
	fail      bool
	problems  []model.Problem
	triggered map[model.ServiceKey][]time.Time
}

func (s *recordSink) Sync() error {
	s.syncs++
	if s.fail {
		return errors.New("cannot apply")
	}
	return nil
}
func (s *recordSink) Problems() []model.Problem { return s.problems }
func (s *recordSink) Triggered(key model.ServiceKey, times []time.Time) {
	if s.triggered == nil {
		s.triggered = map[model.ServiceKey][]time.Time{}
	}
	s.triggered[key] = append(s.triggered[key], times...)
}

// TestFeederTriggers: the trigger times of a change are in the record of
// the round that applies it, those of failed rounds included; the times of
// a service that did not change for the sink are dropped; a TriggerSink
// receives them with the change.
func TestFeederTriggers(t *testing.T) {
	var rounds []localsink.Round
	sink := &recordSink{}
	f := localsink.NewFeeder(sink, localsink.FeederOptions{NoRetry: true, Observe: func(r localsink.Round) { rounds = append(rounds, r) }})
	defer f.Close()
	at := func(s int) time.Time { return time.Unix(1000+int64(s), 0) }
	a, b := key("ns", "a"), key("ns", "b")
	a1 := svcEps(testService("ns", "a"), endpoints("10.0.0.1")...)
	b1 := svcEps(testService("ns", "b"), endpoints("10.0.0.2")...)

	// First round: a with a trigger time, b without.
	f.Update(a, a1)
	f.Update(b, b1)
	f.Triggered(a, at(1))
	_ = f.Sync()
	// a again, unchanged (a new but equal value), with a trigger time:
	// nothing is delivered, nothing is measured.
	f.Update(a, deepCopy([]*model.ServiceEndpoints{a1})[0])
	f.Triggered(a, at(2))
	_ = f.Sync()
	// b changes twice in one round (two times), then fails to apply.
	sink.fail = true
	b2 := svcEps(b1.Service, endpoints("10.0.0.3")...)
	f.Update(b, b2)
	f.Triggered(b, at(3))
	f.Triggered(b, at(4))
	_ = f.Sync()
	// a changes; the round applies, with b's times of the failed round.
	sink.fail = false
	f.Update(a, svcEps(a1.Service))
	f.Triggered(a, at(5))
	_ = f.Sync()

	want := []map[model.ServiceKey][]time.Time{
		{a: {at(1)}},
		nil, // failed
		{a: {at(5)}, b: {at(3), at(4)}},
	}
	if len(rounds) != len(want) {
		t.Fatalf("%d rounds, want %d", len(rounds), len(want))
	}
	for i, w := range want {
		if d := cmp.Diff(w, rounds[i].Triggers); d != "" {
			t.Errorf("round %d: Triggers (-want +got):\n%s", i, d)
		}
	}
	if rounds[1].PendingServices != 1 || rounds[1].PendingEndpoints != 2 || rounds[2].PendingServices != 0 {
		t.Errorf("pending changes: failed round %d/%d, applied round %d; want 1/2, 0", rounds[1].PendingServices, rounds[1].PendingEndpoints, rounds[2].PendingServices)
	}
	if d := cmp.Diff(map[model.ServiceKey][]time.Time{a: {at(1), at(5)}, b: {at(3), at(4)}}, sink.triggered); d != "" {
		t.Errorf("the TriggerSink got (-want +got):\n%s", d)
	}
	// Changes: the services of the Updates, with their new values.
	if got := rounds[2].Changes; len(got) != 1 || got[0].Key != a || len(got[0].Cur.Endpoints) != 0 {
		t.Errorf("Changes of the last round: %+v", got)
	}
}

// TestFeederEvents: the events behind a round and the first one's time;
// those of a round that changes nothing count in the next one.
func TestFeederEvents(t *testing.T) {
	var rounds []localsink.Round
	f := localsink.NewFeeder(&countSink{}, localsink.FeederOptions{NoRetry: true, Observe: func(r localsink.Round) { rounds = append(rounds, r) }})
	defer f.Close()
	a := key("ns", "a")
	a1 := svcEps(testService("ns", "a"))
	t0 := time.Unix(1000, 0)
	f.Update(a, a1)
	f.Seen(3, t0.Add(time.Second))
	f.Seen(1, t0)
	_ = f.Sync()
	f.Seen(2, t0.Add(2*time.Second)) // nothing changes: no round
	_ = f.Sync()
	f.Update(a, svcEps(a1.Service, endpoints("10.0.0.1")...))
	f.Seen(1, t0.Add(3*time.Second))
	_ = f.Sync()
	if len(rounds) != 2 {
		t.Fatalf("%d rounds, want 2", len(rounds))
	}
	if rounds[0].Events != 4 || !rounds[0].FirstEvent.Equal(t0) {
		t.Errorf("first round: %d events from %v, want 4 from %v", rounds[0].Events, rounds[0].FirstEvent, t0)
	}
	if rounds[1].Events != 3 || !rounds[1].FirstEvent.Equal(t0.Add(3*time.Second)) {
		t.Errorf("second round: %d events from %v, want 3 (2 that changed nothing) from %v", rounds[1].Events, rounds[1].FirstEvent, t0.Add(3*time.Second))
	}
}

// TestFeederProblems: the problems a sink reports are in each record, the
// new ones once.
func TestFeederProblems(t *testing.T) {
	var rounds []localsink.Round
	sink := &recordSink{}
	f := localsink.NewFeeder(sink, localsink.FeederOptions{NoRetry: true, Observe: func(r localsink.Round) { rounds = append(rounds, r) }})
	defer f.Close()
	a := key("ns", "a")
	p1 := model.Problem{Service: a, Field: "spec.ports[0].protocol", Reason: model.ReasonUnsupportedProtocol, Message: "one"}
	p2 := model.Problem{Service: a, Field: "spec.externalIPs", Reason: model.ReasonAddressConflict, Message: "two"}
	for i, problems := range [][]model.Problem{{p1}, {p1, p2}, {p2}, {p1, p2}} {
		sink.problems = problems
		f.Update(a, svcEps(testService("ns", "a"), endpoints("10.0.0."+string(rune('1'+i)))...))
		_ = f.Sync()
	}
	want := [][]model.Problem{{p1}, {p2}, nil, {p1}}
	for i, w := range want {
		if d := cmp.Diff(w, rounds[i].NewProblems); d != "" {
			t.Errorf("round %d: NewProblems (-want +got):\n%s", i, d)
		}
	}
	if d := cmp.Diff([]model.Problem{p1, p2}, rounds[3].Problems); d != "" {
		t.Errorf("Problems (-want +got):\n%s", d)
	}
}

// TestTeeProblemsAndTriggers: a tee reports its sinks' problems and passes
// trigger times on to those that take them.
func TestTeeProblemsAndTriggers(t *testing.T) {
	a := key("ns", "a")
	p := model.Problem{Service: a, Reason: model.ReasonBadField, Message: "bad"}
	withProblems := &recordSink{problems: []model.Problem{p}}
	tee := localsink.Tee(&countSink{}, withProblems)
	if got := tee.(localsink.ProblemReporter).Problems(); len(got) != 1 || got[0] != p {
		t.Errorf("tee problems: %v", got)
	}
	tee.(localsink.TriggerSink).Triggered(a, []time.Time{time.Unix(1, 0)})
	if len(withProblems.triggered[a]) != 1 {
		t.Errorf("the sink taking trigger times got %v", withProblems.triggered)
	}
}
