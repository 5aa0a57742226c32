package nft

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/kpng/model"
)

// FuzzBuild: any state builds a ruleset without a panic (problems are
// reported, not fatal), with and without the masquerading options, that
// the kernel would take and that leaves nothing unreachable
// (checkRuleset), and the same one when built again.
func FuzzBuild(f *testing.F) {
	for _, s := range []string{
		`[{"Service":{"Namespace":"default","Name":"web","Type":"LoadBalancer","IPs":{"ClusterIPs":{"V4":["10.96.0.10"],"V6":["fd00::10"]},"ExternalIPs":{"V4":["10.0.0.55"]},"LoadBalancerIPs":{"V4":["192.0.2.1"]}},"Ports":[{"Name":"http","Protocol":1,"Port":80,"NodePort":30080,"TargetPort":8080},{"Name":"dns","Protocol":2,"Port":53,"TargetPortName":"dns"}],"ClientIPAffinity":{"TimeoutSeconds":-1},"ExternalTrafficToLocal":true,"LoadBalancerSourceRanges":["10.0.0.0/8"]},"Endpoints":[{"IPs":{"V4":["10.1.0.2"]},"Local":true,"Ready":true,"Serving":true,"PortOverrides":{"dns":5353}},{"IPs":{"V6":["1100::2"]},"Serving":true,"Terminating":true,"Hints":{"SameZone":true}}]}]`,
		`[{"Service":{"Namespace":"a","Name":"b","IPs":{"ClusterIPs":{"V4":["bogus","10.96.0.1"]},"Headless":true},"Ports":[{"Protocol":3,"Port":70000,"NodePort":-1,"TargetPort":-4}]},"Endpoints":[{"IPs":{}}]}]`,
		`[{"Service":{"Namespace":"a","Name":"b","Ports":[{"Protocol":1,"Port":80},{"Protocol":1,"Port":80}]}},{"Service":{"Namespace":"a","Name":"b"}}]`,
	} {
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, data []byte, masquerade bool) {
		var items []*model.ServiceEndpoints
		if json.Unmarshal(data, &items) != nil {
			return
		}
		kept := items[:0]
		for _, se := range items {
			if se != nil && se.Service != nil {
				var eps []*model.Endpoint
				for _, e := range se.Endpoints {
					if e != nil {
						eps = append(eps, e)
					}
				}
				se.Endpoints = eps
				kept = append(kept, se) // the model never holds nil ones
			}
		}
		var opts Options
		if masquerade {
			opts.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("1100::/64")}
			opts.NodeIPs = []netip.Addr{netip.MustParseAddr("10.0.0.2")}
		}
		rs, _ := buildRuleset(TableName("fuzz"), opts, kept)
		if rs == nil {
			t.Fatal("no ruleset")
		}
		if err := checkRuleset(rs, kept); err != nil {
			t.Fatalf("%v\nruleset:\n%s", err, rs.Text())
		}
		// The same state builds the same rules.
		again, _ := buildRuleset(TableName("fuzz"), opts, kept)
		if a, b := rs.Text(), again.Text(); a != b {
			t.Fatalf("two builds of one state differ:\n%s\n---\n%s", a, b)
		}
	})
}

// checkRuleset checks what the kernel would refuse in a table, or what
// would leave traffic nowhere, in rs built from items: names unique (a
// chain, a set, a map element's key), every chain, set and map a rule or
// an element refers to present (a chain may be unused: a service port
// none of whose addresses is usable keeps its chains), every object owned by a service of
// items, each element's key of its map's family, every cluster IP of the
// table one of items', and each port of a service with a usable cluster
// IP in a map.
func checkRuleset(rs *ruleset, items []*model.ServiceEndpoints) error {
	services := map[model.ServiceKey]bool{}
	clusterIPs := map[netip.Addr]bool{}
	for _, se := range items {
		services[se.Service.Key()] = true
		for _, ip := range append(slices.Clone(se.Service.IPs.ClusterIPs.V4), se.Service.IPs.ClusterIPs.V6...) {
			if a, err := netip.ParseAddr(ip); err == nil {
				clusterIPs[a.Unmap()] = true
			}
		}
	}
	chains := map[string]bool{}
	for i, c := range rs.Chains {
		if c.Name == "" || len(c.Name) >= 256 || chains[c.Name] {
			return fmt.Errorf("chain %d: name %q empty, too long or taken", i, c.Name)
		}
		if i > 0 && rs.Chains[i-1].Name > c.Name {
			return fmt.Errorf("chains not sorted: %s before %s", rs.Chains[i-1].Name, c.Name)
		}
		shard := c.Service == (model.ServiceKey{}) && (strings.HasPrefix(c.Name, "shard4-") || strings.HasPrefix(c.Name, "shard6-"))
		if !services[c.Service] && !shard {
			return fmt.Errorf("chain %s: owned by %s, not a service given", c.Name, c.Service)
		}
		chains[c.Name] = true
	}
	sets := map[string]*namedSet{}
	for _, st := range rs.Sets {
		if st.Name == "" || len(st.Name) >= 256 || sets[st.Name] != nil {
			return fmt.Errorf("set %q: name empty, too long or taken", st.Name)
		}
		if !st.EndpointMap && st.Shard == 0 && st.ShardSet == 0 && !services[st.Service] {
			return fmt.Errorf("set %s: owned by %s, not a service given", st.Name, st.Service)
		}
		sets[st.Name] = st
	}
	for _, st := range rs.Sets {
		// A shard's set comes with its chain and map: the services
		// chain's rule of the shard, written from the set, goes to the
		// chain, whose rules use the map.
		if n := st.ShardSet; n > 0 && (!chains[shardChainName(st.Family, n)] || sets[shardMapName(st.Family, n)] == nil) {
			return fmt.Errorf("set %s: its shard's chain or map is not in the table", st.Name)
		}
	}
	jump := func(from, to string) error {
		switch to {
		case chainReject, chainNodePortReject(ipv4), chainNodePortReject(ipv6), chainNodePortDrop(ipv4), chainNodePortDrop(ipv6): // fixed (Text)
			return nil
		}
		if !chains[to] {
			return fmt.Errorf("%s: goes to chain %q, which is not in the table", from, to)
		}
		return nil
	}
	useSet := func(from, name string) error {
		if sets[name] == nil {
			return fmt.Errorf("%s: uses set %q, which is not in the table", from, name)
		}
		return nil
	}
	for _, st := range rs.Sets {
		for _, target := range st.Targets {
			if err := jump("set "+st.Name, target); err != nil {
				return err
			}
		}
	}
	for _, c := range rs.Chains {
		for _, r := range c.Rules {
			from := fmt.Sprintf("chain %s rule %q", c.Name, r)
			var err error
			switch r := r.(type) {
			case balanceRule:
				if len(r.Targets) == 0 {
					err = fmt.Errorf("%s: balances to no chain", from)
				}
				for _, target := range r.Targets {
					err = errors.Join(err, jump(from, target))
				}
				if len(r.Targets) > 1 {
					err = errors.Join(err, useSet(from, r.Map))
				}
			case affinityCheckRule:
				err = errors.Join(useSet(from, r.Set), jump(from, r.Goto))
			case affinityUpdateRule:
				err = useSet(from, r.Set)
			case dnatMapRule:
				err = useSet(from, r.Map)
			case shardDnatRule:
				err = useSet(from, r.Map)
			case sourceRule:
				if !r.Mark {
					err = jump(from, r.Goto)
				}
			}
			if err != nil {
				return err
			}
		}
	}
	// The shard blocks, each owned by an element of its key (unowned:
	// those no element names yet).
	blocks, unowned := map[string]*block{}, map[string]bool{}
	for _, bl := range rs.Blocks {
		blocks[bl.ID] = bl
		if bl.sharded() {
			unowned[bl.ID] = true
		}
	}
	ids := map[string]bool{}
	for _, e := range rs.Elements {
		if ids[e.ID()] {
			return fmt.Errorf("element %s twice", e.ID())
		}
		ids[e.ID()] = true
		if !services[e.Service] {
			return fmt.Errorf("element %s: of %s, not a service given", e.ID(), e.Service)
		}
		if e.Verdict.Shard > 0 {
			// A key served by a shard map: its block is there, with
			// this key, in the shard of its number of endpoints, whose
			// map and set are in the table, its set the element's, and
			// whose chain the element goes to.
			bl := blocks[e.Verdict.Block]
			switch {
			case bl == nil || bl.Shard != e.Key || bl.Service != e.Service:
				return fmt.Errorf("element %s: served by shard block %s, which is not there with its key", e.ID(), e.Verdict.Block)
			case bl.ShardIdx != uint32(len(bl.Endpoints)) || bl.ShardIdx > maxShardEndpoints:
				return fmt.Errorf("element %s: its shard block %s of %d endpoints is in shard %d", e.ID(), bl.ID, len(bl.Endpoints), bl.ShardIdx)
			case sets[bl.Map()] == nil || sets[bl.Map()].Shard != bl.ShardIdx:
				return fmt.Errorf("element %s: its shard map %s is not in the table", e.ID(), bl.Map())
			case sets[e.set()] == nil || sets[e.set()].ShardSet != bl.ShardIdx || e.Verdict.Shard != bl.ShardIdx:
				return fmt.Errorf("element %s: its shard set %s is not in the table, or not its shard's", e.ID(), e.set())
			case !slices.Contains(rs.ClusterIPs, e.Key.Addr):
				// The services chain's check before the shards' rules
				// (shards.go) looks the cluster-ips sets up.
				return fmt.Errorf("element %s: in a shard, its address is not in the cluster-ips sets", e.ID())
			case e.Verdict.Goto != shardChainName(e.Family, bl.ShardIdx):
				return fmt.Errorf("element %s: goes to %s, not to its shard's chain", e.ID(), e.Verdict)
			}
			delete(unowned, bl.ID)
		}
		if e.Key.Addr.IsValid() && familyOf(e.Key.Addr) != e.Family {
			return fmt.Errorf("element %s: its address is not of its map's family", e.ID())
		}
		if e.Verdict.Goto != "" {
			if err := jump("element "+e.ID(), e.Verdict.Goto); err != nil {
				return err
			}
		}
	}
	for id := range unowned {
		return fmt.Errorf("shard block %s: no element owns its key", id)
	}
	// Every port of every service with a usable cluster IP is in the
	// table: forwarded, rejected or dropped (a service another one took
	// the address and port from included).
	keys := map[mapKey]bool{}
	for _, e := range rs.Elements {
		keys[e.Key] = true
	}
	for _, se := range items {
		svc := se.Service
		if svc.IPs.Headless {
			continue
		}
		for f, ips := range [][]string{svc.IPs.ClusterIPs.V4, svc.IPs.ClusterIPs.V6} {
			for _, ip := range ips {
				a, err := netip.ParseAddr(ip)
				if err != nil || familyOf(a.Unmap()) != ipFamily(f) {
					continue
				}
				for _, p := range svc.Ports {
					if p == nil || p.Protocol < model.TCP || p.Protocol > model.SCTP || p.Port < 1 || p.Port > 65535 {
						continue
					}
					if k := (mapKey{Addr: a.Unmap(), Proto: p.Protocol, Port: uint16(p.Port)}); !keys[k] {
						return fmt.Errorf("service %s port %d/%s: its cluster IP %s is in no map", svc.Key(), p.Port, p.Protocol, a)
					}
				}
			}
		}
	}
	for _, a := range rs.ClusterIPs {
		if !clusterIPs[a] {
			return fmt.Errorf("cluster IP %s in the table: not one of the services given", a)
		}
	}
	return nil
}
