//go:build linux

package iptables

import (
	"fmt"
	"runtime"
	"slices"
	"strings"

	goipt "github.com/coreos/go-iptables/iptables"
	vnetns "github.com/vishvananda/netns"
)

// jumper removes the jumps (the sink inserts them in its restores), and
// says what the binary can do.
type jumper interface {
	Remove(f family, js []jump) error
	RandomFully(f family) bool
	// CanaryIntact reports whether the canary chain holds its rule in
	// the nat and filter tables of family f.
	CanaryIntact(f family, chain string) (bool, error)
}

// goIPTables is the jumper of the sink: github.com/coreos/go-iptables
// (which gives the variant's binary, its version, --wait handling and
// --random-fully detection), run in the network namespace netNS.
type goIPTables struct {
	name  string
	netNS string
	ipt   [2]*goipt.IPTables
}

// newGoIPTables returns the jumper of variant for both families.
func newGoIPTables(serviceProxyName, variant, netNS string) (*goIPTables, error) {
	g := &goIPTables{name: serviceProxyName, netNS: netNS}
	for _, f := range families {
		proto := goipt.ProtocolIPv4
		if f == ipv6 {
			proto = goipt.ProtocolIPv6
		}
		ipt, err := goipt.New(goipt.IPFamily(proto), goipt.Path(binary(variant, f, "")), goipt.Timeout(5))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", binary(variant, f, ""), err)
		}
		g.ipt[f] = ipt
	}
	return g, nil
}

// RandomFully implements jumper.
func (g *goIPTables) RandomFully(f family) bool { return g.ipt[f].HasRandomFully() }

// CanaryIntact implements jumper.
func (g *goIPTables) CanaryIntact(f family, chain string) (bool, error) {
	intact := true
	err := inNetNS(g.netNS, func() error {
		for _, table := range tables {
			ok, err := g.ipt[f].ChainExists(table, chain)
			if err == nil && ok {
				// The comment's quotes are restore syntax, not part of it.
				spec := slices.Clone(canaryRule)
				spec[3] = strings.Trim(spec[3], `"`)
				ok, err = g.ipt[f].Exists(table, chain, spec...)
			}
			if err != nil {
				return fmt.Errorf("%s: check the canary chain %s in table %s: %w", f, chain, table, err)
			}
			intact = intact && ok
		}
		return nil
	})
	return intact, err
}

// Remove implements jumper.
func (g *goIPTables) Remove(f family, js []jump) error {
	return inNetNS(g.netNS, func() error {
		for _, j := range js {
			// Without its target chain, the jump cannot exist (and
			// iptables cannot even check for it).
			exists, err := g.ipt[f].ChainExists(j.Table, j.To)
			if err != nil {
				return fmt.Errorf("%s: look for chain %s in table %s: %w", f, j.To, j.Table, err)
			}
			if !exists {
				continue
			}
			if err := g.ipt[f].DeleteIfExists(j.Table, j.From, j.rule(g.name)...); err != nil {
				return fmt.Errorf("%s: delete the jump from %s %s to %s: %w", f, j.Table, j.From, j.To, err)
			}
		}
		return nil
	})
}

// inNetNS runs fn in the network namespace at path (the current one when
// path is empty), on an OS thread locked to it meanwhile: the processes
// fn starts are in that namespace.
func inNetNS(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := vnetns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("the current network namespace: %w", err)
			return
		}
		defer orig.Close()
		ns, err := vnetns.GetFromPath(path)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("network namespace %s: %w", path, err)
			return
		}
		defer ns.Close()
		if err := vnetns.Set(ns); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter network namespace %s: %w", path, err)
			return
		}
		err = fn()
		// Back in the original namespace, the thread is reused; if it
		// cannot go back, it stays locked and the runtime ends it with
		// the goroutine. (Ending threads needlessly is not free either:
		// a child started with Pdeathsig from a thread dies with it.)
		if berr := vnetns.Set(orig); berr == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}
