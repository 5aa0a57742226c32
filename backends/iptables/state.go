package iptables

import (
	"maps"
	"net/netip"
	"slices"

	"sigs.k8s.io/kpng/model"
)

// fragment is what one service adds to the plan, in both families,
// planned alone: its chains, its dispatch entries, the UDP destinations
// it reaches, the destinations it wants and those it lost to other
// services, and its problems.
type fragment struct {
	Families [2]familyPlan
	Problems []error
}

// state is the plan kept from round to round: the services, each one's
// fragment, and who owns each contended destination. A round re-plans
// only the services that changed, and those whose share of a contended
// destination changed with them: at 10,000 services, an endpoint change
// plans one service, not all.
type state struct {
	pl       planner
	services map[model.ServiceKey]*model.ServiceEndpoints
	// keys are the keys of services, sorted: the order of the chains,
	// and of ownership.
	keys  []model.ServiceKey
	frags map[model.ServiceKey]*fragment
	// claimants are, for each destination wanted, the services wanting
	// it, sorted: the first owns it.
	claimants map[dst][]model.ServiceKey
	// troubled are the services whose fragment has problems.
	troubled map[model.ServiceKey]bool
	// sharedPlans are the shared chains of each family (shared), valid
	// while sharedValid: until a fragment's dispatch entries change.
	sharedPlans [2]familyPlan
	sharedValid bool
	// serviceCIDRs are the cluster's service CIDRs, given to the default
	// proxier only (setCluster).
	serviceCIDRs []netip.Prefix
}

// setCluster records the cluster-level facts (nil: none); the shared
// chains follow at the next plan.
func (st *state) setCluster(c *model.Cluster) {
	var cidrs []netip.Prefix
	if c != nil {
		cidrs = c.ServiceCIDRs
	}
	if !slices.Equal(cidrs, st.serviceCIDRs) {
		st.serviceCIDRs = slices.Clone(cidrs)
		st.sharedValid = false
	}
}

// newState returns an empty state planned by pl.
func newState(pl planner) *state {
	return &state{
		pl:        pl,
		services:  map[model.ServiceKey]*model.ServiceEndpoints{},
		frags:     map[model.ServiceKey]*fragment{},
		claimants: map[dst][]model.ServiceKey{},
		troubled:  map[model.ServiceKey]bool{},
	}
}

// update re-plans the services whose keys are in changed (services
// holds their current state; a key missing there was deleted) and the
// services whose lost destinations changed with them. It returns the keys
// whose fragment was replaced or removed.
func (st *state) update(changed map[model.ServiceKey]bool) map[model.ServiceKey]bool {
	replaced := map[model.ServiceKey]bool{}
	// before are the fragments replaced, as they were.
	before := map[model.ServiceKey]*fragment{}
	var touched []dst
	var added []model.ServiceKey
	removed := map[model.ServiceKey]bool{}
	for k := range changed {
		if old := st.frags[k]; old != nil {
			for _, fp := range old.Families {
				for _, d := range fp.wants {
					st.unclaim(d, k)
					touched = append(touched, d)
				}
			}
			before[k] = old
			delete(st.frags, k)
			replaced[k] = true
		}
		se := st.services[k]
		if se == nil {
			if before[k] != nil {
				removed[k] = true
			}
			continue
		}
		if before[k] == nil {
			added = append(added, k)
		}
		// Planned first as if it owned everything it wants: that is how
		// its wants are known (they do not depend on what it owns).
		f := st.pl.fragment(se, [2]map[dst]model.ServiceKey{})
		st.frags[k] = f
		replaced[k] = true
		for _, fp := range f.Families {
			for _, d := range fp.wants {
				st.claim(d, k)
				touched = append(touched, d)
			}
		}
	}
	st.updateKeys(added, removed)
	// Every service wanting a touched destination may have won or lost
	// it: re-plan those whose lost destinations are not what their
	// fragment was planned with.
	recheck := maps.Clone(changed)
	for _, d := range touched {
		for _, k := range st.claimants[d] {
			recheck[k] = true
		}
	}
	for k := range recheck {
		f := st.frags[k]
		if f == nil {
			continue
		}
		lost := st.lost(k, f)
		if equalLost(lost, f) {
			continue
		}
		if _, ok := before[k]; !ok {
			before[k] = f
		}
		st.frags[k] = st.pl.fragment(st.services[k], lost)
		replaced[k] = true
	}
	for k := range replaced {
		f := st.frags[k]
		if f != nil && len(f.Problems) > 0 {
			st.troubled[k] = true
		} else {
			delete(st.troubled, k)
		}
		if st.sharedValid && !sameEntries(before[k], f) {
			st.sharedValid = false
		}
	}
	return replaced
}

// updateKeys adds the keys added to st.keys and removes the keys
// removed, keeping them sorted.
func (st *state) updateKeys(added []model.ServiceKey, removed map[model.ServiceKey]bool) {
	if len(removed) > 0 {
		st.keys = slices.DeleteFunc(st.keys, func(k model.ServiceKey) bool { return removed[k] })
	}
	if len(added) > 8 {
		st.keys = append(st.keys, added...)
		slices.SortFunc(st.keys, model.ServiceKey.Compare)
		return
	}
	for _, k := range added {
		i, _ := slices.BinarySearchFunc(st.keys, k, model.ServiceKey.Compare)
		st.keys = slices.Insert(st.keys, i, k)
	}
}

// sameEntries reports whether fragments a and b (either may be nil: no
// service) have the same dispatch entries and cluster IPs: whether the
// shared chains stay as they are.
func sameEntries(a, b *fragment) bool {
	if a == nil || b == nil {
		return a == b
	}
	for f := range a.Families {
		x, y := &a.Families[f], &b.Families[f]
		if !slices.Equal(x.NAT.entries, y.NAT.entries) || !slices.Equal(x.Filter.entries, y.Filter.entries) || !slices.Equal(x.clusterIPs, y.clusterIPs) ||
			!slices.Equal(x.NAT.portEntries, y.NAT.portEntries) || !slices.Equal(x.Filter.portEntries, y.Filter.portEntries) {
			return false
		}
	}
	return true
}

// claim records that service k wants d.
func (st *state) claim(d dst, k model.ServiceKey) {
	ks := st.claimants[d]
	i, found := slices.BinarySearchFunc(ks, k, model.ServiceKey.Compare)
	if !found {
		st.claimants[d] = slices.Insert(ks, i, k)
	}
}

// unclaim records that service k no longer wants d.
func (st *state) unclaim(d dst, k model.ServiceKey) {
	ks := st.claimants[d]
	if i, found := slices.BinarySearchFunc(ks, k, model.ServiceKey.Compare); found {
		ks = slices.Delete(ks, i, i+1)
	}
	if len(ks) == 0 {
		delete(st.claimants, d)
		return
	}
	st.claimants[d] = ks
}

// lost returns, per family, the destinations the fragment f of service
// k wants that another service owns, with their owner.
func (st *state) lost(k model.ServiceKey, f *fragment) [2]map[dst]model.ServiceKey {
	var out [2]map[dst]model.ServiceKey
	for i, fp := range f.Families {
		for _, d := range fp.wants {
			ks := st.claimants[d]
			if len(ks) == 0 || ks[0] == k {
				continue
			}
			if out[i] == nil {
				out[i] = map[dst]model.ServiceKey{}
			}
			out[i][d] = ks[0]
		}
	}
	return out
}

// equalLost reports whether f was planned with the lost destinations.
func equalLost(lost [2]map[dst]model.ServiceKey, f *fragment) bool {
	for i := range lost {
		if !maps.Equal(lost[i], f.Families[i].lost) {
			return false
		}
	}
	return true
}

// fragment plans one service alone, without the destinations of lost.
func (pl planner) fragment(se *model.ServiceEndpoints, lost [2]map[dst]model.ServiceKey) *fragment {
	f := &fragment{}
	for _, fam := range families {
		fp := &f.Families[fam]
		fp.Reach = map[dst][]netip.AddrPort{}
		fp.lost = lost[fam]
		f.Problems = append(f.Problems, pl.service(fam, fp, se)...)
	}
	f.Problems = uniqueErrors(f.Problems)
	return f
}

// problems returns the problems of every service, in key order.
func (st *state) problems() []error {
	var out []error
	for _, k := range slices.SortedFunc(maps.Keys(st.troubled), model.ServiceKey.Compare) {
		out = append(out, st.frags[k].Problems...)
	}
	return out
}

// reported returns the problems of every service, in key order, as
// localsink.ProblemReporter gives them: the field and reason planning
// found (ReasonOther for a plain error).
func (st *state) reported() []model.Problem {
	var out []model.Problem
	for _, k := range slices.SortedFunc(maps.Keys(st.troubled), model.ServiceKey.Compare) {
		for _, err := range st.frags[k].Problems {
			out = append(out, model.ProblemOf(k, err))
		}
	}
	return out
}

// plan returns the whole plan: the fixed chains, every service's chains
// in key order, then the dispatch.
func (st *state) plan() *plan {
	p := &plan{}
	for _, f := range families {
		p.Families[f] = st.assemble(f, true)
	}
	return p
}

// shared returns the chains of family f that are not a service's (the
// fixed chains and the dispatch), assembled again only when a service's
// dispatch entries changed. They are not to be modified.
func (st *state) shared(f family) familyPlan {
	if !st.sharedValid {
		for _, fam := range families {
			st.sharedPlans[fam] = st.assemble(fam, false)
		}
		st.sharedValid = true
	}
	return st.sharedPlans[f]
}

// assemble returns the plan of family f, with the services' own chains
// if withServices (the dispatch is always made of every service's
// entries).
func (st *state) assemble(f family, withServices bool) familyPlan {
	fp := familyPlan{}
	st.pl.fixedChains(f, &fp)
	if withServices {
		fp.Reach = map[dst][]netip.AddrPort{}
	}
	var clusterIPs []netip.Addr
	for _, k := range st.keys {
		sf := &st.frags[k].Families[f]
		clusterIPs = append(clusterIPs, sf.clusterIPs...)
		fp.NAT.entries = append(fp.NAT.entries, sf.NAT.entries...)
		fp.NAT.portEntries = append(fp.NAT.portEntries, sf.NAT.portEntries...)
		fp.Filter.entries = append(fp.Filter.entries, sf.Filter.entries...)
		fp.Filter.portEntries = append(fp.Filter.portEntries, sf.Filter.portEntries...)
		if withServices {
			for _, c := range sf.NAT.Chains {
				fp.NAT.put(c)
			}
			for _, c := range sf.Filter.Chains {
				fp.Filter.put(c)
			}
			maps.Copy(fp.Reach, sf.Reach)
		}
	}
	slices.SortFunc(clusterIPs, netip.Addr.Compare)
	st.pl.clusterIPChecks(&fp.Filter, slices.Compact(clusterIPs))
	st.pl.dispatchTree(f, "nat", &fp.NAT)
	st.pl.dispatchTree(f, "filter", &fp.Filter)
	st.pl.serviceCIDRDrops(f, &fp.Filter, st.serviceCIDRs)
	st.pl.nodePortJumps(f, &fp)
	return fp
}
