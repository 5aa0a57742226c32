// Package churn generates seeded random changes of a proxier's state,
// round by round, for the convergence tests: a backend fed the rounds
// incrementally must end each round in the state a fresh backend reaches
// from the whole state at once.
//
// The changes cover what makes incremental backends drift: services added,
// changed and deleted; ports added, renamed and changed in protocol,
// number and node port; IP families switched; endpoints flapping between
// ready, serving-terminating and gone, local and remote, with named ports;
// traffic policies and session affinity turned on and off; and addresses
// drawn from small pools, so that two services often contend for one
// address and port.
package churn

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"strconv"

	"sigs.k8s.io/kpng/model"
)

// Pools are the addresses and ports a Generator draws from. Keep them
// small: collisions are the point.
type Pools struct {
	// ClusterV4, ClusterV6 and External are service addresses.
	ClusterV4, ClusterV6, External []netip.Addr
	// EndpointsV4 and EndpointsV6 are endpoint addresses.
	EndpointsV4, EndpointsV6 []netip.Addr
	// Ports are service ports, NodePorts node ports (both kept small).
	Ports, NodePorts []int32
}

// Generator makes rounds of changes from a seed.
type Generator struct {
	r     *rand.Rand
	pools Pools
	state map[model.ServiceKey]*model.ServiceEndpoints
	// Services is how many service names there are (default 12).
	Services int
}

// New returns a generator of seed drawing from pools.
func New(seed uint64, pools Pools) *Generator {
	return &Generator{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), pools: pools, state: map[model.ServiceKey]*model.ServiceEndpoints{}, Services: 12}
}

// Change is one service's new value in a round (nil: deleted).
type Change struct {
	Key   model.ServiceKey
	Value *model.ServiceEndpoints
}

// Round returns the next round: 1 to 4 changes, each to a distinct
// service. The values are new: a generator never modifies a value it
// returned.
func (g *Generator) Round() []Change {
	n := 1 + g.r.IntN(4)
	seen := map[model.ServiceKey]bool{}
	var out []Change
	for range n {
		key := model.ServiceKey{Namespace: "churn", Name: fmt.Sprintf("svc-%02d", g.r.IntN(g.Services))}
		if seen[key] {
			continue
		}
		seen[key] = true
		var v *model.ServiceEndpoints
		switch cur := g.state[key]; {
		case cur == nil:
			v = g.service(key)
		case g.r.IntN(8) == 0:
			v = nil
		default:
			v = g.mutate(cur)
		}
		if v == nil {
			delete(g.state, key)
		} else {
			g.state[key] = v
		}
		out = append(out, Change{Key: key, Value: v})
	}
	return out
}

// State returns the current state, sorted by key.
func (g *Generator) State() []*model.ServiceEndpoints {
	out := make([]*model.ServiceEndpoints, 0, len(g.state))
	for _, v := range g.state {
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b *model.ServiceEndpoints) int { return a.Service.Key().Compare(b.Service.Key()) })
	return out
}

// pick returns one element of s.
func pick[T any](r *rand.Rand, s []T) T { return s[r.IntN(len(s))] }

// service returns a new service key with random ports, addresses and
// endpoints.
func (g *Generator) service(key model.ServiceKey) *model.ServiceEndpoints {
	svc := &model.Service{Namespace: key.Namespace, Name: key.Name, Type: "ClusterIP"}
	g.addresses(svc)
	for range 1 + g.r.IntN(3) {
		g.addPort(svc)
	}
	g.policies(svc)
	setType(svc)
	return &model.ServiceEndpoints{Service: svc, Endpoints: g.endpoints(svc)}
}

// setType makes svc a NodePort service when a port has a node port.
func setType(svc *model.Service) {
	svc.Type = "ClusterIP"
	for _, p := range svc.Ports {
		if p.NodePort != 0 {
			svc.Type = "NodePort"
		}
	}
}

// mutate returns cur with one to three random changes.
func (g *Generator) mutate(cur *model.ServiceEndpoints) *model.ServiceEndpoints {
	svc := *cur.Service
	svc.Ports = slices.Clone(svc.Ports)
	eps := cur.Endpoints
	for range 1 + g.r.IntN(3) {
		switch g.r.IntN(7) {
		case 0:
			g.addresses(&svc)
		case 1:
			g.addPort(&svc)
		case 2:
			if len(svc.Ports) > 1 {
				i := g.r.IntN(len(svc.Ports))
				svc.Ports = slices.Delete(svc.Ports, i, i+1)
			}
		case 3:
			i := g.r.IntN(len(svc.Ports))
			p := *svc.Ports[i]
			switch g.r.IntN(4) {
			case 0:
				p.Name = fmt.Sprintf("p%d", g.r.IntN(4))
			case 1:
				p.Protocol = pick(g.r, []model.Protocol{model.TCP, model.UDP})
			case 2:
				p.Port = pick(g.r, g.pools.Ports)
			case 3:
				p.NodePort = g.nodePort()
			}
			svc.Ports[i] = &p
		case 4:
			g.policies(&svc)
		default:
			eps = g.endpoints(&svc)
		}
	}
	setType(&svc)
	return &model.ServiceEndpoints{Service: &svc, Endpoints: eps}
}

// addresses draws the service's families, cluster and external IPs.
func (g *Generator) addresses(svc *model.Service) {
	var cluster []string
	switch g.r.IntN(4) {
	case 0:
		cluster = []string{pick(g.r, g.pools.ClusterV4).String()}
	case 1:
		if len(g.pools.ClusterV6) > 0 {
			cluster = []string{pick(g.r, g.pools.ClusterV6).String()}
		}
	case 2:
		cluster = []string{pick(g.r, g.pools.ClusterV4).String()}
		if len(g.pools.ClusterV6) > 0 {
			cluster = append(cluster, pick(g.r, g.pools.ClusterV6).String())
		}
	}
	svc.IPs = model.ServiceIPs{Headless: len(cluster) == 0}
	svc.IPs.ClusterIPs, _ = model.NewIPSet(cluster...)
	if g.r.IntN(3) == 0 && len(g.pools.External) > 0 {
		svc.IPs.ExternalIPs, _ = model.NewIPSet(pick(g.r, g.pools.External).String())
	}
}

// nodePort returns a node port, or 0 (none) half the time.
func (g *Generator) nodePort() int32 {
	if len(g.pools.NodePorts) == 0 || g.r.IntN(2) == 0 {
		return 0
	}
	return pick(g.r, g.pools.NodePorts)
}

// addPort adds a port, by number or by name.
func (g *Generator) addPort(svc *model.Service) {
	p := &model.PortMapping{
		Name: fmt.Sprintf("p%d", g.r.IntN(4)), Protocol: pick(g.r, []model.Protocol{model.TCP, model.UDP}),
		Port: pick(g.r, g.pools.Ports), NodePort: g.nodePort(), TargetPort: 8080,
	}
	if g.r.IntN(4) == 0 {
		p.TargetPort, p.TargetPortName = 0, "web"
	}
	svc.Ports = append(svc.Ports, p)
}

// policies draws the traffic policies and the affinity.
func (g *Generator) policies(svc *model.Service) {
	svc.ExternalTrafficToLocal = g.r.IntN(3) == 0
	svc.InternalTrafficToLocal = g.r.IntN(4) == 0
	svc.ClientIPAffinity = nil
	if g.r.IntN(3) == 0 {
		svc.ClientIPAffinity = &model.ClientIPAffinity{TimeoutSeconds: int32(1 + g.r.IntN(100))}
	}
}

// endpoints draws 0 to 4 endpoints of any family and condition.
func (g *Generator) endpoints(svc *model.Service) []*model.Endpoint {
	byAddr := map[netip.Addr]*model.Endpoint{}
	for range g.r.IntN(5) {
		pool := g.pools.EndpointsV4
		if len(g.pools.EndpointsV6) > 0 && g.r.IntN(2) == 0 {
			pool = g.pools.EndpointsV6
		}
		a := pick(g.r, pool)
		e := &model.Endpoint{Local: g.r.IntN(2) == 0, NodeName: "other"}
		e.IPs, _ = model.NewIPSet(a.String())
		if e.Local {
			e.NodeName = "node"
		}
		switch g.r.IntN(4) {
		case 0:
			e.Serving, e.Terminating = true, true
		case 1:
			e.Terminating = true
		default:
			e.Ready, e.Serving = true, true
		}
		for _, p := range svc.Ports {
			if p.TargetPortName != "" {
				if e.PortOverrides == nil {
					e.PortOverrides = map[string]int32{}
				}
				e.PortOverrides[p.Name] = int32(8080 + g.r.IntN(2))
			}
		}
		byAddr[a] = e
	}
	out := make([]*model.Endpoint, 0, len(byAddr))
	for _, e := range byAddr {
		out = append(out, e)
	}
	slices.SortFunc(out, model.CompareEndpoints)
	return out
}

// FromEnv returns the number of rounds and the seeds a convergence test
// runs: rounds and seeds, unless $KPNG_CHURN_ROUNDS or $KPNG_CHURN_SEED
// (one seed) say otherwise.
func FromEnv(rounds int, seeds ...uint64) (int, []uint64) {
	if n, err := strconv.Atoi(os.Getenv("KPNG_CHURN_ROUNDS")); err == nil {
		rounds = n
	}
	if s, err := strconv.ParseUint(os.Getenv("KPNG_CHURN_SEED"), 10, 64); err == nil {
		seeds = []uint64{s}
	}
	return rounds, seeds
}
