//go:build linux

package nft

import (
	"fmt"
	"testing"

	"sigs.k8s.io/kpng/model"
)

// TestCheckedChainsTakeTurns checks that the periodic check counts the
// rules of every regular chain in turn, checkChains at a time (each at
// least once in as many checks as it takes), with the
// numbers of rules the tracker holds, and follows the tracker when
// chains come and go.
func TestCheckedChainsTakeTurns(t *testing.T) {
	s := &Sink{tracker: newTracker(Options{NoShardMaps: true})}
	update := func(n int) {
		for i := range n {
			key := model.ServiceKey{Namespace: "ns", Name: fmt.Sprintf("s%03d", i)}
			svc := svc(key.Namespace, key.Name, ipset(fmt.Sprintf("10.96.%d.%d", i/200, 1+i%200)), tcp(80, 8080))
			s.tracker.Update(key, &model.ServiceEndpoints{Service: svc, Endpoints: []*model.Endpoint{ep("10.1.0.1", false), ep("10.1.0.2", false)}})
		}
		s.tracker.Done()
	}
	update(200)
	all := s.tracker.ChainNames()
	if len(all) < 2*checkChains {
		t.Fatalf("%d chains, want more than twice checkChains", len(all))
	}
	seen := map[chainKey]int{}
	for range (len(all) + checkChains - 1) / checkChains {
		batch := s.nextChecked()
		if len(batch) > checkChains {
			t.Fatalf("%d chains in one check, want at most %d", len(batch), checkChains)
		}
		for k, n := range batch {
			if _, want, _ := s.tracker.RuleCount(k.name); n != want || n == 0 {
				t.Errorf("chain %s: %d rules expected, the tracker has %d", k.name, n, want)
			}
			seen[k]++
		}
	}
	for _, name := range all {
		if k, _, _ := s.tracker.RuleCount(name); seen[k] == 0 {
			t.Errorf("chain %s not checked in one turn", name)
		}
	}
	// Fewer chains than a batch: each once per check.
	s.tracker, s.checkOrder, s.checkPos = newTracker(Options{}), nil, 0
	update(3)
	if batch, all := s.nextChecked(), s.tracker.ChainNames(); len(batch) != len(all) {
		t.Errorf("%d chains checked of %d", len(batch), len(all))
	}
}
