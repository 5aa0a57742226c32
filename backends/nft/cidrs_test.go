package nft

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"

	"sigs.k8s.io/kpng/model"
)

func TestMergedRanges(t *testing.T) {
	pfx := func(texts ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range texts {
			out = append(out, netip.MustParsePrefix(s))
		}
		out, _ = model.CanonicalCIDRs(out)
		return out
	}
	for _, tc := range []struct {
		in   []netip.Prefix
		want []string
	}{
		{pfx("10.96.0.0/16"), []string{"10.96.0.0/16"}},
		{pfx("10.96.0.0/16", "10.96.3.0/24"), []string{"10.96.0.0/16"}},
		{pfx("10.96.0.0/24", "10.96.1.0/24"), []string{"10.96.0.0/23"}},
		{pfx("10.96.0.0/24", "10.96.1.0/25"), []string{"10.96.0.0-10.96.1.127"}},
		{pfx("10.96.0.0/24", "10.96.2.0/24"), []string{"10.96.0.0/24", "10.96.2.0/24"}},
		{pfx("10.96.0.5/32"), []string{"10.96.0.5"}},
		// The families never merge, even where the bytes touch.
		{pfx("255.255.255.0/24", "::/128"), []string{"255.255.255.0/24", "::"}},
		{pfx("fd00:10:96::/108", "10.96.0.0/16"), []string{"10.96.0.0/16", "fd00:10:96::/108"}},
	} {
		var got []string
		for _, r := range mergedRanges(tc.in) {
			got = append(got, r.String())
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("mergedRanges(%v) (-want +got):\n%s", tc.in, diff)
		}
	}
}

// TestTrackerServiceCIDRs: a change of the service CIDRs gives the ranges
// that differ, and all of them (Now, from which cluster-ips-check is
// written again); none when they are the same.
func TestTrackerServiceCIDRs(t *testing.T) {
	tr := newTracker(Options{})
	facts := func(texts ...string) *model.Cluster {
		c := &model.Cluster{}
		for _, s := range texts {
			c.ServiceCIDRs = append(c.ServiceCIDRs, netip.MustParsePrefix(s))
		}
		return c
	}
	tr.SetCluster(facts("10.96.0.0/16", "fd00:10:96::/108"))
	if d := tr.Done(); len(d.ServiceCIDRs.Created) != 2 || d.Len() != 2 {
		t.Errorf("first round: %+v, %d changes; want the two ranges created", d.ServiceCIDRs, d.Len())
	}
	tr.SetCluster(facts("10.96.0.0/16", "fd00:10:96::/108"))
	if d := tr.Done(); d.Len() != 0 || d.ServiceCIDRs.Now != nil {
		t.Errorf("same facts: %d changes, Now %v; want none", d.Len(), d.ServiceCIDRs.Now)
	}
	tr.SetCluster(facts("10.96.0.0/15", "fd00:10:96::/108"))
	d := tr.Done()
	if d.Len() != 2 || d.ServiceCIDRs.Deleted[0].String() != "10.96.0.0/16" || d.ServiceCIDRs.Created[0].String() != "10.96.0.0/15" {
		t.Errorf("one range changed: %+v", d.ServiceCIDRs)
	}
	var now []string
	for _, r := range d.ServiceCIDRs.Now {
		now = append(now, r.String())
	}
	if diff := cmp.Diff([]string{"10.96.0.0/15", "fd00:10:96::/108"}, now); diff != "" {
		t.Errorf("one range changed: Now (-want +got):\n%s", diff)
	}
	tr.SetCluster(nil)
	if d := tr.Done(); len(d.ServiceCIDRs.Deleted) != 2 || len(d.ServiceCIDRs.Now) != 0 || len(tr.Ruleset("t").ServiceCIDRs) != 0 {
		t.Errorf("facts gone: %+v", d.ServiceCIDRs)
	}
}
