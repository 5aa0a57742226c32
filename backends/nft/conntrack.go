package nft

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"sigs.k8s.io/kpng/diffstore"
	"sigs.k8s.io/kpng/model"
)

// staleFlow selects UDP conntrack entries that a round of changes made
// stale: UDP has no connection teardown, so an entry keeps sending a
// client's flow where its first packet went (to an endpoint, or nowhere)
// until it expires, whatever the rules say since.
//
// An entry matches when its protocol is Proto, its original destination
// is Dst (any address when Dst.Addr is not valid: node ports) and
// Dst's port, and its reply source is Endpoint — or, when Endpoint is
// not valid, its reply source is its original destination (the entry was
// not DNATed).
type staleFlow struct {
	Family ipFamily
	// Proto is the protocol of the entries (UDP).
	Proto model.Protocol
	// Dst is the service address and port (the map element's key).
	Dst netip.AddrPort
	// Endpoint is the endpoint the entries were DNATed to and that the
	// service address no longer leads to; not valid: the service address
	// led to no endpoint before (rejected, dropped or absent) and now
	// does, so its un-DNATed entries must go for the next packet to meet
	// the DNAT rules.
	Endpoint netip.AddrPort
}

// String returns the flow as "udp 10.96.0.10:53 -> 10.1.0.2:5353" (or
// "... not DNATed").
func (f staleFlow) String() string {
	dst := f.Dst.String()
	if !f.Dst.Addr().IsValid() {
		dst = fmt.Sprintf("*:%d", f.Dst.Port())
	}
	if !f.Endpoint.IsValid() {
		return fmt.Sprintf("%s %s not DNATed", protoName(f.Proto), dst)
	}
	return fmt.Sprintf("%s %s -> %s", protoName(f.Proto), dst, f.Endpoint)
}

// compareStaleFlows orders flows by family, protocol, destination and
// endpoint (flows without an endpoint first).
func compareStaleFlows(a, b staleFlow) int {
	return cmp.Or(
		cmp.Compare(a.Family, b.Family),
		cmp.Compare(a.Proto, b.Proto),
		a.Dst.Compare(b.Dst),
		a.Endpoint.Compare(b.Endpoint),
	)
}

// StaleFlows returns the UDP conntrack entries that the round which
// produced d (the delta of the last Done) made stale, sorted; nil when
// there are none. Call it right after Done: it reads the tracker's
// current state, which with d gives the state before the round.
//
// For every map element key (address . protocol . port) of a service the
// round touched, with protocol UDP, it compares the endpoints the key led
// to before and after the round — the To of the UDP dnatRules of the
// chains reachable from the element's verdict:
//   - each endpoint the key no longer leads to gives a staleFlow with that
//     Endpoint (an endpoint removed from the service port; the whole
//     service port or address removed);
//   - a key that led to no endpoint before (no element: new service or
//     address; or an element that rejected or dropped, as those of the
//     no-endpoint maps) and leads to some now gives a staleFlow without
//     Endpoint: its entries that were not DNATed.
//
// It relies only on these assumptions, whatever the maps are: an element's
// key is the service address, protocol and port its traffic is addressed to
// (an invalid address for keys that match any address, such as node
// ports); an element's verdict is a goto to a chain of the table or a
// verdict that does not DNAT; chains send packets to other chains only
// through rules implementing chainReferrer (balanceRule does); and the
// DNAT of a service port to an endpoint is a dnatRule or a dnatMapRule (the
// endpoints of its block), whatever other rules (masquerade, affinity) share
// its chain. A plain service port's element goes to its shard's chain,
// shared by every port of its shard, whose shardDnatRule is not followed:
// its endpoints are its shard block's (verdict.Shard and Block,
// endpointsByKey).
func (t *tracker) StaleFlows(d delta) []staleFlow {
	return staleFlows(d, func(key model.ServiceKey) serviceObjects { return t.services[key] })
}

// chainReferrer is implemented by the rules that send packets to other
// chains of the table (goto or jump), so that StaleFlows can follow them.
// A new rule kind that does so must implement it, or the endpoints behind
// it are invisible to the conntrack cleanup.
type chainReferrer interface {
	referencedChains() []string
}

// referencedChains implements chainReferrer.
func (r balanceRule) referencedChains() []string { return r.Targets }

// referencedChains implements chainReferrer: the chain a matching source
// goes to (none when the rule only marks for masquerading).
func (r sourceRule) referencedChains() []string {
	if r.Mark || r.Goto == "" {
		return nil
	}
	return []string{r.Goto}
}

// referencedChains implements chainReferrer.
func (r affinityCheckRule) referencedChains() []string { return []string{r.Goto} }

// staleFlows is StaleFlows given the current objects of each service.
func staleFlows(d delta, current func(model.ServiceKey) serviceObjects) []staleFlow {
	services := udpServices(d, current)
	if len(services) == 0 {
		return nil
	}
	// The state after the round, restricted to the services it touched
	// (an element or chain can only change with its service)...
	nowChains := map[string]*regularChain{}
	nowElems := map[string]mapElement{}
	nowBlocks := map[string]*block{}
	for _, key := range services {
		objs := current(key)
		for _, c := range objs.Chains {
			nowChains[c.Name] = c
		}
		for _, bl := range objs.Blocks {
			nowBlocks[bl.ID] = bl
		}
		for _, e := range objs.Elements {
			nowElems[e.ID()] = e
		}
	}
	// ... and before it.
	prevChains := beforeRound(nowChains, d.Chains)
	prevBlocks := beforeRound(nowBlocks, d.Blocks)
	prevElems := beforeRound(nowElems, d.Elements)

	before := endpointsByKey(prevElems, prevChains, prevBlocks)
	after := endpointsByKey(nowElems, nowChains, nowBlocks)
	var flows []staleFlow
	for k, eps := range before {
		now := after[k]
		for ep := range eps {
			if !now[ep] {
				flows = append(flows, staleFlow{Family: k.family, Proto: k.key.Proto, Dst: keyDst(k.key), Endpoint: ep})
			}
		}
	}
	for k, eps := range after {
		if len(eps) > 0 && len(before[k]) == 0 {
			flows = append(flows, staleFlow{Family: k.family, Proto: k.key.Proto, Dst: keyDst(k.key)})
		}
	}
	slices.SortFunc(flows, compareStaleFlows)
	return flows
}

// udpServices returns the services the round d touched that have a UDP
// element key, now or before the round: only their flows can be stale
// (endpointsByKey), and a round that writes the whole state touches every
// service (at 50,000, a third of a second spent on TCP services).
func udpServices(d delta, current func(model.ServiceKey) serviceObjects) []model.ServiceKey {
	before := map[model.ServiceKey]bool{}
	for _, items := range [][]diffstore.Item[string, mapElement]{d.Elements.Updated, d.Elements.Deleted} {
		for _, it := range items {
			if it.Prev.Key.Proto == model.UDP {
				before[it.Prev.Service] = true
			}
		}
	}
	return slices.DeleteFunc(d.Services(), func(key model.ServiceKey) bool {
		if before[key] {
			return false
		}
		for _, e := range current(key).Elements {
			if e.Key.Proto == model.UDP {
				return false
			}
		}
		return true
	})
}

// beforeRound returns the objects of now as they were before the round of
// changes ch: what the round created was not there, what it updated or
// deleted was Prev, the rest was as it is now.
func beforeRound[V any](now map[string]V, ch diffstore.Changes[string, V]) map[string]V {
	prev := maps.Clone(now)
	for _, it := range ch.Created {
		delete(prev, it.Key)
	}
	for _, its := range [][]diffstore.Item[string, V]{ch.Updated, ch.Deleted} {
		for _, it := range its {
			prev[it.Key] = it.Prev
		}
	}
	return prev
}

// familyKey is an element key in one family: node-port keys (no address)
// are the same in both families, their endpoints are not.
type familyKey struct {
	family ipFamily
	key    mapKey
}

// keyDst returns the address and port of an element key.
func keyDst(k mapKey) netip.AddrPort { return netip.AddrPortFrom(k.Addr, k.Port) }

// endpointsByKey returns, for every UDP element key of elems and its
// family, the endpoints of the UDP DNAT rules reachable from its elements (a
// key may have elements in several maps).
func endpointsByKey(elems map[string]mapElement, chains map[string]*regularChain, blocks map[string]*block) map[familyKey]map[netip.AddrPort]bool {
	out := map[familyKey]map[netip.AddrPort]bool{}
	memo := map[string]map[netip.AddrPort]bool{}
	for _, e := range elems {
		if e.Key.Proto != model.UDP {
			continue
		}
		fk := familyKey{e.Family, e.Key}
		eps, ok := out[fk]
		if !ok {
			eps = map[netip.AddrPort]bool{}
			out[fk] = eps
		}
		if e.Verdict.Shard > 0 {
			if bl := blocks[e.Verdict.Block]; bl != nil {
				for _, ep := range bl.Endpoints {
					eps[ep] = true
				}
			}
			continue
		}
		for ep := range reachableEndpoints(e.Verdict.Goto, chains, blocks, memo) {
			eps[ep] = true
		}
	}
	return out
}

// reachableEndpoints returns the endpoints of the UDP dnatRules and
// dnatMapRules (their blocks' endpoints) of the chains reachable from the
// chain named start (none if it is not in chains: the reject chain, drop,
// a chain of another service).
func reachableEndpoints(start string, chains map[string]*regularChain, blocks map[string]*block, memo map[string]map[netip.AddrPort]bool) map[netip.AddrPort]bool {
	if eps, ok := memo[start]; ok {
		return eps
	}
	eps := map[netip.AddrPort]bool{}
	seen := map[string]bool{}
	var walk func(name string)
	walk = func(name string) {
		c := chains[name]
		if c == nil || seen[name] {
			return
		}
		seen[name] = true
		for _, r := range c.Rules {
			switch r := r.(type) {
			case dnatRule:
				if r.Proto == model.UDP {
					eps[r.To] = true
				}
			case dnatMapRule:
				if bl := blocks[r.Block]; bl != nil && r.Proto == model.UDP {
					for _, ep := range bl.Endpoints {
						eps[ep] = true
					}
				}
			case chainReferrer:
				for _, next := range r.referencedChains() {
					walk(next)
				}
			}
		}
	}
	walk(start)
	memo[start] = eps
	return eps
}
