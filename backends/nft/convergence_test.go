package nft

import (
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"sigs.k8s.io/kpng/diffstore"
	"sigs.k8s.io/kpng/internal/churn"
)

// churnPools draw few addresses and ports, so that services contend and
// move between shards as their numbers of endpoints change.
var churnPools = churn.Pools{
	ClusterV4:   []netip.Addr{netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("10.96.0.17"), netip.MustParseAddr("10.96.1.1")},
	ClusterV6:   []netip.Addr{netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::101")},
	External:    []netip.Addr{netip.MustParseAddr("10.0.0.55"), netip.MustParseAddr("1000::55")},
	EndpointsV4: []netip.Addr{netip.MustParseAddr("10.1.0.1"), netip.MustParseAddr("10.1.0.2"), netip.MustParseAddr("10.1.0.3")},
	EndpointsV6: []netip.Addr{netip.MustParseAddr("1100::1"), netip.MustParseAddr("1100::2")},
	Ports:       []int32{80, 81, 53},
	NodePorts:   []int32{30080, 30081},
}

// canonical is a ruleset in a form that does not depend on history: the
// endpoint-map slots a service's blocks got are replaced by the endpoints
// they hold, with the comment of the block each element belongs to.
type canonical struct {
	Chains   map[string][]string
	Elements []string
	Hairpin  []netip.Addr
	// ClusterIPs are the cluster-ips sets' addresses, sorted: the
	// services chain's check before the shards' rules looks them up.
	ClusterIPs []netip.Addr
	// Shards are the shard blocks with their map, key and elements;
	// Sets the names of the sets.
	Shards []string
	Sets   []string
}

func canonicalize(rs *ruleset) canonical {
	blocks := map[[2]uint32]*block{}
	for _, bl := range rs.Blocks {
		blocks[[2]uint32{uint32(bl.Family), bl.Slot}] = bl
	}
	bySlot := map[[2]uint32][]string{}
	for _, e := range rs.endpoints() {
		k := [2]uint32{uint32(e.Family), e.Slot}
		// An element whose owner is not the block at its slot would
		// keep the comment of a block gone.
		owner := "no block"
		if bl := blocks[k]; bl != nil {
			owner = bl.Comment()
			if ownerOf(bl.ID) != e.Owner {
				owner = "another block's element"
			}
		}
		where := ""
		if e.Shard.Addr.IsValid() {
			where = e.Map() + " " // a shard map's name says the shard, not the slot
		}
		bySlot[k] = append(bySlot[k], fmt.Sprintf("%s[%d,%d)→%s (%s)", where, e.From, e.To, e.Target, owner))
	}
	c := canonical{Chains: map[string][]string{}, Hairpin: rs.Hairpin, ClusterIPs: slices.SortedFunc(slices.Values(rs.ClusterIPs), netip.Addr.Compare)}
	for _, ch := range rs.Chains {
		var rules []string
		for _, r := range ch.Rules {
			if d, ok := r.(dnatMapRule); ok {
				rules = append(rules, fmt.Sprintf("dnat %s to %v", protoName(d.Proto), bySlot[[2]uint32{uint32(d.Family), d.Slot}]))
				continue
			}
			rules = append(rules, r.String())
		}
		c.Chains[ch.Name] = rules
	}
	for _, e := range rs.Elements {
		c.Elements = append(c.Elements, fmt.Sprintf("%s %s: %s (%s)", e.Map, e.Key, e.Verdict, e.Service))
	}
	slices.Sort(c.Elements)
	for _, bl := range rs.Blocks {
		if bl.sharded() {
			c.Shards = append(c.Shards, fmt.Sprintf("%s %s: %v", bl.Map(), bl.Shard, bySlot[[2]uint32{uint32(bl.Family), bl.Slot}]))
		}
	}
	slices.Sort(c.Shards)
	for _, st := range rs.Sets {
		c.Sets = append(c.Sets, st.Name)
	}
	slices.Sort(c.Sets)
	return c
}

// TestTrackerConvergence applies seeded random churn round by round to a
// tracker (what the sink programs, as its deltas) and checks after every
// round that its ruleset is the one a fresh start builds from the whole
// state. The kernel side (that the applier programs exactly the deltas)
// is what the kernel tests check. KPNG_CHURN_ROUNDS and KPNG_CHURN_SEED
// change the length and the seed.
func TestTrackerConvergence(t *testing.T) {
	rounds, seeds := churn.FromEnv(300, 1, 2, 3)
	opts := Options{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}}
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			gen := churn.New(seed, churnPools)
			tr := newTracker(opts)
			// elements is a store of every endpoint element of the
			// tracker's rulesets: the changes it reports each round are
			// those the tracker's delta must give (endpointChanges).
			elements := diffstore.NewComparable[uint64, endpointElement]()
			// clusterIPs are the cluster-ips sets' addresses as the
			// deltas leave them (what the kernel holds).
			clusterIPs := map[netip.Addr]bool{}
			sharded := 0 // plain ports' elements checked, over the rounds
			for round := range rounds {
				// In key order, as the Feeder delivers a round.
				changes := gen.Round()
				slices.SortFunc(changes, func(a, b churn.Change) int { return a.Key.Compare(b.Key) })
				for _, c := range changes {
					tr.Update(c.Key, c.Value)
				}
				d := tr.Done()
				rs := tr.Ruleset("t")
				fresh, _ := buildRuleset("t", opts, gen.State())
				if diff := cmp.Diff(canonicalize(fresh), canonicalize(rs), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
					t.Fatalf("seed %d round %d: the tracker differs from a fresh build (-fresh +incremental):\n%s", seed, round, diff)
				}
				for _, e := range rs.endpoints() {
					elements.Set(e.ID(), e)
				}
				if diff := cmp.Diff(elements.Done(), d.Endpoints, cmpopts.EquateEmpty(), cmpopts.EquateComparable(netip.AddrPort{}, netip.Addr{})); diff != "" {
					t.Fatalf("seed %d round %d: the endpoint elements changed (-as a store of them reports +the delta):\n%s", seed, round, diff)
				}
				for _, a := range d.ClusterIPs.Deleted {
					delete(clusterIPs, a)
				}
				for _, a := range d.ClusterIPs.Created {
					clusterIPs[a] = true
				}
				if got, want := len(clusterIPs), len(rs.ClusterIPs); got != want {
					t.Fatalf("seed %d round %d: the deltas leave %d cluster IPs, the ruleset has %d", seed, round, got, want)
				}
				for _, e := range rs.Elements {
					// A plain port's key is looked up only for a cluster
					// IP of the sets (shards.go).
					if e.Verdict.Shard == 0 {
						continue
					}
					sharded++
					if !clusterIPs[e.Key.Addr] {
						t.Fatalf("seed %d round %d: %s is in a shard, its address not in the cluster-ips sets the deltas leave", seed, round, e.ID())
					}
				}
			}
			if sharded == 0 {
				t.Fatalf("seed %d: no plain port in %d rounds: the shards' check checked nothing", seed, rounds)
			}
		})
	}
}
