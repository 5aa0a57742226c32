package watcher_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"sigs.k8s.io/kpng/client/watcher"
	"sigs.k8s.io/kpng/internal/churn"
	"sigs.k8s.io/kpng/internal/kubetest"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/localsink/sinktest"
	"sigs.k8s.io/kpng/model"
)

// TestWatcherConvergence makes a few hundred seeded random changes to
// Services, EndpointSlices and the Node through the API server while a
// watcher feeds a contract-checking sink. The changes come in phases of 25,
// each making only some kinds of change, and each ends with one change
// made alone; then the test waits until the delivered state stops changing
// (1 s) and checks that it equals the first state of a fresh watcher, which
// builds it from a fresh list: whatever order and grouping the events came
// in, incremental updates must not drift from a cold start. KPNG_CHURN_SEED fixes the seed (a
// time-based one otherwise, printed on failure) and KPNG_CHURN_ROUNDS the
// number of changes (200).
func TestWatcherConvergence(t *testing.T) {
	cp.Require(t)
	steps, seeds := churn.FromEnv(200, uint64(time.Now().UnixNano()))
	seed := seeds[0]
	var gen *apiChurn
	// Registered first, so it runs last, after the watchers' own checks.
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		if gen != nil {
			t.Logf("changes made:\n%s", strings.Join(gen.log, "\n"))
		}
		t.Logf("churn seed %d: rerun with KPNG_CHURN_SEED=%d KPNG_CHURN_ROUNDS=%d", seed, seed, steps)
	})

	ns := kubetest.Namespace(t, cp.Client())
	cfg := watcher.Config{ServiceProxyName: kubetest.UniqueName("churn"), NodeName: kubetest.UniqueName("node")}
	gen = newAPIChurn(t, cp.Client(), seed, ns, cfg.ServiceProxyName, cfg.NodeName)

	r := startWatcher(t, cfg)
	r.waitFor(t, "the first state", func([]*model.ServiceEndpoints) bool { return true })
	start := time.Now()
	gen.populate()
	const checkEvery = 25
	for i := 1; i <= steps; i++ {
		gen.step()
		gen.pause()
		if i%checkEvery == 0 || i == steps {
			gen.lone()
			checkConverged(t, r, cfg, fmt.Sprintf("after change %d (API write %d)", i, gen.writes))
			gen.log = append(gen.log, "    converged")
			gen.phase()
		}
	}
	t.Logf("seed %d: %d changes (%d API writes) in %v, %d states delivered", seed, steps, gen.writes,
		time.Since(start).Round(time.Millisecond), len(r.allStates()))
	// The churn must have reached the sink: some state held several
	// services with endpoints (the final one may be empty).
	if most := mostEndpoints(r.allStates()); most < 2 {
		t.Errorf("no state delivered during the churn had more than %d services with endpoints: the churn selected too little", most)
	}
}

// checkConverged waits until r's state settles and checks that it equals
// the first state of a fresh watcher with cfg, failing the test (at once:
// later changes would bury the cause) if not.
func checkConverged(t *testing.T, r *recorder, cfg watcher.Config, when string) {
	t.Helper()
	got, n := settle(t, r, time.Second, 30*time.Second)
	want := freshState(t, cfg)
	if diff := cmp.Diff(want, got, cmpopts.EquateComparable(netip.Prefix{})); diff != "" {
		t.Fatalf("%s, the watcher's state differs from a fresh watcher's (-fresh +churned):\n%s", when, diff)
	}
	if states := r.allStates(); len(states) != n {
		t.Fatalf("%s, the watcher delivered %d more states after it had settled", when, len(states)-n)
	}
}

// freshState returns the first state a new watcher with cfg delivers (the
// model built from a fresh list), checking that it keeps the Sink contract
// and stops cleanly.
func freshState(t *testing.T, cfg watcher.Config) []*model.ServiceEndpoints {
	t.Helper()
	cfg.Client = cp.Client()
	w, err := watcher.New(cfg)
	if err != nil {
		t.Fatalf("watcher.New: %v", err)
	}
	first := make(chan []*model.ServiceEndpoints, 1)
	c := sinktest.NewChecker(localsink.NewFullState(func(items []*model.ServiceEndpoints) {
		select {
		case first <- items:
		default:
		}
	}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx, c) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("fresh watcher: %v", err)
		}
		if err := c.Err(); err != nil {
			t.Errorf("fresh watcher broke the Sink contract:\n%v", err)
		}
	}()
	select {
	case st := <-first:
		return st
	case <-time.After(30 * time.Second):
		t.Fatalf("a fresh watcher delivered no state within 30 s")
		return nil
	}
}

// mostEndpoints returns the largest number of services with endpoints in
// one of states.
func mostEndpoints(states [][]*model.ServiceEndpoints) int {
	most := 0
	for _, st := range states {
		n := 0
		for _, se := range st {
			if len(se.Endpoints) > 0 {
				n++
			}
		}
		most = max(most, n)
	}
	return most
}

// settle waits until r's latest state has not changed for quiet, at most
// until deadline, and returns it with the number of states delivered.
func settle(t *testing.T, r *recorder, quiet, deadline time.Duration) ([]*model.ServiceEndpoints, int) {
	t.Helper()
	end := time.Now().Add(deadline)
	n, since := -1, time.Now()
	for {
		states := r.allStates()
		if len(states) != n {
			n, since = len(states), time.Now()
		}
		if time.Since(since) >= quiet && n > 0 {
			return states[n-1], n
		}
		if time.Now().After(end) {
			t.Fatalf("the watcher's state did not settle within %v (%d states)", deadline, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// apiChurn makes seeded random changes, through the API server, to the
// Services and EndpointSlices of one namespace and to one Node: services
// created, updated (ports, protocols, target ports, types, node ports,
// external IPs, traffic policies, affinity, IP families, traffic
// distribution, labels, load-balancer status) and deleted, and entering and
// leaving the proxy name's selection; slices created, updated (endpoint
// conditions, nodes, zones, hints, ports, addresses moving between slices,
// the owning service changing) and deleted; the node's zone changing. Names
// and addresses come from small pools so that changes collide. The
// generator only makes changes the API server accepts (one it rejects fails
// the test: the generator is wrong) and lets the server allocate cluster
// IPs and node ports.
type apiChurn struct {
	t                   testing.TB
	r                   *rand.Rand
	c                   kubernetes.Interface
	ns, proxyName, node string
	// services and slices hold the objects as the API server last
	// returned them, by name.
	services map[string]*v1.Service
	slices   map[string]*discovery.EndpointSlice
	nodeObj  *v1.Node
	// log describes each API write made, in order; writes counts them.
	log    []string
	writes int
	// kinds are the kinds of change of the current phase.
	kinds []churnKind
}

var (
	churnServices = []string{"s0", "s1", "s2", "s3", "s4", "s5"}
	churnSlices   = []string{"e0", "e1", "e2", "e3", "e4", "e5", "e6", "e7", "e8", "e9", "e10", "e11"}
	churnPortName = []string{"p0", "p1", "p2", "p3", "p4"}
	churnPorts    = []int32{53, 80, 443, 8000}
	churnTargets  = []int32{8080, 8081, 9000}
	churnNamedTgt = []string{"web", "alt"}
	churnZones    = []string{"zone-a", "zone-b", "zone-c"}
	churnEPv4     = []string{"10.50.0.1", "10.50.0.2", "10.50.0.3", "10.50.0.4", "10.50.0.5", "10.50.0.6"}
	churnEPv6     = []string{"fd00:50::1", "fd00:50::2", "fd00:50::3", "fd00:50::4", "fd00:50::5", "fd00:50::6"}
	churnExtIPs   = []string{"192.0.2.1", "192.0.2.2", "2001:db8::1"}
	churnLBIPs    = []string{"198.51.100.1", "198.51.100.2", "2001:db8:1::1"}
	churnRanges   = []string{"10.0.0.0/8", "192.168.0.0/16", "2001:db8::/32", "0.0.0.0/0"}
)

const otherNode = "other-node"

// newAPIChurn creates the node (in zone-a) and returns a generator for ns.
func newAPIChurn(t testing.TB, c kubernetes.Interface, seed uint64, ns, proxyName, node string) *apiChurn {
	t.Helper()
	g := &apiChurn{
		t: t, c: c, ns: ns, proxyName: proxyName, node: node,
		r:        rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		services: map[string]*v1.Service{},
		slices:   map[string]*discovery.EndpointSlice{},
	}
	n, err := c.CoreV1().Nodes().Create(context.Background(), &v1.Node{ObjectMeta: metav1.ObjectMeta{
		Name: node, Labels: map[string]string{"topology.kubernetes.io/zone": "zone-a"},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create node %s: %v", node, err)
	}
	t.Cleanup(func() { _ = c.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}) })
	g.nodeObj = n
	return g
}

func pickOne[T any](r *rand.Rand, s []T) T { return s[r.IntN(len(s))] }

// chance returns true with probability 1/n.
func (g *apiChurn) chance(n int) bool { return g.r.IntN(n) == 0 }

// pause sleeps for nothing (half the time), a little, or long enough for
// the watcher to deliver a round: changes land in one round or in several.
func (g *apiChurn) pause() {
	switch x := g.r.IntN(10); {
	case x < 5:
	case x < 8:
		time.Sleep(time.Duration(g.r.IntN(20)) * time.Millisecond)
	default:
		time.Sleep(time.Duration(50+g.r.IntN(100)) * time.Millisecond)
	}
}

// existing returns the sorted names of the objects of m.
func existing[T any](m map[string]T) []string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// free returns the names of pool not in m.
func free[T any](pool []string, m map[string]T) []string {
	var out []string
	for _, n := range pool {
		if _, ok := m[n]; !ok {
			out = append(out, n)
		}
	}
	return out
}

// populate creates every service and eight slices, so that the churn
// starts from a full namespace.
func (g *apiChurn) populate() {
	g.log = append(g.log, "    populate")
	for _, name := range churnServices {
		g.createService(name)
	}
	for _, name := range churnSlices[:8] {
		g.createSlice(name)
	}
}

// churnKind is one kind of change a step can make, with its weight.
type churnKind struct {
	name   string
	weight int
	do     func(*apiChurn)
}

var churnKinds = []churnKind{
	{"create service", 10, func(g *apiChurn) {
		if names := free(churnServices, g.services); len(names) > 0 {
			g.createService(pickOne(g.r, names))
			return
		}
		g.updateService()
	}},
	{"update service", 15, (*apiChurn).updateService},
	{"delete service", 4, (*apiChurn).deleteService},
	{"service proxy-name label", 6, (*apiChurn).toggleServiceLabel},
	{"load-balancer status", 3, (*apiChurn).loadBalancerStatus},
	{"create slice", 10, func(g *apiChurn) {
		if names := free(churnSlices, g.slices); len(names) > 0 {
			g.createSlice(pickOne(g.r, names))
			return
		}
		g.updateSlice()
	}},
	{"update slice", 40, (*apiChurn).updateSlice},
	{"delete slice", 7, (*apiChurn).deleteSlice},
	{"node zone", 5, (*apiChurn).changeZone},
}

// phase draws the kinds of change the next steps make: each kind with
// probability 1/2 (all of them when none is drawn). Phases that leave some
// kinds out (swarm testing) let the others pile up: a zone change is not
// always followed by changes that would refresh every service anyway.
func (g *apiChurn) phase() {
	g.kinds = nil
	for _, k := range churnKinds {
		if g.chance(2) {
			g.kinds = append(g.kinds, k)
		}
	}
	if len(g.kinds) == 0 {
		g.kinds = churnKinds
	}
	var names []string
	for _, k := range g.kinds {
		names = append(names, k.name)
	}
	g.log = append(g.log, "    phase: "+strings.Join(names, ", "))
}

// lone makes one change of any kind (each as likely) after the watcher has
// delivered the changes before it, so that a check right after it sees the
// effect of that change alone: one that the watcher misses is not covered
// up by later changes to the same services.
func (g *apiChurn) lone() {
	time.Sleep(100 * time.Millisecond)
	k := pickOne(g.r, churnKinds)
	g.log = append(g.log, "    alone: "+k.name)
	k.do(g)
}

// step makes one random change of the phase's kinds (one API write, two
// for an address moving between slices).
func (g *apiChurn) step() {
	if g.kinds == nil {
		g.phase()
	}
	total := 0
	for _, k := range g.kinds {
		total += k.weight
	}
	x := g.r.IntN(total)
	for _, k := range g.kinds {
		if x < k.weight {
			k.do(g)
			return
		}
		x -= k.weight
	}
}

// record logs one write, failing the test when the API server rejected it.
func (g *apiChurn) record(err error, format string, args ...any) {
	g.t.Helper()
	g.writes++
	what := fmt.Sprintf(format, args...)
	g.log = append(g.log, fmt.Sprintf("%3d %s", g.writes, what))
	if err != nil {
		g.t.Fatalf("churn write %d, %s: %v", g.writes, what, err)
	}
}

// --- Services ---

// labels returns a service's labels: the proxy name most of the time.
func (g *apiChurn) labels() map[string]string {
	l := map[string]string{}
	if !g.chance(5) {
		l[kubetest.ProxyNameLabel] = g.proxyName
	}
	if g.chance(2) {
		l["tier"] = pickOne(g.r, []string{"front", "back"})
	}
	return l
}

// createService creates service name with random contents.
func (g *apiChurn) createService(name string) {
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: g.ns, Name: name, Labels: g.labels()}}
	headless := g.chance(8)
	switch x := g.r.IntN(20); {
	case headless || x < 10:
		svc.Spec.Type = v1.ServiceTypeClusterIP
	case x < 14:
		svc.Spec.Type = v1.ServiceTypeNodePort
	case x < 18:
		svc.Spec.Type = v1.ServiceTypeLoadBalancer
	default:
		svc.Spec.Type = v1.ServiceTypeExternalName
	}
	g.families(&svc.Spec)
	if headless {
		svc.Spec.ClusterIP = v1.ClusterIPNone
	}
	for range 1 + g.r.IntN(3) {
		g.addPort(&svc.Spec)
	}
	if !headless && g.chance(3) {
		g.externalIPs(&svc.Spec)
	}
	g.trafficPolicies(&svc.Spec)
	g.affinity(&svc.Spec)
	g.loadBalancer(&svc.Spec)
	normalize(svc)
	out, err := g.c.CoreV1().Services(g.ns).Create(context.Background(), svc, metav1.CreateOptions{})
	g.record(err, "create service %s: %s", name, describeService(svc))
	g.services[name] = out
}

// describeService says what a service is, for the log.
func describeService(svc *v1.Service) string {
	var ports []string
	for _, p := range svc.Spec.Ports {
		ports = append(ports, fmt.Sprintf("%s/%s:%d->%s", p.Name, p.Protocol, p.Port, p.TargetPort.String()))
	}
	policy := "-"
	if svc.Spec.IPFamilyPolicy != nil {
		policy = string(*svc.Spec.IPFamilyPolicy)
	}
	return fmt.Sprintf("type=%s ip=%q families=%v/%s ports=%v ext=%v labels=%v etp=%q affinity=%s",
		svc.Spec.Type, svc.Spec.ClusterIP, svc.Spec.IPFamilies, policy, ports, svc.Spec.ExternalIPs,
		svc.Labels, svc.Spec.ExternalTrafficPolicy, svc.Spec.SessionAffinity)
}

// families draws the IP family policy and families of a service whose
// cluster IPs are to be allocated.
func (g *apiChurn) families(spec *v1.ServiceSpec) {
	spec.ClusterIP, spec.ClusterIPs, spec.IPFamilies, spec.IPFamilyPolicy = "", nil, nil, nil
	if spec.Type == v1.ServiceTypeExternalName {
		return
	}
	fams := []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
	if g.chance(2) {
		fams[0], fams[1] = fams[1], fams[0]
	}
	switch g.r.IntN(4) {
	case 0: // the cluster's default: single-stack IPv4
	case 1:
		spec.IPFamilyPolicy = ptr(v1.IPFamilyPolicySingleStack)
		spec.IPFamilies = fams[:1]
	case 2:
		spec.IPFamilyPolicy = ptr(v1.IPFamilyPolicyPreferDualStack)
		spec.IPFamilies = fams
	default:
		spec.IPFamilyPolicy = ptr(v1.IPFamilyPolicyRequireDualStack)
		spec.IPFamilies = fams
	}
}

// addPort adds a port with a name, (port, protocol) pair not in use, unless
// the service has four already (the pools would run out).
func (g *apiChurn) addPort(spec *v1.ServiceSpec) {
	if len(spec.Ports) >= 4 {
		return
	}
	p := v1.ServicePort{
		Name:     pickOne(g.r, churnPortName),
		Protocol: pickOne(g.r, []v1.Protocol{v1.ProtocolTCP, v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP}),
		Port:     pickOne(g.r, churnPorts),
	}
	g.targetPort(&p)
	spec.Ports = append(spec.Ports, p)
	g.fixPorts(spec, len(spec.Ports)-1)
}

// targetPort draws a numeric, named or default target port.
func (g *apiChurn) targetPort(p *v1.ServicePort) {
	switch g.r.IntN(4) {
	case 0:
		p.TargetPort = intstr.FromString(pickOne(g.r, churnNamedTgt))
	case 1:
		p.TargetPort = intstr.IntOrString{} // defaults to the port
	default:
		p.TargetPort = intstr.FromInt32(pickOne(g.r, churnTargets))
	}
}

// fixPorts makes port i's name and (port, protocol) unique among spec's
// ports by drawing new ones.
func (g *apiChurn) fixPorts(spec *v1.ServiceSpec, i int) {
	clash := func(f func(a, b *v1.ServicePort) bool) bool {
		for j := range spec.Ports {
			if j != i && f(&spec.Ports[i], &spec.Ports[j]) {
				return true
			}
		}
		return false
	}
	for clash(func(a, b *v1.ServicePort) bool { return a.Name == b.Name }) {
		spec.Ports[i].Name = pickOne(g.r, churnPortName)
	}
	for clash(func(a, b *v1.ServicePort) bool { return a.Port == b.Port && a.Protocol == b.Protocol }) {
		spec.Ports[i].Port = pickOne(g.r, churnPorts)
		spec.Ports[i].Protocol = pickOne(g.r, []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP})
	}
	// Two ports may share a node port only with different protocols (the
	// API server rejects the duplicate): a port whose protocol changed
	// onto another's node port gets a new one, allocated by the server.
	if clash(func(a, b *v1.ServicePort) bool {
		return a.NodePort != 0 && a.NodePort == b.NodePort && a.Protocol == b.Protocol
	}) {
		spec.Ports[i].NodePort = 0
	}
}

// externalIPs draws zero to two external IPs.
func (g *apiChurn) externalIPs(spec *v1.ServiceSpec) {
	spec.ExternalIPs = nil
	for _, ip := range churnExtIPs {
		if g.chance(2) {
			spec.ExternalIPs = append(spec.ExternalIPs, ip)
		}
	}
}

// trafficPolicies draws the internal and external traffic policies and the
// traffic distribution.
func (g *apiChurn) trafficPolicies(spec *v1.ServiceSpec) {
	spec.InternalTrafficPolicy = ptr(pickOne(g.r, []v1.ServiceInternalTrafficPolicy{v1.ServiceInternalTrafficPolicyCluster, v1.ServiceInternalTrafficPolicyLocal}))
	spec.ExternalTrafficPolicy = pickOne(g.r, []v1.ServiceExternalTrafficPolicy{v1.ServiceExternalTrafficPolicyCluster, v1.ServiceExternalTrafficPolicyLocal})
	spec.TrafficDistribution = nil
	if g.chance(3) {
		spec.TrafficDistribution = ptr(pickOne(g.r, []string{v1.ServiceTrafficDistributionPreferClose, v1.ServiceTrafficDistributionPreferSameZone, v1.ServiceTrafficDistributionPreferSameNode}))
	}
}

// affinity draws the session affinity.
func (g *apiChurn) affinity(spec *v1.ServiceSpec) {
	spec.SessionAffinity, spec.SessionAffinityConfig = v1.ServiceAffinityNone, nil
	if g.chance(3) {
		spec.SessionAffinity = v1.ServiceAffinityClientIP
		if g.chance(2) {
			spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr(int32(1 + g.r.IntN(100)))}}
		}
	}
}

// loadBalancer draws the load-balancer fields (kept only for type
// LoadBalancer by normalize).
func (g *apiChurn) loadBalancer(spec *v1.ServiceSpec) {
	spec.LoadBalancerSourceRanges = nil
	for _, r := range churnRanges {
		if g.chance(3) {
			spec.LoadBalancerSourceRanges = append(spec.LoadBalancerSourceRanges, r)
		}
	}
	spec.AllocateLoadBalancerNodePorts = nil
	if g.chance(4) {
		spec.AllocateLoadBalancerNodePorts = ptr(false)
	}
}

// normalize clears the fields svc's type does not allow, as a user
// changing the type has to.
func normalize(svc *v1.Service) {
	s := &svc.Spec
	if s.Type == v1.ServiceTypeExternalName {
		s.ExternalName = "db.example.com"
		s.ClusterIP, s.ClusterIPs, s.IPFamilies, s.IPFamilyPolicy = "", nil, nil, nil
		s.ExternalIPs = nil
		s.SessionAffinity, s.SessionAffinityConfig = v1.ServiceAffinityNone, nil
		s.InternalTrafficPolicy = nil
		s.TrafficDistribution = nil
	} else {
		s.ExternalName = ""
	}
	if s.Type != v1.ServiceTypeNodePort && s.Type != v1.ServiceTypeLoadBalancer {
		for i := range s.Ports {
			s.Ports[i].NodePort = 0
		}
	}
	externally := s.Type == v1.ServiceTypeNodePort || s.Type == v1.ServiceTypeLoadBalancer || len(s.ExternalIPs) > 0
	switch {
	case !externally:
		s.ExternalTrafficPolicy = ""
	case s.ExternalTrafficPolicy == "":
		s.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyCluster
	}
	if s.Type != v1.ServiceTypeLoadBalancer || s.ExternalTrafficPolicy != v1.ServiceExternalTrafficPolicyLocal {
		s.HealthCheckNodePort = 0
	}
	if s.Type != v1.ServiceTypeLoadBalancer {
		s.LoadBalancerSourceRanges = nil
		s.AllocateLoadBalancerNodePorts = nil
	}
	if s.SessionAffinity != v1.ServiceAffinityClientIP {
		s.SessionAffinityConfig = nil
	}
}

// updateService makes one or two changes to a random service (or creates
// one when there is none).
func (g *apiChurn) updateService() {
	names := existing(g.services)
	if len(names) == 0 {
		g.createService(pickOne(g.r, churnServices))
		return
	}
	name := pickOne(g.r, names)
	svc := g.services[name].DeepCopy()
	s := &svc.Spec
	headless := s.ClusterIP == v1.ClusterIPNone
	var did []string
	for range 1 + g.r.IntN(2) {
		switch g.r.IntN(14) {
		case 0:
			g.addPort(s)
			did = append(did, "add port")
		case 1:
			if len(s.Ports) > 1 {
				i := g.r.IntN(len(s.Ports))
				s.Ports = slices.Delete(s.Ports, i, i+1)
				did = append(did, "remove port")
			}
		case 2:
			i := g.r.IntN(len(s.Ports))
			s.Ports[i].Name = pickOne(g.r, churnPortName)
			g.fixPorts(s, i)
			did = append(did, "rename port")
		case 3:
			i := g.r.IntN(len(s.Ports))
			s.Ports[i].Protocol = pickOne(g.r, []v1.Protocol{v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP})
			g.fixPorts(s, i)
			did = append(did, "port protocol")
		case 4:
			i := g.r.IntN(len(s.Ports))
			s.Ports[i].Port = pickOne(g.r, churnPorts)
			g.fixPorts(s, i)
			did = append(did, "port number")
		case 5:
			g.targetPort(&s.Ports[g.r.IntN(len(s.Ports))])
			did = append(did, "target port")
		case 6:
			if headless {
				continue
			}
			s.Type = pickOne(g.r, []v1.ServiceType{v1.ServiceTypeClusterIP, v1.ServiceTypeNodePort, v1.ServiceTypeLoadBalancer, v1.ServiceTypeExternalName})
			did = append(did, "type")
		case 7:
			if !headless && s.Type != v1.ServiceTypeExternalName {
				g.externalIPs(s)
				did = append(did, "external IPs")
			}
		case 8, 9:
			if s.Type != v1.ServiceTypeExternalName {
				g.trafficPolicies(s)
				did = append(did, "traffic policies")
			}
		case 10:
			if s.Type != v1.ServiceTypeExternalName {
				g.affinity(s)
				did = append(did, "affinity")
			}
		case 11:
			if !headless && len(s.IPFamilies) > 0 && !slices.Contains(did, "IP families") {
				g.switchStack(s)
				did = append(did, "IP families")
			}
		case 12:
			if s.Type == v1.ServiceTypeLoadBalancer {
				g.loadBalancer(s)
				did = append(did, "source ranges")
			}
		default:
			if svc.Labels == nil {
				svc.Labels = map[string]string{}
			}
			if svc.Labels["tier"] == "front" {
				svc.Labels["tier"] = "back"
			} else {
				svc.Labels["tier"] = "front"
			}
			did = append(did, "tier label")
		}
	}
	was := g.services[name].Spec.Type
	if was == v1.ServiceTypeExternalName && s.Type != was {
		// Back from ExternalName: new cluster IPs, of any family.
		g.families(s)
		g.trafficPolicies(s)
	}
	if s.Type == v1.ServiceTypeLoadBalancer && was != s.Type {
		g.loadBalancer(s)
	}
	normalize(svc)
	out, err := g.c.CoreV1().Services(g.ns).Update(context.Background(), svc, metav1.UpdateOptions{})
	g.record(err, "update service %s (%s): %s", name, strings.Join(did, ", "), describeService(svc))
	g.services[name] = out
}

// switchStack turns a single-stack service dual-stack or a dual-stack one
// single-stack, keeping its primary family and cluster IP (which cannot
// change).
func (g *apiChurn) switchStack(s *v1.ServiceSpec) {
	primary := s.IPFamilies[0]
	if len(s.IPFamilies) == 1 {
		s.IPFamilyPolicy = ptr(pickOne(g.r, []v1.IPFamilyPolicy{v1.IPFamilyPolicyPreferDualStack, v1.IPFamilyPolicyRequireDualStack}))
		other := v1.IPv6Protocol
		if primary == v1.IPv6Protocol {
			other = v1.IPv4Protocol
		}
		s.IPFamilies = []v1.IPFamily{primary, other}
		return
	}
	s.IPFamilyPolicy = ptr(v1.IPFamilyPolicySingleStack)
	s.IPFamilies = s.IPFamilies[:1]
	s.ClusterIPs = s.ClusterIPs[:1]
}

// deleteService deletes a random service; its slices stay (as they would
// until the garbage collector runs).
func (g *apiChurn) deleteService() {
	names := existing(g.services)
	if len(names) <= 3 {
		// Keep a few: a phase of deletions would leave nothing to check.
		g.createService(pickOne(g.r, free(churnServices, g.services)))
		return
	}
	name := pickOne(g.r, names)
	err := g.c.CoreV1().Services(g.ns).Delete(context.Background(), name, metav1.DeleteOptions{})
	g.record(err, "delete service %s", name)
	delete(g.services, name)
}

// toggleServiceLabel moves a random service into or out of the proxy
// name's selection (its slices follow only when a slice update copies the
// labels, as the EndpointSlice controller would later).
func (g *apiChurn) toggleServiceLabel() {
	names := existing(g.services)
	if len(names) == 0 {
		g.createService(pickOne(g.r, churnServices))
		return
	}
	// Removing only from one of three or more selected services, so that
	// some stay selected.
	var labelled, unlabelled []string
	for _, name := range names {
		if _, ok := g.services[name].Labels[kubetest.ProxyNameLabel]; ok {
			labelled = append(labelled, name)
		} else {
			unlabelled = append(unlabelled, name)
		}
	}
	candidates := unlabelled
	if len(unlabelled) == 0 || (len(labelled) >= 3 && g.chance(2)) {
		candidates = labelled
	}
	name := pickOne(g.r, candidates)
	svc := g.services[name].DeepCopy()
	what := "remove"
	if _, ok := svc.Labels[kubetest.ProxyNameLabel]; ok {
		delete(svc.Labels, kubetest.ProxyNameLabel)
	} else {
		if svc.Labels == nil {
			svc.Labels = map[string]string{}
		}
		svc.Labels[kubetest.ProxyNameLabel] = g.proxyName
		what = "add"
	}
	out, err := g.c.CoreV1().Services(g.ns).Update(context.Background(), svc, metav1.UpdateOptions{})
	g.record(err, "update service %s: %s proxy-name label", name, what)
	g.services[name] = out
}

// loadBalancerStatus sets the ingress points of a random LoadBalancer
// service, as a cloud controller would.
func (g *apiChurn) loadBalancerStatus() {
	var lbs []string
	for _, name := range existing(g.services) {
		if g.services[name].Spec.Type == v1.ServiceTypeLoadBalancer {
			lbs = append(lbs, name)
		}
	}
	if len(lbs) == 0 {
		g.updateService()
		return
	}
	name := pickOne(g.r, lbs)
	svc := g.services[name].DeepCopy()
	var ingress []v1.LoadBalancerIngress
	var desc []string
	for _, ip := range churnLBIPs {
		if !g.chance(2) {
			continue
		}
		in := v1.LoadBalancerIngress{IP: ip}
		switch g.r.IntN(3) {
		case 0:
			in.IPMode = ptr(v1.LoadBalancerIPModeVIP)
		case 1:
			in.IPMode = ptr(v1.LoadBalancerIPModeProxy)
		}
		ingress = append(ingress, in)
		desc = append(desc, fmt.Sprintf("%s(%v)", ip, deref(in.IPMode)))
	}
	svc.Status.LoadBalancer.Ingress = ingress
	out, err := g.c.CoreV1().Services(g.ns).UpdateStatus(context.Background(), svc, metav1.UpdateOptions{})
	g.record(err, "update service %s status: ingress %v", name, desc)
	g.services[name] = out
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// --- EndpointSlices ---

// createSlice creates slice name for a random service name (existing most
// of the time), labelled as the EndpointSlice controller would.
func (g *apiChurn) createSlice(name string) {
	owner := pickOne(g.r, churnServices)
	if names := existing(g.services); len(names) > 0 && !g.chance(6) {
		owner = pickOne(g.r, names)
	}
	s := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: g.ns, Name: name, Labels: map[string]string{}},
		AddressType: discovery.AddressTypeIPv4,
	}
	if g.chance(3) {
		s.AddressType = discovery.AddressTypeIPv6
	}
	g.ownerLabels(s, owner)
	for range g.r.IntN(4) {
		g.addEndpoint(s)
	}
	g.slicePorts(s)
	out, err := g.c.DiscoveryV1().EndpointSlices(g.ns).Create(context.Background(), s, metav1.CreateOptions{})
	g.record(err, "create slice %s: %s", name, describeSlice(s))
	g.slices[name] = out
}

// describeSlice says what a slice is, for the log.
func describeSlice(s *discovery.EndpointSlice) string {
	var eps []string
	for _, e := range s.Endpoints {
		c := e.Conditions
		eps = append(eps, fmt.Sprintf("%s(r=%v s=%v t=%v node=%v zone=%v hints=%v)", e.Addresses[0],
			deref(c.Ready), deref(c.Serving), deref(c.Terminating), deref(e.NodeName), deref(e.Zone), describeHints(e.Hints)))
	}
	var ports []string
	for _, p := range s.Ports {
		ports = append(ports, fmt.Sprintf("%v/%v:%v", deref(p.Name), deref(p.Protocol), deref(p.Port)))
	}
	return fmt.Sprintf("service=%s proxy=%t %s eps=%v ports=%v", s.Labels[discovery.LabelServiceName],
		s.Labels[kubetest.ProxyNameLabel] != "", s.AddressType, eps, ports)
}

func describeHints(h *discovery.EndpointHints) string {
	if h == nil {
		return "-"
	}
	return fmt.Sprintf("%v/%v", h.ForZones, h.ForNodes)
}

// ownerLabels labels s as a slice of service owner: the service-name label,
// and the proxy-name label copied from the service (or, for a service that
// does not exist, drawn at random).
func (g *apiChurn) ownerLabels(s *discovery.EndpointSlice, owner string) {
	s.Labels[discovery.LabelServiceName] = owner
	s.Labels[discovery.LabelManagedBy] = "kpng-tests"
	labelled := g.chance(2)
	if svc := g.services[owner]; svc != nil {
		_, labelled = svc.Labels[kubetest.ProxyNameLabel]
	}
	if labelled {
		s.Labels[kubetest.ProxyNameLabel] = g.proxyName
	} else {
		delete(s.Labels, kubetest.ProxyNameLabel)
	}
}

// addEndpoint adds an endpoint with an address of the slice's family not
// already in it.
func (g *apiChurn) addEndpoint(s *discovery.EndpointSlice) {
	pool := churnEPv4
	if s.AddressType == discovery.AddressTypeIPv6 {
		pool = churnEPv6
	}
	var unused []string
	for _, a := range pool {
		if !slices.ContainsFunc(s.Endpoints, func(e discovery.Endpoint) bool { return e.Addresses[0] == a }) {
			unused = append(unused, a)
		}
	}
	if len(unused) == 0 {
		return
	}
	e := discovery.Endpoint{Addresses: []string{pickOne(g.r, unused)}}
	g.conditions(&e)
	g.placement(&e)
	s.Endpoints = append(s.Endpoints, e)
}

// cond draws an optional condition: unset (which means true for ready and
// serving, false for terminating), true or false.
func (g *apiChurn) cond(likely bool) *bool {
	switch g.r.IntN(5) {
	case 0:
		return nil
	case 1:
		return ptr(!likely)
	}
	return ptr(likely)
}

// conditions draws an endpoint's conditions: ready, serving-terminating,
// not serving, or any mix (unset included).
func (g *apiChurn) conditions(e *discovery.Endpoint) {
	c := &e.Conditions
	switch g.r.IntN(4) {
	case 0:
		c.Ready, c.Serving, c.Terminating = ptr(false), ptr(true), ptr(true)
	case 1:
		c.Ready, c.Serving, c.Terminating = ptr(false), ptr(false), ptr(g.chance(2))
	default:
		c.Ready, c.Serving, c.Terminating = g.cond(true), g.cond(true), g.cond(false)
	}
}

// placement draws an endpoint's node (this one, another, none), zone and
// hints.
func (g *apiChurn) placement(e *discovery.Endpoint) {
	e.NodeName, e.Zone, e.Hints = nil, nil, nil
	switch g.r.IntN(3) {
	case 0:
		e.NodeName = ptr(g.node)
	case 1:
		e.NodeName = ptr(otherNode)
	}
	if !g.chance(3) {
		e.Zone = ptr(pickOne(g.r, churnZones))
	}
	if g.chance(2) {
		e.Hints = &discovery.EndpointHints{}
		for _, z := range churnZones {
			if g.chance(2) {
				e.Hints.ForZones = append(e.Hints.ForZones, discovery.ForZone{Name: z})
			}
		}
		if g.chance(3) {
			e.Hints.ForNodes = []discovery.ForNode{{Name: pickOne(g.r, []string{g.node, otherNode})}}
		}
	}
}

// slicePorts draws the slice's ports from its service's port names (most
// of them) with random numbers, or a random port when the service does not
// exist.
func (g *apiChurn) slicePorts(s *discovery.EndpointSlice) {
	s.Ports = nil
	svc := g.services[s.Labels[discovery.LabelServiceName]]
	if svc == nil {
		s.Ports = []discovery.EndpointPort{{Name: ptr(pickOne(g.r, churnPortName)), Protocol: ptr(v1.ProtocolTCP), Port: ptr(pickOne(g.r, churnTargets))}}
		return
	}
	for _, p := range svc.Spec.Ports {
		if g.chance(5) {
			continue
		}
		s.Ports = append(s.Ports, discovery.EndpointPort{Name: ptr(p.Name), Protocol: ptr(p.Protocol), Port: ptr(pickOne(g.r, churnTargets))})
	}
}

// updateSlice makes one change to a random slice (or creates one when
// there is none).
func (g *apiChurn) updateSlice() {
	names := existing(g.slices)
	if len(names) == 0 {
		g.createSlice(pickOne(g.r, churnSlices))
		return
	}
	name := pickOne(g.r, names)
	s := g.slices[name].DeepCopy()
	var did string
	switch g.r.IntN(10) {
	case 0, 1:
		if len(s.Endpoints) == 0 {
			g.addEndpoint(s)
			did = "add endpoint"
			break
		}
		g.conditions(&s.Endpoints[g.r.IntN(len(s.Endpoints))])
		did = "conditions"
	case 2:
		g.addEndpoint(s)
		did = "add endpoint"
	case 3:
		if len(s.Endpoints) > 0 {
			i := g.r.IntN(len(s.Endpoints))
			s.Endpoints = slices.Delete(s.Endpoints, i, i+1)
		}
		did = "remove endpoint"
	case 4:
		if len(s.Endpoints) > 0 {
			g.placement(&s.Endpoints[g.r.IntN(len(s.Endpoints))])
		}
		did = "node, zone, hints"
	case 5:
		g.slicePorts(s)
		did = "ports"
	case 6:
		if g.moveAddress(name) {
			return
		}
		did = "nothing to move; ports"
		g.slicePorts(s)
	case 7:
		owner := pickOne(g.r, churnServices)
		s.Labels[discovery.LabelServiceName] = owner
		did = "service-name label to " + owner
	case 8:
		g.ownerLabels(s, s.Labels[discovery.LabelServiceName])
		did = "labels copied from the service"
	default:
		if _, ok := s.Labels[kubetest.ProxyNameLabel]; ok {
			delete(s.Labels, kubetest.ProxyNameLabel)
			did = "remove proxy-name label"
		} else {
			s.Labels[kubetest.ProxyNameLabel] = g.proxyName
			did = "add proxy-name label"
		}
	}
	g.writeSlice(s, did)
}

// writeSlice updates slice s.
func (g *apiChurn) writeSlice(s *discovery.EndpointSlice, did string) {
	out, err := g.c.DiscoveryV1().EndpointSlices(g.ns).Update(context.Background(), s, metav1.UpdateOptions{})
	g.record(err, "update slice %s (%s): %s", s.Name, did, describeSlice(s))
	g.slices[s.Name] = out
}

// moveAddress moves an endpoint from slice from to another slice of the
// same service and address type, in two writes (added first or removed
// first), as the EndpointSlice controller does when it rebalances. It
// returns false when there is nothing to move or nowhere to move it.
func (g *apiChurn) moveAddress(from string) bool {
	src := g.slices[from].DeepCopy()
	if len(src.Endpoints) == 0 {
		return false
	}
	var dsts []string
	for _, name := range existing(g.slices) {
		s := g.slices[name]
		if name != from && s.AddressType == src.AddressType &&
			s.Labels[discovery.LabelServiceName] == src.Labels[discovery.LabelServiceName] {
			dsts = append(dsts, name)
		}
	}
	if len(dsts) == 0 {
		return false
	}
	i := g.r.IntN(len(src.Endpoints))
	e := src.Endpoints[i]
	dst := g.slices[pickOne(g.r, dsts)].DeepCopy()
	dst.Endpoints = slices.DeleteFunc(dst.Endpoints, func(d discovery.Endpoint) bool { return d.Addresses[0] == e.Addresses[0] })
	dst.Endpoints = append(dst.Endpoints, e)
	src.Endpoints = slices.Delete(src.Endpoints, i, i+1)
	what := fmt.Sprintf("move %s from %s to %s", e.Addresses[0], src.Name, dst.Name)
	if g.chance(2) {
		g.writeSlice(dst, what)
		g.writeSlice(src, what)
	} else {
		g.writeSlice(src, what)
		g.writeSlice(dst, what)
	}
	return true
}

// deleteSlice deletes a random slice.
func (g *apiChurn) deleteSlice() {
	names := existing(g.slices)
	if len(names) <= 4 {
		g.createSlice(pickOne(g.r, free(churnSlices, g.slices)))
		return
	}
	name := pickOne(g.r, names)
	err := g.c.DiscoveryV1().EndpointSlices(g.ns).Delete(context.Background(), name, metav1.DeleteOptions{})
	g.record(err, "delete slice %s", name)
	delete(g.slices, name)
}

// --- the Node ---

// changeZone moves the node to another zone, or to none.
func (g *apiChurn) changeZone() {
	n := g.nodeObj.DeepCopy()
	zone := pickOne(g.r, append([]string{""}, churnZones...))
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	if zone == "" {
		delete(n.Labels, "topology.kubernetes.io/zone")
	} else {
		n.Labels["topology.kubernetes.io/zone"] = zone
	}
	out, err := g.c.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{})
	g.record(err, "update node: zone %q", zone)
	g.nodeObj = out
}
