package diffstore

import (
	"fmt"
	"testing"
)

const benchItems = 100_000

// benchStore returns a store holding benchItems keys (after a first Done),
// with the keys and their current values.
func benchStore(b *testing.B) (*Store[string, int], []string, []int) {
	b.Helper()
	keys := make([]string, benchItems)
	values := make([]int, benchItems)
	s := NewComparable[string, int]()
	for i := range keys {
		keys[i] = fmt.Sprintf("namespace-%03d/service-%06d", i%500, i)
		values[i] = i
		s.Set(keys[i], values[i])
	}
	if ch := s.Done(); len(ch.Created) != benchItems {
		b.Fatalf("setup: created %d, want %d", len(ch.Created), benchItems)
	}
	return s, keys, values
}

// BenchmarkDoneFull100k_OneChange measures a full round re-setting all
// 100,000 items, one of them with a new value.
func BenchmarkDoneFull100k_OneChange(b *testing.B) {
	s, keys, values := benchStore(b)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		j := i % benchItems
		values[j] += benchItems
		for k, key := range keys {
			s.Set(key, values[k])
		}
		ch := s.Done()
		if len(ch.Updated) != 1 || ch.Len() != 1 || ch.Updated[0].Key != keys[j] {
			b.Fatalf("iteration %d: got %d changes (%d updated), want exactly 1 update of %q", i, ch.Len(), len(ch.Updated), keys[j])
		}
	}
	if s.Len() != benchItems {
		b.Fatalf("Len() = %d, want %d", s.Len(), benchItems)
	}
}

// BenchmarkDonePartial100k_OneChange measures a partial round changing one
// item of a 100,000 items store.
func BenchmarkDonePartial100k_OneChange(b *testing.B) {
	s, keys, values := benchStore(b)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		j := i % benchItems
		values[j] += benchItems
		s.Set(keys[j], values[j])
		ch := s.DonePartial()
		if len(ch.Updated) != 1 || ch.Len() != 1 || ch.Updated[0].Key != keys[j] {
			b.Fatalf("iteration %d: got %d changes (%d updated), want exactly 1 update of %q", i, ch.Len(), len(ch.Updated), keys[j])
		}
	}
	if s.Len() != benchItems {
		b.Fatalf("Len() = %d, want %d", s.Len(), benchItems)
	}
}

// BenchmarkSet measures one Set call on a 100,000 items store: with the
// stored value (the common case of a full round), with a new value, and of a
// new key.
func BenchmarkSet(b *testing.B) {
	b.Run("Unchanged", func(b *testing.B) {
		s, keys, values := benchStore(b)
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			j := i % benchItems
			s.Set(keys[j], values[j])
		}
	})
	b.Run("Changed", func(b *testing.B) {
		s, keys, values := benchStore(b)
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			j := i % benchItems
			s.Set(keys[j], values[j]+1+i)
		}
	})
	b.Run("NewKey", func(b *testing.B) {
		s := NewComparable[int, int]()
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			s.Set(i, i)
		}
	})
}
