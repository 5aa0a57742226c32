//go:build linux

package conformance

import (
	"math"
	"testing"
)

// TestScenarios checks the kit's table: unique names, known features, a
// function each.
func TestScenarios(t *testing.T) {
	known := map[Feature]bool{UDP: true, SessionAffinity: true, ClientAddress: true, Masquerade: true,
		RejectUDP: true, SourceRanges: true, TopologyHints: true, KeepConnections: true, StaleUDPFlows: true,
		OtherFamilyAddresses: true, UndefinedPorts: true, ServiceCIDRs: true}
	names := map[string]bool{}
	for _, sc := range Scenarios() {
		if names[sc.Name] {
			t.Errorf("scenario %q twice", sc.Name)
		}
		names[sc.Name] = true
		if sc.run == nil {
			t.Errorf("scenario %q has no function", sc.Name)
		}
		for _, f := range sc.Needs {
			if !known[f] {
				t.Errorf("scenario %q needs unknown feature %q", sc.Name, f)
			}
		}
	}
	if len(names) < 15 {
		t.Errorf("%d scenarios, want the whole behaviour table", len(names))
	}
}

// TestChance checks the bounds of the random checks: spreadRequests(k)
// is the least number of requests leaving an endpoint unseen with
// probability below chance, and sure rounds of a coin leave it unturned
// with probability below chance.
func TestChance(t *testing.T) {
	unseen := func(k, n int) float64 { return float64(k) * math.Pow(1-1/float64(k), float64(n)) }
	for k := 2; k <= 5; k++ {
		n := spreadRequests(k)
		if unseen(k, n) >= chance || unseen(k, n-1) < chance {
			t.Errorf("spreadRequests(%d) = %d: unseen probability %g (with one less: %g), want the least n below %g", k, n, unseen(k, n), unseen(k, n-1), chance)
		}
	}
	if n := spreadRequests(2); n != 21 {
		t.Errorf("spreadRequests(2) = %d, want 21 (as the docs say)", n)
	}
	if p := math.Pow(0.5, sure-1); p >= chance {
		t.Errorf("2^-(sure-1) = %g, want below %g", p, chance)
	}
}
