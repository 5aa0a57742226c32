package userspace

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

// Sink is the userspace proxier: a localsink.Sink that listens on the
// addresses and ports of the services it receives and copies each
// connection or UDP flow to an endpoint. Sink calls come from one
// goroutine at a time (the localsink contract); Close may come from any.
type Sink struct {
	cfg    Config
	logger klog.Logger
	opts   Options
	plat   platform
	sock   sockets
	node   node
	// local holds the node's own addresses and the service addresses
	// the proxier holds: a client there is the node itself.
	local atomic.Pointer[map[netip.Addr]struct{}]
	wg    sync.WaitGroup

	// What the Sink calls change (one goroutine at a time).
	services map[model.ServiceKey]*model.ServiceEndpoints
	dirty    map[model.ServiceKey]bool
	reset    bool
	// planned are the frontends each service wants; owners, which
	// service has each frontend (of those that want it, the first in key
	// order, as a fresh start would decide); losers, the services that
	// wanted a frontend another one has, tried again at every Sync.
	planned map[model.ServiceKey]map[frontendKey]*route
	owners  map[frontendKey]model.ServiceKey
	losers  map[model.ServiceKey]bool
	limits  map[model.ServiceKey]*limiter
	// planProblems are the problems found planning each service,
	// conflicts those of the frontends another service has.
	planProblems, conflicts map[model.ServiceKey][]model.Problem
	// addrRefs counts the frontends of each service address; onLink are
	// the addresses actually on the interface (added once, when the
	// first frontend needs one, or retried after a failure); unbound are
	// the frontends whose socket or address could not be set up, tried
	// again at the next Sync; tried are those tried in the current Sync.
	addrRefs map[netip.Addr]int
	onLink   map[netip.Addr]bool
	// added are the addresses put on the interface in the current Sync,
	// which returns once they are local (awaitLocal).
	added   []netip.Addr
	unbound map[frontendKey]bool
	tried   map[frontendKey]bool
	// localStale is set when onLink changed since the last updateLocal.
	localStale bool
	// held counts the connections held in silence (dropped), across
	// services, so that refused clients cannot take a service's own
	// connections.
	held limiter
	// serviceCIDRs are the service CIDRs the cluster facts gave (the
	// default proxier's), routed nowhere; cidrsDirty says the platform
	// must be told (again, after a failure). cidrsOwned says that facts
	// came at least once: only then does the proxier touch the routes.
	serviceCIDRs           []netip.Prefix
	cidrsDirty, cidrsOwned bool

	// syncMu is held by Sync, and by Close while it releases the
	// platform: a Sync never uses a closed netlink handle.
	syncMu    sync.Mutex
	mu        sync.Mutex // guards frontends and closed against Close
	frontends map[frontendKey]*frontend
	closed    bool
}

var (
	_ localsink.ClusterSink     = (*Sink)(nil)
	_ localsink.ProblemReporter = (*Sink)(nil)
)

// New returns a proxier that serves nothing until its first Sync. On Linux
// it creates its dummy interface when missing and clears the addresses a
// previous run left on it. When ctx ends, the proxier closes (as Close:
// its listeners, connections and flows end); it logs through ctx's logger
// (klog.FromContext).
func New(ctx context.Context, cfg Config) (*Sink, error) {
	if err := cfg.Options.Validate(); err != nil {
		return nil, fmt.Errorf("userspace proxier %q: %w", cfg.ServiceProxyName, err)
	}
	logger := klog.FromContext(ctx)
	opts := cfg.Options.withDefaults(cfg.ServiceProxyName)
	plat, err := newPlatform(logger, cfg, opts)
	if err != nil {
		return nil, fmt.Errorf("userspace proxier %q: %w", cfg.ServiceProxyName, err)
	}
	p, err := newProxier(logger, cfg, opts, plat)
	if err != nil {
		_ = plat.close()
		return nil, fmt.Errorf("userspace proxier %q: %w", cfg.ServiceProxyName, err)
	}
	context.AfterFunc(ctx, p.Close)
	logger.Info("Userspace proxier ready", "serviceProxyName", cfg.ServiceProxyName, "interface", opts.Interface, "nodePortAddresses", p.node.nodePortAddrs)
	return p, nil
}

// newProxier returns a proxier on plat (a fake one in unit tests).
func newProxier(logger klog.Logger, cfg Config, opts Options, plat platform) (*Sink, error) {
	p := &Sink{
		cfg: cfg, logger: logger, opts: opts, plat: plat, sock: sockets{plat},
		services: map[model.ServiceKey]*model.ServiceEndpoints{}, dirty: map[model.ServiceKey]bool{},
		planned: map[model.ServiceKey]map[frontendKey]*route{}, owners: map[frontendKey]model.ServiceKey{},
		losers: map[model.ServiceKey]bool{}, limits: map[model.ServiceKey]*limiter{},
		planProblems: map[model.ServiceKey][]model.Problem{}, conflicts: map[model.ServiceKey][]model.Problem{},
		addrRefs: map[netip.Addr]int{}, onLink: map[netip.Addr]bool{}, unbound: map[frontendKey]bool{},
		tried: map[frontendKey]bool{}, frontends: map[frontendKey]*frontend{},
		held: limiter{max: maxHeld},
	}
	ips := opts.NodeIPs
	if len(ips) == 0 {
		var err error
		if ips, err = plat.nodeAddresses(); err != nil {
			return nil, err
		}
	}
	p.node = node{ips: ips, clusterCIDRs: opts.ClusterCIDRs}
	for _, a := range ips {
		if nodePortAddress(opts.NodePortAddresses, a) {
			p.node.nodePortAddrs = append(p.node.nodePortAddrs, a)
		}
	}
	p.updateLocal()
	return p, nil
}

// nodePortAddress reports whether node ports listen on the node address
// a: as kube-proxy, when it is inside one of the prefixes of its family,
// or when there is no prefix of its family (whatever the other family's)
// or a /0 one.
func nodePortAddress(prefixes []netip.Prefix, a netip.Addr) bool {
	own := familyPrefixes(prefixes, a.Is4())
	if len(own) == 0 {
		return true
	}
	for _, p := range own {
		if p.Bits() == 0 || p.Contains(a) {
			return true
		}
	}
	return false
}

// Cleanup removes what a proxier of cfg leaves behind after it stops: on
// Linux its dummy interface and the service addresses on it; on Windows
// the service addresses on its interface. It logs through ctx's logger.
func Cleanup(ctx context.Context, cfg Config) error {
	logger := klog.FromContext(ctx)
	if err := cleanup(logger, cfg, cfg.Options.withDefaults(cfg.ServiceProxyName)); err != nil {
		return fmt.Errorf("userspace proxier %q: cleanup: %w", cfg.ServiceProxyName, err)
	}
	logger.Info("Removed the userspace proxier's addresses", "serviceProxyName", cfg.ServiceProxyName)
	return nil
}

// Reset implements localsink.Sink.
func (p *Sink) Reset() {
	p.reset = true
	clear(p.services)
	if p.cidrsOwned {
		p.serviceCIDRs, p.cidrsDirty = nil, true
	}
}

// SetCluster implements localsink.ClusterSink: the service CIDRs (given
// only to the cluster's default proxier) get blackhole routes, so that
// their addresses no service holds are dropped, not routed out (the
// proxier's own addresses are local and found first). Linux only: on
// Windows they are not dropped (said once).
func (p *Sink) SetCluster(c *model.Cluster) {
	var cidrs []netip.Prefix
	if c != nil {
		var bad []netip.Prefix
		cidrs, bad = model.CanonicalCIDRs(c.ServiceCIDRs)
		for _, b := range bad {
			p.logger.Error(nil, "Service CIDR not usable: ignored", "serviceCIDR", b)
		}
	}
	p.serviceCIDRs, p.cidrsDirty, p.cidrsOwned = cidrs, true, true
}

// Update implements localsink.Sink.
func (p *Sink) Update(key model.ServiceKey, _, cur *model.ServiceEndpoints) {
	if cur == nil {
		delete(p.services, key)
	} else {
		p.services[key] = cur
	}
	p.dirty[key] = true
}

// Sync implements localsink.Sink: it replans the services changed since
// the last Sync and the services that lost a frontend to another, and
// opens, updates or closes their frontends. An endpoint change only
// replaces the routes of the service's frontends; open connections keep
// their endpoint. Problems in a service (a bad port, an address another
// service has) are logged and the rest is served; a socket or address
// that cannot be set up (taken by another program) fails the Sync, and is
// tried again at the next one, the other frontends being served
// meanwhile.
func (p *Sink) Sync() error {
	p.syncMu.Lock()
	defer p.syncMu.Unlock()
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return nil
	}
	start := time.Now()
	retry := slices.Collect(maps.Keys(p.unbound))
	clear(p.tried)
	keys := slices.Collect(maps.Keys(p.dirty))
	if p.reset {
		keys = append(keys, slices.Collect(maps.Keys(p.planned))...)
		p.reset = false
	}
	slices.SortFunc(keys, model.ServiceKey.Compare)
	keys = slices.Compact(keys)
	clear(p.dirty)
	var errs []error
	changed := 0
	for _, key := range keys {
		changed += p.replan(key, &errs)
	}
	// A frontend let go of in this round goes to the first service that
	// wanted it.
	losers := slices.Collect(maps.Keys(p.losers))
	slices.SortFunc(losers, model.ServiceKey.Compare)
	for _, key := range losers {
		changed += p.claim(key, p.planned[key], &errs)
	}
	// What failed before and was not tried again in this round.
	for _, k := range retry {
		if p.unbound[k] && !p.tried[k] {
			p.bind(k, &errs)
		}
	}
	// A client may send to a new address as soon as Sync returns.
	if len(p.added) > 0 {
		if err := p.plat.awaitLocal(p.added); err != nil {
			errs = append(errs, err)
		}
		p.added = p.added[:0]
	}
	if p.cidrsDirty {
		if err := p.plat.blackhole(p.serviceCIDRs); err != nil {
			errs = append(errs, fmt.Errorf("service CIDRs %v: %w", p.serviceCIDRs, err))
		} else {
			p.cidrsDirty = false
		}
	}
	// Only when the held addresses changed: rebuilding the set costs as
	// much as the number of services, and an endpoint change leaves it.
	if p.localStale {
		p.updateLocal()
		p.localStale = false
	}
	p.logger.V(2).Info("Userspace proxier synced", "services", len(keys), "frontendsChanged", changed, "frontends", len(p.frontends), "unbound", len(p.unbound), "duration", time.Since(start))
	return errors.Join(errs...)
}

// Problems implements localsink.ProblemReporter: the parts of the services
// held that are not proxied (a bad port, an address another service has),
// in key order, as of the last Sync.
func (p *Sink) Problems() []model.Problem {
	keys := slices.Collect(maps.Keys(p.planProblems))
	for k := range p.conflicts {
		if _, ok := p.planProblems[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, model.ServiceKey.Compare)
	var out []model.Problem
	for _, k := range keys {
		out = append(out, p.planProblems[k]...)
		out = append(out, p.conflicts[k]...)
	}
	return out
}

// replan plans service key again, releases the frontends it no longer
// wants and claims the others; it returns how many frontends changed.
func (p *Sink) replan(key model.ServiceKey, errs *[]error) int {
	var want map[frontendKey]*route
	delete(p.planProblems, key)
	if se := p.services[key]; se != nil && se.Service != nil {
		var problems []error
		want, problems = plan(se, p.node)
		for _, err := range problems {
			p.planProblems[key] = append(p.planProblems[key], model.ProblemOf(key, err))
		}
	}
	changed := 0
	for k := range p.planned[key] {
		if _, ok := want[k]; !ok && p.owners[k] == key {
			p.release(k)
			changed++
		}
	}
	if len(want) == 0 {
		delete(p.planned, key)
		delete(p.losers, key)
		delete(p.limits, key)
		delete(p.conflicts, key)
		return changed
	}
	p.planned[key] = want
	return changed + p.claim(key, want, errs)
}

// claim gives service key the frontends of want that are free or its
// own; it returns how many frontends changed.
func (p *Sink) claim(key model.ServiceKey, want map[frontendKey]*route, errs *[]error) int {
	delete(p.losers, key)
	delete(p.conflicts, key)
	lim := p.limits[key]
	if lim == nil {
		lim = &limiter{max: int64(p.opts.MaxConnectionsPerService)}
		p.limits[key] = lim
	}
	changed := 0
	for _, k := range sortedKeys(want) {
		r := want[k]
		if owner, ok := p.owners[k]; ok && owner != key {
			if owner.Compare(key) < 0 {
				p.conflicts[key] = append(p.conflicts[key], *model.NewProblem(key, r.kind.field(), model.ReasonAddressConflict,
					"service %s port %q: %s already used by service %s: not proxied until it lets go", key, r.port, k, owner))
				p.losers[key] = true
				continue
			}
			// The first service in key order has it, whatever the
			// history, as a fresh proxier would: the other waits.
			if f := p.frontends[k]; f != nil {
				or := f.route.Load()
				p.conflicts[owner] = append(p.conflicts[owner], *model.NewProblem(owner, or.kind.field(), model.ReasonAddressConflict,
					"service %s port %q: %s taken by service %s, first in order: not proxied until it lets go", owner, or.port, k, key))
			}
			p.release(k)
			p.losers[owner] = true
			changed++
		}
		f := p.frontends[k]
		if f != nil && f.route.Load().equal(r) && !p.unbound[k] {
			continue
		}
		changed++
		if f != nil && f.route.Load().kind.holdsAddress() != r.kind.holdsAddress() {
			// A service address became a node port or back (the node's
			// own address as an external IP): start afresh, so that
			// the address is counted by what the frontend is now.
			p.release(k)
			f = nil
		}
		// A frontend set up before has its address: a new route only
		// changes where new connections go, and opens or closes its
		// socket.
		bound := f != nil && !p.unbound[k]
		if f == nil {
			f = &frontend{key: k, p: p, limit: lim}
			f.route.Store(r)
			p.owners[k] = key
			p.mu.Lock()
			p.frontends[k] = f
			f.closed = p.closed // Close came meanwhile: never listen
			p.mu.Unlock()
			if r.kind.holdsAddress() {
				p.addrRefs[k.addr.Addr()]++
			}
		}
		f.route.Store(r)
		if !bound {
			p.bind(k, errs)
		} else if err := f.setRoute(r); err != nil {
			p.unbound[k] = true
			*errs = append(*errs, err)
		}
	}
	return changed
}

// bind makes sure the frontend k has its address and, when its route
// listens, its socket; on failure it stays in unbound.
func (p *Sink) bind(k frontendKey, errs *[]error) {
	f := p.frontends[k]
	if f == nil {
		delete(p.unbound, k)
		return
	}
	p.tried[k] = true
	r := f.route.Load()
	if a := k.addr.Addr(); r.kind.holdsAddress() && !p.onLink[a] {
		if err := p.plat.addAddress(a); err != nil {
			p.unbound[k] = true
			*errs = append(*errs, fmt.Errorf("service %s port %q: %w", r.service, r.port, err))
			return
		}
		p.onLink[a] = true
		p.added = append(p.added, a)
		p.localStale = true
	}
	if err := f.setRoute(r); err != nil {
		p.unbound[k] = true
		*errs = append(*errs, err)
		return
	}
	delete(p.unbound, k)
}

// release closes frontend k and takes its address off when no other
// frontend uses it.
func (p *Sink) release(k frontendKey) {
	p.mu.Lock()
	f := p.frontends[k]
	delete(p.frontends, k)
	p.mu.Unlock()
	delete(p.owners, k)
	delete(p.unbound, k)
	if f == nil {
		return
	}
	f.close()
	if !f.route.Load().kind.holdsAddress() {
		return
	}
	a := k.addr.Addr()
	if p.addrRefs[a]--; p.addrRefs[a] > 0 {
		return
	}
	delete(p.addrRefs, a)
	if !p.onLink[a] {
		return
	}
	delete(p.onLink, a)
	p.localStale = true
	if err := p.plat.removeAddress(a); err != nil {
		p.logger.Error(err, "Service address not removed", "address", a)
	}
}

// updateLocal recomputes the node's own addresses: its interfaces' and
// the service addresses held.
func (p *Sink) updateLocal() {
	m := make(map[netip.Addr]struct{}, len(p.node.ips)+len(p.onLink))
	for _, a := range p.node.ips {
		m[a] = struct{}{}
	}
	for a := range p.onLink {
		m[a] = struct{}{}
	}
	p.local.Store(&m)
}

// isLocal reports whether a is an address of this node.
func (p *Sink) isLocal(a netip.Addr) bool {
	if a.IsLoopback() {
		return true
	}
	_, ok := (*p.local.Load())[a]
	return ok
}

// Close stops every frontend, closes every connection and flow, and waits
// for their goroutines and for a Sync running meanwhile. The addresses stay on the interface (traffic to
// them is refused by the kernel); Cleanup removes them.
func (p *Sink) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	fs := slices.Collect(maps.Values(p.frontends))
	p.mu.Unlock()
	for _, f := range fs {
		f.close()
	}
	p.wg.Wait()
	// A Sync running meanwhile finishes first (it opens nothing more:
	// every frontend is closed, or made closed).
	p.syncMu.Lock()
	defer p.syncMu.Unlock()
	_ = p.plat.close()
}

// sortedKeys returns the keys of m in a stable order (protocol, address,
// port), so that conflicts and logs come out the same every time.
func sortedKeys(m map[frontendKey]*route) []frontendKey {
	keys := slices.Collect(maps.Keys(m))
	slices.SortFunc(keys, func(a, b frontendKey) int {
		if a.proto != b.proto {
			return int(a.proto) - int(b.proto)
		}
		return a.addr.Compare(b.addr)
	})
	return keys
}
