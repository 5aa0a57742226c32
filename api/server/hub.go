// Package server is the controller side of the kpng API: a Hub that holds
// the state fed by any source (the watcher, a file, another controller) and
// serves it over gRPC to any number of backends, each seeing it from its own
// node and receiving only the changes to its own view.
package server

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

// Hub is a localsink.Sink that publishes each consistent state (on Sync) to
// its subscribers. Feeding it never blocks on a subscriber: a node-independent
// stream keeps its position in the hub's log of encoded rounds (shared.go), a
// per-node one its own set of changed services, and each catches up at its
// own pace, seeing the latest state (intermediate ones may be skipped for a
// slow subscriber).
// It takes the trigger times of the changes (localsink.TriggerSink) and
// passes them on to every subscriber, those of skipped states included.
type Hub struct {
	// staged are the services changed in the round being fed, and
	// stagedTriggers their trigger times, touched only by the feeding
	// goroutine; stagedCluster the cluster-level facts given in it (when
	// clusterStaged).
	staged         map[model.ServiceKey]*model.ServiceEndpoints
	stagedTriggers map[model.ServiceKey][]time.Time
	stagedCluster  *model.Cluster
	clusterStaged  bool

	mu        sync.RWMutex
	published map[model.ServiceKey]*model.ServiceEndpoints
	cluster   *model.Cluster // the cluster-level facts published
	synced    bool           // a first state was published
	reset     bool           // the round being fed started with Reset
	zones     map[string]string
	subs      map[*subscription]struct{}
	nodeViews bool

	// The node-independent stream (shared.go), under mu: each published
	// service's whole encoding, the state's hash (clusterHash the cluster
	// facts' part of it), the log of encoded rounds (logBytes in all, gen
	// the last round's number) and the last snapshot (snapMu: built by
	// one stream at a time while others read the state; kept after the
	// state changed, for the next one to share its unchanged batches).
	whole       map[model.ServiceKey]wholeService
	hash        stateHash
	clusterHash stateHash
	log         []*round
	logBytes    int
	logLimit    int // maxLogBytes but in tests
	gen         uint64
	snapMu      sync.Mutex
	snap        *snapshot
	// deflatedCopies are the compressed copies (Batch.deflated_ops
	// fields) of the last snapshot's batches that a stream taking
	// deflated operations needed (snapMu): the next snapshot shares those
	// of its unchanged batches.
	deflatedCopies map[batchKey][]byte
	// The counters of SharedStats.
	snapshots, resumed, caughtUp, deflatedBatches atomic.Uint64
}

var (
	_ localsink.ClusterSink = (*Hub)(nil)
	_ localsink.TriggerSink = (*Hub)(nil)
)

// maxSubscriberTriggers bounds the trigger times a subscriber that lags
// behind keeps: beyond, newer ones are dropped (their latency is not
// measured).
const maxSubscriberTriggers = 10000

// NewHub returns an empty Hub. With nodeViews, each subscriber sees Local
// and topology hint matches computed for its node (use it when the source
// knows node names, as the Kubernetes watcher does); without, subscribers
// see the state exactly as fed.
func NewHub(nodeViews bool) *Hub {
	h := &Hub{
		staged:         map[model.ServiceKey]*model.ServiceEndpoints{},
		stagedTriggers: map[model.ServiceKey][]time.Time{},
		published:      map[model.ServiceKey]*model.ServiceEndpoints{},
		zones:          map[string]string{},
		subs:           map[*subscription]struct{}{},
		nodeViews:      nodeViews,
		whole:          map[model.ServiceKey]wholeService{},
		clusterHash:    clusterHash(nil),
		logLimit:       maxLogBytes,
	}
	h.hash = h.clusterHash
	return h
}

// SharedStats are the counters of a hub's node-independent stream.
type SharedStats struct {
	// Snapshots is the number of whole states encoded for the streams
	// (each shared by every stream starting before the next round).
	Snapshots uint64
	// Resumed is the number of streams that started without a whole
	// state, their client holding the hub's state already.
	Resumed uint64
	// CaughtUp is the number of times a stream fell behind the log of
	// rounds and was sent a whole state instead.
	CaughtUp uint64
	// Deflated is the number of snapshot batches compressed for the
	// streams taking deflated operations (each once, for all of them).
	Deflated uint64
	// LogRounds and LogBytes are the rounds the log holds now and their
	// encoded size.
	LogRounds, LogBytes int
}

// SharedStats returns the counters of the node-independent stream.
func (h *Hub) SharedStats() SharedStats {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return SharedStats{
		Snapshots: h.snapshots.Load(), Resumed: h.resumed.Load(), CaughtUp: h.caughtUp.Load(), Deflated: h.deflatedBatches.Load(),
		LogRounds: len(h.log), LogBytes: h.logBytes,
	}
}

// Reset implements localsink.Sink: the services published and not fed
// again in this round are gone on Sync, and so are the cluster-level
// facts unless the round gives them again.
func (h *Hub) Reset() {
	clear(h.staged)
	clear(h.stagedTriggers)
	h.reset = true
	h.stagedCluster, h.clusterStaged = nil, true
}

// SetCluster implements localsink.ClusterSink: the facts are published
// on Sync, for every subscriber.
func (h *Hub) SetCluster(c *model.Cluster) { h.stagedCluster, h.clusterStaged = c, true }

// Update implements localsink.Sink.
func (h *Hub) Update(key model.ServiceKey, _, cur *model.ServiceEndpoints) { h.staged[key] = cur }

// Triggered implements localsink.TriggerSink: the times go to every
// subscriber with the round.
func (h *Hub) Triggered(key model.ServiceKey, times []time.Time) {
	h.stagedTriggers[key] = append(h.stagedTriggers[key], times...)
}

// Sync implements localsink.Sink: it publishes the staged state and tells
// every subscriber which services changed.
func (h *Hub) Sync() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.reset {
		for key := range h.published {
			if _, ok := h.staged[key]; !ok {
				h.staged[key] = nil
			}
		}
		h.reset = false
	}
	keys := make([]model.ServiceKey, 0, len(h.staged))
	for key := range h.staged {
		keys = append(keys, key)
	}
	if len(keys) > 0 || h.clusterStaged || len(h.stagedTriggers) > 0 {
		h.encodeRound(keys, h.clusterStaged)
	}
	for _, key := range keys {
		if se := h.staged[key]; se != nil {
			h.published[key] = se
		} else {
			delete(h.published, key)
		}
	}
	clear(h.staged)
	if h.clusterStaged {
		h.cluster, h.stagedCluster, h.clusterStaged = h.stagedCluster, nil, false
	}
	h.synced = true
	for sub := range h.subs {
		if sub.shared {
			sub.signal()
		} else {
			sub.markDirty(keys, h.stagedTriggers)
		}
	}
	clear(h.stagedTriggers)
	return nil
}

// SetNodeZone records the zone of a node, for the topology hints of the
// subscribers on that node (only with node views).
func (h *Hub) SetNodeZone(node, zone string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.zones[node] == zone {
		return
	}
	if zone == "" {
		delete(h.zones, node)
	} else {
		h.zones[node] = zone
	}
	for sub := range h.subs {
		switch {
		case sub.node != node:
		case sub.shared:
			sub.markNodeDirty()
		default:
			sub.markAllDirty()
		}
	}
}

// Subscribers returns the number of subscribers.
func (h *Hub) Subscribers() int {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return len(h.subs)
}

// subscription is one subscriber's pending work: with shared, a stream of
// the node-independent state (shared.go), which needs no more than a
// position in the hub's log; otherwise its node's view, whose changed
// services it keeps.
type subscription struct {
	node   string
	notify chan struct{}
	shared bool
	// deflate: a shared stream whose client takes the large batches of a
	// first state compressed (WatchRequest.accept_deflated).
	deflate bool
	// cursor is the last round a shared stream sent (its sender's: its own
	// goroutine, or one of the senders while it is pooled).
	cursor uint64

	mu    sync.Mutex
	dirty map[model.ServiceKey]struct{}
	all   bool
	// nodeDirty: the node's facts changed (shared streams); have: the
	// state hash the client said it holds, until its first state.
	nodeDirty bool
	have      []byte
	// triggers are the trigger times of the changes not yet taken,
	// nTriggers how many in all.
	triggers  map[model.ServiceKey][]time.Time
	nTriggers int

	// The senders (pool.go) of a node-independent stream: pooled, its own
	// goroutine handed it to pool, which sends on out; queued, it waits
	// for a sender; active, a sender is sending for it (again: signaled
	// meanwhile; senderDone is broadcast when it stops); handed and
	// failed, what a sender gave back to its own goroutine: messages to
	// send first, or the error that ended a send; closed, its own
	// goroutine returned.
	pool                                  *senders
	out                                   *rawSender
	pooled, queued, active, again, closed bool
	senderDone                            *sync.Cond
	handed                                []message
	failed                                error
}

func (s *subscription) markDirty(keys []model.ServiceKey, triggers map[model.ServiceKey][]time.Time) {
	s.mu.Lock()
	for _, k := range keys {
		s.dirty[k] = struct{}{}
	}
	for k, times := range triggers {
		times = times[:min(len(times), maxSubscriberTriggers-s.nTriggers)]
		if len(times) == 0 {
			continue
		}
		if s.triggers == nil {
			s.triggers = map[model.ServiceKey][]time.Time{}
		}
		s.triggers[k] = append(s.triggers[k], times...)
		s.nTriggers += len(times)
	}
	s.mu.Unlock()
	s.signal()
}

// wantsAll tells whether the subscriber's next round is its whole view.
func (s *subscription) wantsAll() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.all
}

func (s *subscription) markAllDirty() {
	s.mu.Lock()
	s.all = true
	s.mu.Unlock()
	s.signal()
}

func (s *subscription) markNodeDirty() {
	s.mu.Lock()
	s.nodeDirty = true
	s.mu.Unlock()
	s.signal()
}

// signal tells the subscriber it has something to send: its own
// goroutine, or the senders when it is theirs.
func (s *subscription) signal() {
	if s.shared && s.enqueue() {
		return
	}
	s.wake()
}

// subscribe registers a subscriber for node; the first state (when there is
// one) is pending at once. It is a shared stream when the client computes
// its own view (independent), or when the hub has no node views (every
// node's view is the state); have is the state hash the client holds;
// deflate, the client takes deflated operations (shared streams only).
func (h *Hub) subscribe(node string, independent, deflate bool, have []byte) *subscription {
	s := &subscription{node: node, notify: make(chan struct{}, 1), all: true, shared: independent || !h.nodeViews, have: have}
	s.deflate = s.shared && deflate
	s.senderDone = sync.NewCond(&s.mu)
	if !s.shared {
		s.dirty = map[model.ServiceKey]struct{}{}
	}
	h.mu.Lock()
	h.subs[s] = struct{}{}
	synced := h.synced
	h.mu.Unlock()
	if synced {
		s.signal()
	}
	return s
}

func (h *Hub) unsubscribe(s *subscription) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.subs, s)
}

// pending takes a subscriber's pending changes: the state of each changed
// service as seen from its node (nil: gone), sorted by key, and the
// cluster-level facts published, and the trigger times of the changes.
// ok is false while no state has been published yet.
func (h *Hub) pending(s *subscription) (keys []model.ServiceKey, states []*model.ServiceEndpoints, cluster *model.Cluster, triggers map[model.ServiceKey][]time.Time, ok bool) {
	s.mu.Lock()
	all, dirty := s.all, s.dirty
	s.all, s.dirty = false, map[model.ServiceKey]struct{}{}
	triggers, s.triggers, s.nTriggers = s.triggers, nil, 0
	s.mu.Unlock()

	h.mu.RLock()
	defer h.mu.RUnlock()
	if !h.synced {
		// Nothing published yet: keep the request for later.
		s.mu.Lock()
		s.all = s.all || all
		s.mu.Unlock()
		return nil, nil, nil, nil, false
	}
	if all {
		// Everything published, plus what the subscriber may hold that is
		// gone (dirty keys): the caller's Differ sorts it out.
		for k := range h.published {
			dirty[k] = struct{}{}
		}
	}
	keys = make([]model.ServiceKey, 0, len(dirty))
	for k := range dirty {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, model.ServiceKey.Compare)
	node := model.Node{Name: s.node, Zone: h.zones[s.node]}
	states = make([]*model.ServiceEndpoints, len(keys))
	for i, k := range keys {
		se := h.published[k]
		if se != nil && h.nodeViews {
			se = node.ViewService(se)
		}
		states[i] = se
	}
	return keys, states, h.cluster, triggers, true
}
