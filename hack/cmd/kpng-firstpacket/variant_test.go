package main

import (
	"bufio"
	"os"
	"strings"
	"testing"
)

// runVariant applies the changes to the listing kpng's golden file
// two-services (nft's syntax, as `nft list table` writes it).
func runVariant(t *testing.T, changes ...string) (string, error) {
	t.Helper()
	data, err := os.ReadFile("../../../backends/nft/testdata/two-services.golden")
	if err != nil {
		t.Fatal(err)
	}
	on := map[string]bool{}
	for _, c := range changes {
		on[c] = true
	}
	var b strings.Builder
	w := bufio.NewWriter(&b)
	err = variant(w, strings.Split(strings.TrimRight(string(data), "\n"), "\n"), on, 10)
	_ = w.Flush()
	return b.String(), err
}

// TestVariantFilterJumps: the filter variants find kpng's base chain jumps
// as its listing writes them today (for new connections only): no-filter
// removes all three, filter-every makes the no-endpoint and firewall jumps
// every packet's; a change that finds nothing to change is an error, not
// a ruleset silently the same as kpng's.
func TestVariantFilterJumps(t *testing.T) {
	out, err := runVariant(t, "no-filter")
	if err != nil {
		t.Fatal(err)
	}
	for _, jump := range []string{"jump no-endpoint-services", "jump cluster-ips-check", "jump firewall-check"} {
		if strings.Contains(out, jump) {
			t.Errorf("no-filter: %q still in the listing", jump)
		}
	}
	out, err = runVariant(t, "filter-every")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"\t\tjump no-endpoint-services\n", "\t\tjump firewall-check\n", "\t\tct state new jump cluster-ips-check\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("filter-every: no line %q", want)
		}
	}
	if strings.Contains(out, "ct state new jump no-endpoint-services") {
		t.Error("filter-every: a no-endpoint jump still for new connections only")
	}
	// The golden file has no service of kpng-genstate's: nothing for
	// pick-map to change.
	if _, err := runVariant(t, "pick-map"); err == nil || !strings.Contains(err.Error(), "pick-map") {
		t.Errorf("pick-map on a listing without synthetic services: %v, want an error naming it", err)
	}
}
