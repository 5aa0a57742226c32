package server

import (
	"cmp"
	"crypto/sha256"
	"slices"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/api/kpngv1"
	"sigs.k8s.io/kpng/model"
)

// The node-independent stream: what every backend that computes its own
// view receives, encoded once and sent as the same bytes to all of them.
//
// The hub keeps, with its published state, each service's whole encoding
// (set_service and its set_endpoints: what a first state sends of it) and
// a log of the rounds since, each encoded once on Sync (the operations of
// the services that changed, then the round's sync). A backend's stream
// holds only a position in that log: a first state is a Reset of its own
// followed by a snapshot (the services' encodings put together, shared by
// every stream that starts before the next round), then the rounds after
// it. A stream that falls behind the log's start (it read more
// slowly than the log's bytes bound allows) starts over from a snapshot,
// which its client turns into the difference: it costs the controller a
// position, never a queue of its own.

// maxLogBytes bounds the encoded rounds the hub keeps for the streams
// that have not sent them yet; past it, the oldest rounds are dropped and
// a stream still needing them is sent a snapshot instead.
const maxLogBytes = 32 << 20

// sharedBatchBytes bounds the shared Batch messages (an operation larger
// than that alone in its batch): about the size of a per-node stream's
// 1,000-operation batches, so that a backend that reads a batch in a time
// within the send timeout reads each of these too.
const sharedBatchBytes = 128 << 10

// roundOverhead is what a round costs beyond its bytes, counted in the
// log's bound.
const roundOverhead = 128

// stateHash identifies a node-independent state: the XOR of its services'
// hashes and of its cluster facts' hash, so that it follows a change in
// O(change).
type stateHash [16]byte

func (h *stateHash) xor(o stateHash) {
	for i := range h {
		h[i] ^= o[i]
	}
}

// hashOf hashes the concatenation of parts.
func hashOf(parts ...[]byte) stateHash {
	h := sha256.New()
	for _, p := range parts {
		h.Write(p)
	}
	return stateHash(h.Sum(nil)[:16])
}

// wholeService is a published service's encoding as a first state sends
// it, and its hash.
type wholeService struct {
	ops  []byte // framed Batch.ops fields
	hash stateHash
}

// message is one Batch message ready to send: its encoding is the
// concatenation of its pieces, which gRPC writes as they are. It is built
// once, when its batch is complete, and handed as it is to every stream
// sending it (gRPC only reads a BufferSlice, and a SliceBuffer's Ref and
// Free do nothing): building a piece list per send cost more than half of
// the controller's allocations during 1,000 first states.
type message mem.BufferSlice

// size is the message's length in bytes.
func (m message) size() int { return mem.BufferSlice(m).Len() }

// messageOf makes a message of pieces.
func messageOf(pieces [][]byte) message {
	m := make(message, len(pieces))
	for i, p := range pieces {
		m[i] = mem.SliceBuffer(p)
	}
	return m
}

// round is one Sync's changes, encoded: Batch messages ready to send.
type round struct {
	gen     uint64
	batches []message
	size    int
}

// snapshot is the whole published state at gen, encoded: Batch messages
// holding every service then the sync (without the Reset, which is each
// stream's own). A batch of services is one piece, a copy of their
// encodings (refs, the same batch as references to them): gRPC walks a
// message piece by piece several times for each frame of each stream it
// sends it on, and a batch of some two hundred pieces cost a tenth of the
// controller's CPU during 5,000 first states. A batch whose services did
// not change since the last snapshot shares its copy: a snapshot built
// after a change costs the batches the change touched, not a copy of the
// state.
type snapshot struct {
	gen     uint64
	batches []message
	refs    []message
	// deflated are the batches compressed (Hub.deflated), nil until a
	// stream taking them needs them.
	deflated []message
}

// index returns where s's batches start (the first byte of each one's
// first piece) and which batch starts there; none for a nil s.
func (s *snapshot) index() map[*byte]int {
	if s == nil {
		return nil
	}
	m := make(map[*byte]int, len(s.refs))
	for i, r := range s.refs {
		m[&r[0].ReadOnlyData()[0]] = i
	}
	return m
}

// copyOf returns refs as one piece: the copy of s's batch of the same
// pieces (the same bytes: the services' encodings never change) when s
// has one (index is s's), a new one otherwise.
func (s *snapshot) copyOf(refs message, index map[*byte]int) message {
	if i, ok := index[&refs[0].ReadOnlyData()[0]]; ok && samePieces(s.refs[i], refs) {
		return s.batches[i]
	}
	if len(refs) == 1 {
		return refs
	}
	return messageOf([][]byte{mem.BufferSlice(refs).Materialize()})
}

// samePieces tells whether a and b are the same pieces of memory.
func samePieces(a, b message) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i].ReadOnlyData(), b[i].ReadOnlyData()
		if len(x) != len(y) || &x[0] != &y[0] {
			return false
		}
	}
	return true
}

// deterministic is how every shared encoding is marshaled: map fields
// (labels, port overrides) in key order, so that the same state has the
// same bytes and hash in every controller.
var deterministic = proto.MarshalOptions{Deterministic: true}

// frame returns op as a Batch.ops field.
func frame(dst []byte, op *kpngv1.Op) []byte {
	b, err := deterministic.Marshal(op)
	if err != nil {
		// Marshaling a well-formed message does not fail; a failure
		// would be a bug, reported rather than panicking.
		klog.ErrorS(err, "Encoding an operation for the backends")
		return dst
	}
	dst = protowire.AppendTag(dst, 1, protowire.BytesType)
	return protowire.AppendBytes(dst, b)
}

// batcher puts framed operations into Batch messages of at most
// sharedBatchBytes (an operation larger than that alone in its batch):
// copied (add) or referenced (addRef: bytes that never change, as the
// services' whole encodings, shared by every snapshot holding them).
type batcher struct {
	batches []message
	cur     [][]byte
	curLen  int
	owned   bool // the last piece of cur is the batcher's own, to append to
	size    int
}

func (b *batcher) room(n int) {
	if b.curLen > 0 && b.curLen+n > sharedBatchBytes {
		b.flush()
	}
}

func (b *batcher) add(framed []byte) {
	b.room(len(framed))
	if b.owned {
		b.cur[len(b.cur)-1] = append(b.cur[len(b.cur)-1], framed...)
	} else {
		b.cur = append(b.cur, append([]byte(nil), framed...))
		b.owned = true
	}
	b.curLen += len(framed)
}

// addRef adds a run of framed operations by reference, split between
// batches at operation boundaries when it does not fit.
func (b *batcher) addRef(ops []byte) {
	for len(ops) > 0 {
		n := len(ops)
		if b.curLen+n > sharedBatchBytes {
			// As many whole operations as fit (at least one).
			n = 0
			for n < len(ops) {
				_, _, m := protowire.ConsumeField(ops[n:])
				if m < 0 {
					return // our own encoding: cannot happen
				}
				if n > 0 && b.curLen+n+m > sharedBatchBytes {
					break
				}
				n += m
			}
			if b.curLen > 0 && b.curLen+n > sharedBatchBytes {
				b.flush()
				continue
			}
		}
		b.cur = append(b.cur, ops[:n:n])
		b.curLen += n
		b.owned = false
		ops = ops[n:]
	}
}

func (b *batcher) flush() {
	if b.curLen > 0 {
		b.batches = append(b.batches, messageOf(b.cur))
		b.size += b.curLen
	}
	b.cur, b.curLen, b.owned = nil, 0, false
}

func (b *batcher) done() ([]message, int) {
	b.flush()
	return b.batches, b.size
}

// encodeWhole returns a service's whole encoding: set_service then
// set_endpoint for each endpoint. A service too large for a message is
// left out (serviceOps logs it): nil.
func encodeWhole(key model.ServiceKey, se *model.ServiceEndpoints) []byte {
	var out []byte
	serviceOps(key, nil, se, func(op *kpngv1.Op) { out = frame(out, op) })
	return out
}

// clusterHash is the hash of the cluster facts in the state hash.
func clusterHash(c *model.Cluster) stateHash {
	return hashOf(frame([]byte("cluster"), &kpngv1.Op{Op: &kpngv1.Op_Sync{Sync: &kpngv1.Sync{Cluster: kpngv1.FromCluster(c)}}}))
}

// syncOp is the sync ending a round or a snapshot.
// (hash nil: the sync names no state).
func syncOp(cluster *kpngv1.Cluster, triggers []*kpngv1.Triggers, hash []byte) *kpngv1.Op {
	return &kpngv1.Op{Op: &kpngv1.Op_Sync{Sync: &kpngv1.Sync{Cluster: cluster, Triggers: triggers, StateHash: hash}}}
}

// encodeRound encodes the round being published, called by Sync with the
// write lock held before h.published changes: keys are the services
// changed (their new state in h.staged), cluster the facts when they
// changed in this round. It updates the services' encodings and the state
// hash, and appends the round to the log.
func (h *Hub) encodeRound(keys []model.ServiceKey, clusterChanged bool) {
	slices.SortFunc(keys, model.ServiceKey.Compare)
	var b batcher
	for _, key := range keys {
		prev, cur := h.published[key], h.staged[key]
		var w wholeService
		if cur != nil {
			w.ops = encodeWhole(key, cur)
			w.hash = hashOf([]byte(key.String()+"\x00"), w.ops)
		}
		if old, ok := h.whole[key]; prev == nil || !ok || len(old.ops) == 0 {
			// A new service's operations are its whole encoding; so are
			// those of a service left out until now (too large for a
			// message: its clients were told it is gone).
			b.addRef(w.ops)
		} else {
			serviceOps(key, prev, cur, func(op *kpngv1.Op) { b.add(frame(nil, op)) })
		}
		if old, ok := h.whole[key]; ok {
			h.hash.xor(old.hash)
			delete(h.whole, key)
		}
		if cur != nil {
			h.whole[key] = w
			h.hash.xor(w.hash)
		}
	}
	var cluster *kpngv1.Cluster
	if clusterChanged {
		h.hash.xor(h.clusterHash)
		h.clusterHash = clusterHash(h.stagedCluster)
		h.hash.xor(h.clusterHash)
		cluster = kpngv1.FromCluster(h.stagedCluster)
	}
	var triggers []*kpngv1.Triggers
	kept := 0 // bounded as a per-node stream's (maxSubscriberTriggers)
	for key, times := range h.stagedTriggers {
		times = times[:min(len(times), maxSubscriberTriggers-kept)]
		if len(times) == 0 {
			continue
		}
		kept += len(times)
		triggers = append(triggers, kpngv1.FromTriggers(key, times))
	}
	slices.SortFunc(triggers, func(a, b *kpngv1.Triggers) int {
		return a.GetService().Model().Compare(b.GetService().Model())
	})
	b.add(frame(nil, syncOp(cluster, triggers, h.hash[:])))
	h.gen++
	r := &round{gen: h.gen}
	r.batches, r.size = b.done()
	h.log = append(h.log, r)
	h.logBytes += r.size + roundOverhead
	drop := 0
	for h.logBytes > h.logLimit && drop < len(h.log)-1 {
		h.logBytes -= h.log[drop].size + roundOverhead
		h.log[drop] = nil
		drop++
	}
	h.log = h.log[drop:]
}

// snapshotLocked returns a snapshot of the published state as it is now,
// building it when the last one is older. (An older one followed by the
// rounds since would end in the same state, but its client would deliver
// the older state first: a client that held a newer one, from another
// controller, would see services go and come back.) Building one puts
// the services' encodings together and copies the batches that changed
// since the last one (milliseconds at 10,000 services); every stream
// starting before the next round shares it. The caller holds h.mu for
// reading.
func (h *Hub) snapshotLocked() *snapshot {
	h.snapMu.Lock()
	defer h.snapMu.Unlock()
	if s := h.snap; s != nil && s.gen == h.gen {
		return s
	}
	keys := make([]model.ServiceKey, 0, len(h.whole))
	for key := range h.whole {
		keys = append(keys, key)
	}
	slices.SortFunc(keys, model.ServiceKey.Compare)
	// A batch ends where one of the last snapshot's did (when it is not
	// too small to end there), or when full, so that the batches a change
	// did not touch hold the same services as before and share their
	// copies. The first snapshot's batches are filled to three quarters:
	// a batch whose services grow spills into the next, which has the
	// room to end where it did.
	prev := h.snap
	index := prev.index()
	limit := sharedBatchBytes
	if prev == nil {
		limit = sharedBatchBytes * 3 / 4
	}
	var b batcher
	for _, key := range keys {
		ops := h.whole[key].ops
		if len(ops) > 0 && b.curLen > 0 {
			_, start := index[&ops[0]]
			if (start && b.curLen >= sharedBatchBytes/4) || b.curLen+len(ops) > limit {
				b.flush()
			}
		}
		b.addRef(ops)
	}
	var cluster *kpngv1.Cluster
	if h.cluster != nil {
		cluster = kpngv1.FromCluster(h.cluster)
	}
	s := &snapshot{gen: h.gen}
	s.refs, _ = b.done()
	s.batches = make([]message, len(s.refs), len(s.refs)+1)
	for i, m := range s.refs {
		s.batches[i] = prev.copyOf(m, index)
	}
	// The sync in a batch of its own: a client finds the end of its
	// first state in the last batch's first operation.
	s.batches = append(s.batches, batchOf(syncOp(cluster, nil, h.hash[:])))
	h.pruneDeflated(s)
	h.snap = s
	h.snapshots.Add(1)
	return s
}

// nodeFacts returns the facts of node a node-independent stream sends,
// nil when the hub has no node views (its state is to be taken as is).
// The caller holds h.mu.
func (h *Hub) nodeFacts(node string) *kpngv1.NodeFacts {
	if !h.nodeViews {
		return nil
	}
	return &kpngv1.NodeFacts{Name: node, Zone: h.zones[node]}
}

// batchOf encodes ops as one Batch message of a stream's own.
func batchOf(ops ...*kpngv1.Op) message {
	var out []byte
	for _, op := range ops {
		out = frame(out, op)
	}
	return messageOf([][]byte{out})
}

// maxSendBytes bounds the log's rounds one call of nextShared hands a
// stream: a stream holding them while it sends (slowly) keeps them alive
// after the log dropped them; it comes back for the rest.
const maxSendBytes = 4 << 20

// nextShared returns the Batch messages a node-independent stream sends
// next to bring its backend to the latest published state, and moves its
// position there: its first state (or, when its client already holds the
// state, a sync saying so), the node facts when they changed, and the
// rounds it has not sent. Only the stream's sender calls it: its own
// goroutine, or the one sender serving it while it is pooled (pool.go).
func (h *Hub) nextShared(s *subscription) []message {
	if s.deflate && s.wantsAll() {
		h.prepareDeflated()
	}
	h.mu.RLock()
	defer h.mu.RUnlock()
	if !h.synced {
		return nil
	}
	s.mu.Lock()
	whole, nodeDirty, have := s.all, s.nodeDirty, s.have
	s.all, s.nodeDirty, s.have = false, false, nil
	s.mu.Unlock()

	var facts *kpngv1.NodeFacts // only when sent: not with every change
	if whole || nodeDirty {
		facts = h.nodeFacts(s.node)
	}
	var out []message
	switch {
	case whole && facts != nil && len(have) == len(h.hash) && stateHash(have) == h.hash:
		// The client holds this state (from another controller, or from
		// this one before a reconnection): no need to send it again.
		out = append(out, batchOf(&kpngv1.Op{Op: &kpngv1.Op_SetNode{SetNode: facts}}, syncOp(nil, nil, h.hash[:])))
		s.cursor = h.gen
		h.resumed.Add(1)
	case whole:
		out = h.appendSnapshot(out, s, facts)
	case nodeDirty && facts != nil:
		out = append(out, batchOf(&kpngv1.Op{Op: &kpngv1.Op_SetNode{SetNode: facts}}, syncOp(nil, nil, nil)))
	}
	if s.cursor < h.gen {
		if len(h.log) == 0 || h.log[0].gen > s.cursor+1 {
			// The rounds it missed are gone: it starts over.
			h.caughtUp.Add(1)
			out = h.appendSnapshot(out, s, h.nodeFacts(s.node))
		}
		i, _ := slices.BinarySearchFunc(h.log, s.cursor+1, func(r *round, gen uint64) int { return cmp.Compare(r.gen, gen) })
		taken := 0
		for _, r := range h.log[i:] {
			if taken > 0 && taken+r.size > maxSendBytes {
				s.signal() // the rest on the next call
				break
			}
			out = append(out, r.batches...)
			taken += r.size
			s.cursor = r.gen
		}
	}
	return out
}

// appendSnapshot appends a first state: the stream's own Reset with the
// node facts, then the shared snapshot; the stream's position moves to
// the snapshot's.
func (h *Hub) appendSnapshot(out []message, s *subscription, facts *kpngv1.NodeFacts) []message {
	snap := h.snapshotLocked()
	out = append(out, batchOf(&kpngv1.Op{Op: &kpngv1.Op_Reset_{Reset_: &kpngv1.Reset{Node: facts}}}))
	if s.deflate {
		out = append(out, h.deflated(snap)...)
	} else {
		out = append(out, snap.batches...)
	}
	s.cursor = snap.gen
	return out
}

// pruneDeflated drops the compressed copies of the batches snap does not
// share with the last snapshot, so that they do not outlive it when no
// stream taking deflated operations sends snap. The caller holds snapMu.
func (h *Hub) pruneDeflated(snap *snapshot) {
	if len(h.deflatedCopies) == 0 {
		return
	}
	kept := make(map[batchKey][]byte, len(h.deflatedCopies))
	for _, b := range snap.batches {
		if key, _, ok := keyOf(b); ok {
			if d, ok := h.deflatedCopies[key]; ok {
				kept[key] = d
			}
		}
	}
	h.deflatedCopies = kept
}

// prepareDeflated compresses the batches of the state's snapshot that
// have no compressed copy yet, without holding h.mu while it does (a
// whole snapshot of 10,000 services takes some 20 ms, which a Sync would
// otherwise wait for, and every stream behind it): a stream about to send
// a first state calls it first, so that under h.mu the snapshot it sends
// has its copies (those of a round published meanwhile are the few its
// services changed). A stream that fell behind the log is sent a
// snapshot compressed under h.mu.
func (h *Hub) prepareDeflated() {
	h.mu.RLock()
	if !h.synced {
		h.mu.RUnlock()
		return
	}
	snap := h.snapshotLocked()
	h.mu.RUnlock()
	h.deflated(snap)
}

// deflated returns snap's batches as the streams that take deflated
// operations are sent them: each batch of services compressed into a
// Batch.deflated_ops field, several fields a message (sharedBatchBytes
// of them, at most deflatedPlainBytes once inflated), then the sync as it
// is. A batch that compression would not make smaller goes as it is, in
// a message of its own. The batches are compressed once, for every such
// stream, when the first of them needs them; a batch the last snapshot
// had too keeps its compressed copy (h.deflatedCopies). It takes snapMu,
// not h.mu: snap does not change.
func (h *Hub) deflated(snap *snapshot) []message {
	h.snapMu.Lock()
	defer h.snapMu.Unlock()
	if snap.deflated != nil {
		return snap.deflated
	}
	last := len(snap.batches) - 1 // the sync's
	kept := make(map[batchKey][]byte, last)
	var out []message
	var pieces [][]byte
	size, plain := 0, 0
	flush := func() {
		if len(pieces) > 0 {
			out = append(out, messageOf(pieces))
		}
		pieces, size, plain = nil, 0, 0
	}
	for _, b := range snap.batches[:last] {
		key, data, ok := keyOf(b)
		if !ok {
			flush()
			out = append(out, b)
			continue
		}
		d, ok := h.deflatedCopies[key]
		if !ok {
			d = kpngv1.DeflatedOpsField(data)
			h.deflatedBatches.Add(1)
		}
		kept[key] = d
		if len(d) >= len(data) {
			flush()
			out = append(out, b)
			continue
		}
		if size+len(d) > sharedBatchBytes || plain+len(data) > deflatedPlainBytes {
			flush()
		}
		pieces = append(pieces, d)
		size += len(d)
		plain += len(data)
	}
	flush()
	out = append(out, snap.batches[last])
	h.deflatedCopies = kept
	snap.deflated = out
	return out
}

// batchKey identifies a snapshot's batch by its memory: a snapshot's
// batch of services is a copy of their encodings or a reference to one
// service's, neither of which changes (a service's encoding is replaced,
// not changed), and the cache holding the key keeps that memory from
// being reused.
type batchKey struct {
	first *byte
	n     int
}

// keyOf returns the key of a snapshot's batch and its bytes; false for
// one that is not a single piece of bytes (a snapshot's batches are).
func keyOf(b message) (batchKey, []byte, bool) {
	if len(b) != 1 {
		return batchKey{}, nil, false
	}
	data := b[0].ReadOnlyData()
	if len(data) == 0 {
		return batchKey{}, nil, false
	}
	return batchKey{&data[0], len(data)}, data, true
}

// deflatedPlainBytes bounds what a message of deflated operations
// inflates to, well within what a client takes (kpngv1.MaxBatchSize).
const deflatedPlainBytes = 4 << 20
