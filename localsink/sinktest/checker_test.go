package sinktest

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

func se(name string, addrs ...string) *model.ServiceEndpoints {
	out := &model.ServiceEndpoints{Service: &model.Service{Namespace: "ns", Name: name}}
	for _, a := range addrs {
		set, _ := model.NewIPSet(a)
		out.Endpoints = append(out.Endpoints, &model.Endpoint{IPs: set, Ready: true})
	}
	return out
}

func k(name string) model.ServiceKey { return model.ServiceKey{Namespace: "ns", Name: name} }

func cidrs(texts ...string) *model.Cluster {
	c := &model.Cluster{}
	for _, t := range texts {
		c.ServiceCIDRs = append(c.ServiceCIDRs, netip.MustParsePrefix(t))
	}
	return c
}

// TestCheckerFindsViolations feeds the Checker call sequences that break
// one rule each, and a valid one.
func TestCheckerFindsViolations(t *testing.T) {
	a1, b1 := se("a", "10.0.0.1"), se("b")
	a2 := &model.ServiceEndpoints{Service: a1.Service, Endpoints: []*model.Endpoint{a1.Endpoints[0], se("x", "10.0.0.2").Endpoints[0]}}
	copyOfA1 := &model.ServiceEndpoints{Service: &model.Service{Namespace: "ns", Name: "a"}, Endpoints: a1.Endpoints}
	tests := []struct {
		name string
		run  func(c *Checker)
		want string // in the error; empty: no error
	}{
		{"valid", func(c *Checker) {
			c.Reset()
			c.Update(k("a"), nil, a1)
			c.Update(k("b"), nil, b1)
			_ = c.Sync()
			c.Update(k("a"), a1, a2)
			_ = c.Sync()
			c.Update(k("a"), a2, nil)
			_ = c.Sync()
		}, ""},
		{"no Reset first", func(c *Checker) { c.Update(k("a"), nil, a1); _ = c.Sync() }, "before the first Reset"},
		{"keys out of order", func(c *Checker) {
			c.Reset()
			c.Update(k("b"), nil, b1)
			c.Update(k("a"), nil, a1)
			_ = c.Sync()
		}, "in key order"},
		{"wrong prev", func(c *Checker) {
			c.Reset()
			c.Update(k("a"), nil, a1)
			_ = c.Sync()
			c.Update(k("a"), nil, a2)
			_ = c.Sync()
		}, "want what the sink holds"},
		{"prev after Reset", func(c *Checker) {
			c.Reset()
			c.Update(k("a"), nil, a1)
			_ = c.Sync()
			c.Reset()
			c.Update(k("a"), a1, a2)
			_ = c.Sync()
		}, "want what the sink holds"},
		{"unchanged delivered", func(c *Checker) {
			c.Reset()
			c.Update(k("a"), nil, a1)
			_ = c.Sync()
			c.Update(k("a"), a1, a1)
			_ = c.Sync()
		}, "unchanged service"},
		{"unchanged service not shared", func(c *Checker) {
			c.Reset()
			c.Update(k("a"), nil, a1)
			_ = c.Sync()
			c.Update(k("a"), a1, &model.ServiceEndpoints{Service: copyOfA1.Service, Endpoints: a2.Endpoints})
			_ = c.Sync()
		}, "new pointer"},
		{"endpoints unsorted", func(c *Checker) {
			c.Reset()
			c.Update(k("a"), nil, &model.ServiceEndpoints{Service: a1.Service, Endpoints: []*model.Endpoint{a2.Endpoints[1], a2.Endpoints[0]}})
			_ = c.Sync()
		}, "not sorted"},
		{"empty round", func(c *Checker) { c.Reset(); _ = c.Sync(); _ = c.Sync() }, "changes nothing"},
		{"value modified after delivery", func(c *Checker) {
			mine := se("a", "10.0.0.1")
			c.Reset()
			c.Update(k("a"), nil, mine)
			_ = c.Sync()
			mine.Service.Type = "NodePort"
		}, "modified after it was delivered"},
		{"no Reset after ErrResync", func(c *Checker) {
			c.FailSyncs(fmt.Errorf("x: %w", localsink.ErrResync))
			c.Reset()
			c.Update(k("a"), nil, a1)
			_ = c.Sync()
			c.Update(k("b"), nil, b1)
			_ = c.Sync()
		}, "did not start with Reset"},
		{"cluster facts: valid", func(c *Checker) {
			c.Reset()
			c.SetCluster(cidrs("10.96.0.0/16"))
			c.Update(k("a"), nil, a1)
			_ = c.Sync()
			c.SetCluster(cidrs("10.96.0.0/15"))
			_ = c.Sync()
			c.SetCluster(nil)
			_ = c.Sync()
			c.Reset()
			_ = c.Sync()
		}, ""},
		{"cluster facts after an Update", func(c *Checker) {
			c.Reset()
			c.Update(k("a"), nil, a1)
			c.SetCluster(cidrs("10.96.0.0/16"))
			_ = c.Sync()
		}, "before the round's Updates"},
		{"cluster facts unchanged", func(c *Checker) {
			c.Reset()
			c.SetCluster(cidrs("10.96.0.0/16"))
			_ = c.Sync()
			c.SetCluster(cidrs("10.96.0.0/16"))
			_ = c.Sync()
		}, "holds these facts already"},
		{"no cluster facts after Reset", func(c *Checker) {
			c.Reset()
			c.SetCluster(nil)
			_ = c.Sync()
		}, "Reset already forgot"},
		{"cluster facts twice in a round", func(c *Checker) {
			c.Reset()
			c.SetCluster(cidrs("10.96.0.0/16"))
			c.SetCluster(cidrs("10.96.0.0/15"))
			_ = c.Sync()
		}, "twice in a round"},
		{"cluster facts modified after delivery", func(c *Checker) {
			mine := cidrs("10.96.0.0/16")
			c.Reset()
			c.SetCluster(mine)
			_ = c.Sync()
			mine.ServiceCIDRs[0] = netip.MustParsePrefix("10.0.0.0/8")
		}, "cluster-level facts were modified"},
		{"Sync alone after a failure is fine", func(c *Checker) {
			c.FailSyncs(errors.New("boom"))
			c.Reset()
			c.Update(k("a"), nil, a1)
			_ = c.Sync()
			_ = c.Sync()
		}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := NewChecker(nil)
			tc.run(c)
			err := c.Err()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("unexpected violation: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}
