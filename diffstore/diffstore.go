// Package diffstore provides Store, a keyed store that remembers the value of
// each key as of the previous round and reports what changed since then.
//
// It is meant for adapters and backends that receive the full (or a partial)
// state over and over again and need to emit only the minimal set of updates:
// the caller Sets the values of a round, then calls Done (full round) or
// DonePartial (partial round) and gets back the keys that were created,
// updated or deleted, each list sorted by key.
//
// A typical full round:
//
//	for _, svc := range services {
//		store.Set(svc.Name, svc)
//	}
//	changes := store.Done()
//	for _, it := range changes.Deleted {
//		// remove it.Key
//	}
//	// ... apply changes.Created and changes.Updated
package diffstore

import (
	"cmp"
	"slices"
)

// shrinkMin is the smallest peak size of the live-keys map for which the
// store bothers to rebuild it after many deletions (Go maps never shrink).
const shrinkMin = 1024

// smallPending is the number of pending insertions in a round up to which
// the pending map is cleared and reused; above it the map is dropped so that
// a large round does not leave a large map behind.
const smallPending = 8

// Store remembers the value of each key as of the last round, and reports what changed.
//
// A round is the sequence of Set and Delete calls since the previous Done or
// DonePartial. Done ends a full round (every key that still exists must have
// been Set), DonePartial ends a partial round (only the keys Set or Deleted
// are considered).
//
// Rules applied when a round ends:
//   - a key Set to a value equal to its value of the previous round is not reported;
//   - a key Set several times in a round takes its last value;
//   - a key Set then Deleted in the same round is reported Deleted if it existed
//     before the round, and not reported at all otherwise;
//   - a key Deleted then Set again in the same round is reported Updated if its
//     value differs from the previous round's value, and not reported otherwise.
//
// When a key is Set to a value equal to its stored value, nothing is reported
// but the stored value is replaced by the new one, so that Get and Each return
// the most recently Set value (a later Item.Prev may therefore be that equal
// value rather than the one originally stored).
//
// Set, Delete and Get cost O(1) amortized, Done costs O(live keys) plus the
// sorting of the changes, and DonePartial costs O(keys touched in the round)
// plus the sorting of the changes.
//
// Keys must not be floating-point NaN values (like Go maps, the store cannot
// find them again). A Store is not safe for concurrent use: callers must
// synchronize access themselves.
type Store[K cmp.Ordered, V any] struct {
	// live holds the keys as of the end of the previous round.
	live map[K]entry[V]
	// pending holds the changes of the current round that may need reporting:
	// keys whose Set value differs from the stored one, new keys, and keys
	// Deleted. Keys Set to their stored value are not in it.
	pending map[K]change[V]
	// inserted counts insertions into pending during the current round.
	inserted int
	// mark is the value of entry.mark for keys Set since the previous Done;
	// it flips at each Done.
	mark bool
	// peak is the largest len(live) since live was last allocated.
	peak int

	equal func(a, b V) bool // nil for hashed stores
	hash  func(V) uint64    // nil unless hashed
}

// entry is a live key's stored value.
type entry[V any] struct {
	value V
	hash  uint64 // hash of value (hashed stores only)
	// mark equals Store.mark when the key was Set (or created) since the
	// previous Done.
	mark bool
	// pending is true when the key also has an entry in Store.pending.
	pending bool
}

// change is a pending change of the current round.
type change[V any] struct {
	value   V
	hash    uint64 // hash of value (hashed stores only)
	deleted bool
}

// New returns a store comparing values with equal.
//
// equal must be an equivalence relation; it panics if equal is nil.
func New[K cmp.Ordered, V any](equal func(a, b V) bool) *Store[K, V] {
	if equal == nil {
		panic("diffstore.New: nil equal function")
	}
	return &Store[K, V]{live: map[K]entry[V]{}, equal: equal}
}

// NewComparable returns a store comparing values with ==.
func NewComparable[K cmp.Ordered, V comparable]() *Store[K, V] {
	return New[K](func(a, b V) bool { return a == b })
}

// NewHashed returns a store that compares values by a hash of them (keeps
// only the hash of the previous value plus the value itself for reporting).
//
// Two values with the same hash are considered equal, so hash should have a
// negligible collision probability (e.g. a 64-bit FNV or xxhash of a
// canonical encoding). It panics if hash is nil.
func NewHashed[K cmp.Ordered, V any](hash func(V) uint64) *Store[K, V] {
	if hash == nil {
		panic("diffstore.NewHashed: nil hash function")
	}
	return &Store[K, V]{live: map[K]entry[V]{}, hash: hash}
}

// Set sets k's value for this round.
func (s *Store[K, V]) Set(k K, v V) {
	var h uint64
	if s.hash != nil {
		h = s.hash(v)
	}

	e, ok := s.live[k]
	if ok {
		var same bool
		if s.hash != nil {
			same = e.hash == h
		} else {
			same = s.equal(e.value, v)
		}
		e.mark = s.mark
		if same {
			// Back to (or still at) the previous round's value: nothing to
			// report, forget any pending change.
			if e.pending {
				delete(s.pending, k)
				e.pending = false
			}
			e.value, e.hash = v, h
			s.live[k] = e
			return
		}
		e.pending = true
		s.live[k] = e
	}

	s.setPending(k, change[V]{value: v, hash: h})
}

// setPending records c as k's pending change.
func (s *Store[K, V]) setPending(k K, c change[V]) {
	if s.pending == nil {
		s.pending = make(map[K]change[V])
	}
	n := len(s.pending)
	s.pending[k] = c
	if len(s.pending) != n {
		s.inserted++
	}
}

// Delete deletes k this round (no-op if absent).
func (s *Store[K, V]) Delete(k K) {
	e, ok := s.live[k]
	if !ok {
		// Not live: at most a creation pending in this round, cancel it.
		if len(s.pending) != 0 {
			delete(s.pending, k)
		}
		return
	}
	if !e.pending {
		e.pending = true
		s.live[k] = e
	}
	s.setPending(k, change[V]{deleted: true})
}

// Get returns k's current value, as last Set (including within the current
// round), and whether k exists. A key Deleted in the current round does not
// exist; a key not yet Set in the current full round still has its previous
// value.
func (s *Store[K, V]) Get(k K) (V, bool) {
	if c, ok := s.pending[k]; ok {
		if c.deleted {
			var zero V
			return zero, false
		}
		return c.value, true
	}
	e, ok := s.live[k]
	return e.value, ok
}

// Len returns the number of live keys as of the last Done or DonePartial.
func (s *Store[K, V]) Len() int {
	return len(s.live)
}

// Done ends a FULL round: the caller has Set every current item since the
// previous Done; keys not Set since then are reported deleted and removed.
//
// "Since the previous Done" includes keys Set during partial rounds ended by
// DonePartial after that Done. Done costs O(live keys).
func (s *Store[K, V]) Done() Changes[K, V] {
	var ch Changes[K, V]

	for k, e := range s.live {
		if e.mark == s.mark || e.pending {
			continue // Set since the previous Done, or handled below
		}
		ch.Deleted = append(ch.Deleted, Item[K, V]{Key: k, Value: e.value, Prev: e.value})
		delete(s.live, k)
	}

	s.applyPending(&ch)

	// Every remaining key now carries s.mark; flipping it makes them all
	// "not Set yet" for the next full round.
	s.mark = !s.mark

	ch.sort()
	return ch
}

// DonePartial ends a PARTIAL round: only keys Set or Deleted since the
// previous Done/DonePartial are considered; others stay as they are.
//
// DonePartial costs O(keys touched in the round), not O(live keys).
func (s *Store[K, V]) DonePartial() Changes[K, V] {
	var ch Changes[K, V]
	s.applyPending(&ch)
	ch.sort()
	return ch
}

// applyPending moves the pending changes into live, records them in ch
// (unsorted), and resets pending.
func (s *Store[K, V]) applyPending(ch *Changes[K, V]) {
	for k, c := range s.pending {
		e, ok := s.live[k]
		switch {
		case c.deleted:
			// Only live keys get a pending deletion.
			ch.Deleted = append(ch.Deleted, Item[K, V]{Key: k, Value: e.value, Prev: e.value})
			delete(s.live, k)
		case ok:
			ch.Updated = append(ch.Updated, Item[K, V]{Key: k, Value: c.value, Prev: e.value})
			s.live[k] = entry[V]{value: c.value, hash: c.hash, mark: s.mark}
		default:
			ch.Created = append(ch.Created, Item[K, V]{Key: k, Value: c.value})
			s.live[k] = entry[V]{value: c.value, hash: c.hash, mark: s.mark}
		}
	}

	if s.inserted > smallPending {
		s.pending = nil // do not keep a large map around
	} else {
		clear(s.pending)
	}
	s.inserted = 0

	s.maybeShrink()
}

// maybeShrink reallocates live when it holds far fewer keys than it once did,
// to release the memory of the deleted ones. The copy costs O(live keys) but
// happens only after at least 3/4 of the peak were deleted, so it is O(1)
// amortized per deletion.
func (s *Store[K, V]) maybeShrink() {
	n := len(s.live)
	if n > s.peak {
		s.peak = n
		return
	}
	if s.peak < shrinkMin || n >= s.peak/4 {
		return
	}
	live := make(map[K]entry[V], n)
	for k, e := range s.live {
		live[k] = e
	}
	s.live = live
	s.peak = n
}

// Each calls f for every live key in key order, with the values as of the
// last Done or DonePartial (Set and Delete calls of the current round are not
// visible, except that a value replaced by an equal one is). f must not
// modify the store. Each costs O(n log n) and allocates O(n) for the sorting.
func (s *Store[K, V]) Each(f func(k K, v V)) {
	keys := make([]K, 0, len(s.live))
	for k := range s.live {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		f(k, s.live[k].value)
	}
}

// Item is one reported change of a key.
//
// Value is the key's new value (for Deleted, its last value). Prev is the
// value of the previous round, set for Updated and Deleted items (for
// Deleted, Value == Prev == the last value); it is the zero value for
// Created items.
type Item[K cmp.Ordered, V any] struct {
	Key   K
	Value V
	Prev  V
}

// Changes are the changes reported at the end of a round. Each list is
// sorted by key and is nil when empty; a key appears in at most one list.
type Changes[K cmp.Ordered, V any] struct {
	Created, Updated, Deleted []Item[K, V]
}

// Empty reports whether there are no changes.
func (c Changes[K, V]) Empty() bool {
	return c.Len() == 0
}

// Len returns the total number of changes.
func (c Changes[K, V]) Len() int {
	return len(c.Created) + len(c.Updated) + len(c.Deleted)
}

// sort sorts each list by key.
func (c *Changes[K, V]) sort() {
	byKey := func(a, b Item[K, V]) int { return cmp.Compare(a.Key, b.Key) }
	slices.SortFunc(c.Created, byKey)
	slices.SortFunc(c.Updated, byKey)
	slices.SortFunc(c.Deleted, byKey)
}
