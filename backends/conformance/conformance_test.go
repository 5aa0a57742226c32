//go:build linux

package conformance

import "testing"

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
