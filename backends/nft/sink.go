//go:build linux

package nft

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/client/model"
	"sigs.k8s.io/kpng/localsink"
)

// Config configures the nftables sink.
type Config struct {
	// ServiceProxyName is the proxier's service-proxy-name; the table is
	// TableName(ServiceProxyName).
	ServiceProxyName string
	// Options shape the rules: masquerading, node port addresses.
	Options Options
	// Conn returns a new nftables connection with the options given
	// added to its own; nil means nftables.New, in the current network
	// namespace (to work in another one, pass a function calling
	// nftables.New with nftables.WithNetNSFd(fd) and the options).
	Conn func(...nftables.ConnOption) (*nftables.Conn, error)
	// Conntrack returns a new netlink handle for deleting stale UDP
	// conntrack entries after the transactions (see StaleFlows); the
	// sink closes it after use. nil means
	// netlink.NewHandle(unix.NETLINK_NETFILTER), in the current network
	// namespace: set it with Conn when working in another one
	// (netlink.NewHandleAt).
	Conntrack func() (*netlink.Handle, error)
	// AfterSync, if set, is called at the end of each Sync that sent a
	// transaction (or tried to), and of each retry, with its result. It
	// may be called from another goroutine (retries), never concurrently.
	AfterSync func(SyncResult)
	// RetryInterval is how long after a failed transaction the whole
	// table is written again, if no Sync did it first; it doubles after
	// each failed retry, up to a minute. 0 means one second.
	RetryInterval time.Duration
	// Context, if set, stops the retries when it ends, and then closes
	// the sink's lasting netlink connection (a later Sync opens another).
	Context context.Context
}

// maxRetryInterval bounds the retry backoff.
const maxRetryInterval = time.Minute

// SyncResult describes one transaction of a Sync.
type SyncResult struct {
	// Full is true when the whole table was rewritten (first sync, after
	// a Reset or after a failed transaction).
	Full bool
	// Services are the services whose objects changed (for a full sync:
	// every service held).
	Services []model.ServiceKey
	// Stats is the size of the transaction.
	Stats Stats
	// Duration is the time spent computing and sending it.
	Duration time.Duration
	// Err is the error of the transaction, if it failed: then nothing of it
	// was applied and the next Sync is a full one.
	Err error
}

// sink is the localsink.Sink of this package. Its methods are called by
// one goroutine, the retry timer runs on another: mu guards everything.
type sink struct {
	mu         sync.Mutex
	retry      *time.Timer // the pending retry, if any
	retryGen   uint64      // identifies the pending retry
	retryAfter time.Duration
	cfg        Config
	table      string
	store      *localsink.Store
	tracker    *Tracker
	applier    *Applier
	needFull   bool
	// staleFlows are the conntrack entries to delete after the next
	// successful transaction.
	staleFlows []StaleFlow
}

// NewSink returns a localsink.Sink that programs the services it receives
// into the nftables table TableName(cfg.ServiceProxyName): the first Sync
// (and the first one after a Reset or a failure) replaces the whole table
// in one transaction, later ones send only what changed. It checks that
// nftables can be used (listing the tables) before returning.
func NewSink(cfg Config) (localsink.Sink, error) {
	s := &sink{
		cfg:      cfg,
		table:    TableName(cfg.ServiceProxyName),
		store:    localsink.NewStore(),
		tracker:  NewTracker(cfg.Options),
		needFull: true,
	}
	if s.cfg.RetryInterval <= 0 {
		s.cfg.RetryInterval = time.Second
	}
	if s.cfg.Context == nil {
		s.cfg.Context = context.Background()
	}
	s.retryAfter = s.cfg.RetryInterval
	if err := cfg.Options.Validate(); err != nil {
		return nil, fmt.Errorf("nftables backend: %w", err)
	}
	s.applier = NewApplier(cfg.Conn, s.table)
	conn, err := s.applier.newConn()
	if err != nil {
		return nil, fmt.Errorf("nftables backend: %w", err)
	}
	if _, err := conn.ListTablesOfFamily(nftables.TableFamilyINet); err != nil {
		return nil, fmt.Errorf("nftables backend: list tables (root or CAP_NET_ADMIN needed): %w", err)
	}
	context.AfterFunc(s.cfg.Context, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.applier.Close()
	})
	return s, nil
}

// Reset implements localsink.Sink.
func (s *sink) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.store.Reset()
}

// SetService implements localsink.Sink.
func (s *sink) SetService(svc *model.Service) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.store.SetService(svc)
}

// DeleteService implements localsink.Sink.
func (s *sink) DeleteService(key model.ServiceKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.store.DeleteService(key)
}

// SetEndpoint implements localsink.Sink.
func (s *sink) SetEndpoint(svc model.ServiceKey, key string, ep *model.Endpoint) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.store.SetEndpoint(svc, key, ep)
}

// DeleteEndpoint implements localsink.Sink.
func (s *sink) DeleteEndpoint(svc model.ServiceKey, key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.store.DeleteEndpoint(svc, key)
}

// retryFull rewrites the whole table with the state of the last round
// (not the round in progress, if any: it would be half-applied), after a
// failed transaction that no Sync has repaired since.
func (s *sink) retryFull(gen uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.retry == nil || s.retryGen != gen || !s.needFull || s.cfg.Context.Err() != nil {
		return
	}
	s.retry = nil
	start := time.Now()
	res := SyncResult{Full: true, Services: s.tracker.ServiceKeys()}
	res.Stats, res.Err = s.applier.Full(s.tracker.Ruleset(s.table))
	res.Duration = time.Since(start)
	s.finish(res, "retry")
}

// Sync implements localsink.Sink: it applies the round.
func (s *sink) Sync() {
	s.mu.Lock()
	defer s.mu.Unlock()
	start := time.Now()
	changed, reset := s.store.Commit()
	if reset {
		s.tracker = NewTracker(s.cfg.Options)
		s.needFull = true
		// The store marks the services it dropped as changed: rebuild
		// from what it holds now, in key order (on a conflict, the first
		// service keeps the address).
		changed = s.store.Keys()
		slices.SortFunc(changed, model.ServiceKey.Compare)
	}
	for _, key := range changed {
		s.update(key)
	}
	// A service that lost an address to another one gets it when the
	// other lets it go, without waiting for a change of its own.
	for _, key := range s.tracker.LosersToRetry() {
		s.update(key)
	}
	delta := s.tracker.Done()
	s.staleFlows = append(s.staleFlows, s.tracker.StaleFlows(delta)...)

	res := SyncResult{Full: s.needFull}
	if s.needFull {
		rs := s.tracker.Ruleset(s.table)
		res.Services = s.store.Keys()
		slices.SortFunc(res.Services, model.ServiceKey.Compare)
		res.Stats, res.Err = s.applier.Full(rs)
	} else {
		if delta.Len() == 0 {
			klog.V(4).InfoS("Nothing to change", "table", s.table, "services", len(changed))
			return
		}
		res.Services = delta.Services()
		res.Stats, res.Err = s.applier.Partial(delta)
	}
	res.Duration = time.Since(start)
	s.finish(res, "sync")
}

// update gives the tracker the current state of the service key, logging
// what cannot be programmed.
func (s *sink) update(key model.ServiceKey) {
	for _, p := range s.tracker.Update(key, s.store.Get(key)) {
		klog.InfoS("Part of a service cannot be programmed", "table", s.table, "service", key, "problem", p.Error())
	}
}

// finish records the outcome of a transaction: on failure, the next one
// is full and a retry is scheduled (backing off); on success, the retries
// stop.
func (s *sink) finish(res SyncResult, kind string) {
	if res.Err != nil {
		s.needFull = true
		services := res.Services
		if len(services) > 20 {
			services = services[:20]
		}
		klog.ErrorS(res.Err, "nftables transaction rejected: nothing of it applied; the whole table will be rewritten",
			"table", s.table, "kind", kind, "full", res.Full, "services", services, "servicesCount", len(res.Services), "retryIn", s.retryAfter)
		if s.retry != nil {
			s.retry.Stop()
		}
		s.retryGen++
		gen := s.retryGen
		s.retry = time.AfterFunc(s.retryAfter, func() { s.retryFull(gen) })
		s.retryAfter = min(2*s.retryAfter, maxRetryInterval)
	} else {
		s.needFull = false
		if s.retry != nil {
			s.retry.Stop()
			s.retry = nil
		}
		s.retryAfter = s.cfg.RetryInterval
		klog.V(2).InfoS("nftables table synced", "table", s.table, "kind", kind, "full", res.Full,
			"services", len(res.Services), "messages", res.Stats.Messages, "objects", res.Stats.Objects(), "duration", res.Duration)
		s.flushStaleFlows()
	}
	if s.cfg.AfterSync != nil {
		s.cfg.AfterSync(res)
	}
}
