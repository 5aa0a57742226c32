package nft

import "slices"

// slots hands out block slots, lowest free first, so that the blocks of a
// family fill their endpoint maps densely (each map holds blocksPerMap
// consecutive slots).
type slots struct {
	next uint32   // slots from next on were never handed out
	free []uint32 // released slots, sorted descending: the lowest is last
}

// get returns the lowest free slot.
func (s *slots) get() uint32 {
	if n := len(s.free); n > 0 {
		v := s.free[n-1]
		s.free = s.free[:n-1]
		return v
	}
	s.next++
	return s.next - 1
}

// put releases slot v.
func (s *slots) put(v uint32) {
	i, found := slices.BinarySearchFunc(s.free, v, func(a, b uint32) int {
		// descending order
		switch {
		case a > b:
			return -1
		case a < b:
			return 1
		}
		return 0
	})
	if !found {
		s.free = slices.Insert(s.free, i, v)
	}
}
