package remote

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/resolver"
	"k8s.io/klog/v2"
)

// ResolveScheme is the gRPC target scheme of the client's own resolver for
// controller names ("kpng-dns:///host:port"), given to each connection
// with grpc.WithResolvers: no process-global registration, so that a
// program embedding the client keeps gRPC's own "dns" resolver as it set
// it.
const ResolveScheme = "kpng-dns"

// Resolution timing of a controller name.
//
// ResolvePeriod is how often the name is resolved again without being
// asked: a replica that became ready since is then connected to before
// the one watched goes away, and the backend moves to it at once. 5 s is
// the DNS TTL CoreDNS gives cluster names by default (its kubernetes
// plugin's ttl): asking more often mostly returns the cached answer,
// while the cost stays one lookup per backend every 5 s (1,000 a second
// for 5,000 nodes, answered from the DNS servers' caches).
//
// ResolveNowGap is the least time between two resolutions gRPC asks for
// (ResolveNow, after a connection fails): the name is resolved at once
// when the connection watched is lost, but a flapping address does not
// make the backend flood the DNS server. gRPC's own DNS resolver waits
// 30 s there, process-wide: the replacement of a replica lost less than
// 30 s before was unknown that long.
//
// ResolveTimeout bounds one lookup.
const (
	ResolvePeriod  = 5 * time.Second
	ResolveNowGap  = 250 * time.Millisecond
	ResolveTimeout = 10 * time.Second
)

// lookupFunc resolves a host name to its addresses, as
// net.Resolver.LookupHost.
type lookupFunc func(ctx context.Context, host string) ([]string, error)

// resolveConfig is how names are resolved; the zero value is the
// defaults (net.DefaultResolver, ResolvePeriod, ResolveNowGap). Tests set
// their own lookup and timing.
type resolveConfig struct {
	lookup      lookupFunc
	period, gap time.Duration
	// logger, if set, is the resolvers' (Run's, from its context);
	// klog's global logger otherwise.
	logger *klog.Logger
}

// resolverBuilder builds a nameResolver for each ClientConn given it with
// grpc.WithResolvers. It also holds the controller's replicas' addresses
// the controllers told (their Peers call), which its resolvers add to the
// name's.
type resolverBuilder struct {
	cfg resolveConfig

	mu    sync.Mutex
	peers []string
	// live are the resolvers built and not closed (one, but gRPC builds a
	// new one when a connection leaves idleness).
	live map[*nameResolver]struct{}
}

// setPeers replaces the replicas' IP addresses the resolvers add to the
// name's, and has them tell their ClientConn at once.
func (b *resolverBuilder) setPeers(ips []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.peers = slices.Clone(ips)
	for r := range b.live {
		select {
		case r.peersChanged <- struct{}{}:
		default:
		}
	}
}

// peerAddrs returns the replicas' addresses with port.
func (b *resolverBuilder) peerAddrs(port string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]string, 0, len(b.peers))
	for _, ip := range b.peers {
		out = append(out, net.JoinHostPort(ip, port))
	}
	return out
}

func (b *resolverBuilder) forget(r *nameResolver) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.live, r)
}

// Scheme implements resolver.Builder.
func (b *resolverBuilder) Scheme() string { return ResolveScheme }

// Build implements resolver.Builder: it starts resolving the target's
// host at once, then every period and when gRPC asks, until Close.
func (b *resolverBuilder) Build(target resolver.Target, cc resolver.ClientConn, _ resolver.BuildOptions) (resolver.Resolver, error) {
	hostport := target.Endpoint()
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return nil, fmt.Errorf("resolve controller address %q: %w", hostport, err)
	}
	if host == "" {
		return nil, fmt.Errorf("resolve controller address %q: no host name", hostport)
	}
	r := &nameResolver{
		cc: cc, host: host, port: port, builder: b,
		lookup: b.cfg.lookup, period: b.cfg.period, gap: b.cfg.gap,
		now: make(chan struct{}, 1), peersChanged: make(chan struct{}, 1), done: make(chan struct{}),
	}
	if r.lookup == nil {
		r.lookup = net.DefaultResolver.LookupHost
	}
	if r.period <= 0 {
		r.period = ResolvePeriod
	}
	if r.gap <= 0 {
		r.gap = ResolveNowGap
	}
	logger := klog.Background()
	if b.cfg.logger != nil {
		logger = *b.cfg.logger
	}
	logger = logger.WithValues("controllerName", hostport)
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	r.cancel = cancel
	b.mu.Lock()
	if b.live == nil {
		b.live = map[*nameResolver]struct{}{}
	}
	b.live[r] = struct{}{}
	if len(b.peers) > 0 {
		// A resolver built again (gRPC leaving idleness) gives the
		// replicas known at once, whatever the name's lookup does.
		r.peersChanged <- struct{}{}
	}
	b.mu.Unlock()
	go r.run(ctx)
	return r, nil
}

// nameResolver keeps a ClientConn's addresses those of a host name, and of
// the replicas the controllers told (the builder's peers): it resolves the
// name at once, every period, and when gRPC asks (at most every gap), and
// gives the ClientConn the addresses only when they change. An error is
// reported to the ClientConn, which keeps the addresses it has: the
// connection up keeps its stream.
type nameResolver struct {
	cc          resolver.ClientConn
	host, port  string
	builder     *resolverBuilder
	lookup      lookupFunc
	period, gap time.Duration
	now         chan struct{}
	// peersChanged wakes run when the builder's peers change.
	peersChanged chan struct{}
	cancel       context.CancelFunc
	done         chan struct{}
	closeOnce    sync.Once
}

// ResolveNow implements resolver.Resolver: a resolution as soon as the
// gap since the last allows. It does not block.
func (r *nameResolver) ResolveNow(resolver.ResolveNowOptions) {
	select {
	case r.now <- struct{}{}:
	default:
	}
}

// Close implements resolver.Resolver: it stops the resolutions, a lookup
// under way included, and returns once they have.
func (r *nameResolver) Close() {
	r.closeOnce.Do(r.cancel)
	<-r.done
	r.builder.forget(r)
}

// run resolves until ctx ends.
func (r *nameResolver) run(ctx context.Context) {
	defer close(r.done)
	var (
		known []string // the addresses the ClientConn was last given
		dns   []string // the name's addresses, from the last lookup that found any
		last  time.Time
		// next is when the next resolution is due: now, at first.
		next  = time.Now()
		timer = time.NewTimer(0)
		fail  string // the last error logged, not to repeat it
	)
	defer timer.Stop()
	logger := klog.FromContext(ctx)
	// update gives the ClientConn the name's and the peers' addresses
	// when they changed.
	update := func() {
		addrs := slices.Concat(dns, r.builder.peerAddrs(r.port))
		slices.Sort(addrs)
		addrs = slices.Compact(addrs)
		if len(addrs) == 0 || slices.Equal(addrs, known) {
			return
		}
		logger.V(2).Info("The kpng controller's name resolves to new addresses", "addresses", addrs, "before", known, "resolved", dns)
		known = addrs
		state := resolver.State{Addresses: make([]resolver.Address, len(addrs))}
		for i, a := range addrs {
			state.Addresses[i] = resolver.Address{Addr: a}
		}
		if err := r.cc.UpdateState(state); err != nil {
			logger.V(2).Info("gRPC refused the controller's addresses", "addresses", addrs, "err", err)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.now:
			if at := last.Add(r.gap); at.Before(next) {
				next = at
				timer.Reset(time.Until(next))
			}
			continue
		case <-r.peersChanged:
			update()
			continue
		case <-timer.C:
		}
		addrs, err := r.resolve(ctx)
		if ctx.Err() != nil {
			return
		}
		last = time.Now()
		next = last.Add(r.period)
		timer.Reset(r.period)
		if err != nil {
			if err.Error() != fail {
				logger.Error(err, "Resolving the kpng controller's name failed; keeping its addresses", "addresses", known)
				fail = err.Error()
			}
			r.cc.ReportError(err)
			continue
		}
		if fail != "" {
			logger.Info("Resolving the kpng controller's name again", "addresses", addrs)
			fail = ""
		}
		dns = addrs
		update()
	}
}

// resolve looks the host up: its addresses with the port, sorted, without
// duplicates; an error for a name without any.
func (r *nameResolver) resolve(ctx context.Context) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, ResolveTimeout)
	defer cancel()
	ips, err := r.lookup(ctx, r.host)
	if err != nil {
		return nil, fmt.Errorf("resolve controller name %s: %w", r.host, err)
	}
	var out []string
	for _, ip := range ips {
		a, err := netip.ParseAddr(ip)
		if err != nil {
			return nil, fmt.Errorf("resolve controller name %s: address %q: %w", r.host, ip, err)
		}
		out = append(out, net.JoinHostPort(a.String(), r.port))
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("resolve controller name %s: %w", r.host, errNoAddresses)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// errNoAddresses is a lookup that found no address.
var errNoAddresses = errors.New("no addresses")
