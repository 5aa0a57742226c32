package kpngv1

import (
	"bytes"
	"compress/flate"
	"errors"
	"fmt"
	"io"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Deflated operations (Batch.deflated_ops): a controller compresses the
// large batches of a first state once and sends the same bytes to every
// backend that asked for them (WatchRequest.accept_deflated).

// DeflateLevel is the compression level of deflated operations:
// compress/flate's fastest, which compresses a first state of 10,000
// services × 10 endpoints about 7 times.
const DeflateLevel = flate.BestSpeed

// DeflatedOpsField returns one Batch.deflated_ops field, framed: ops
// (the encoding of a Batch holding them, its ops fields) compressed. A
// Batch's encoding is its fields one after the other, so that a message
// of several such fields, each compressed once, is a Batch.
func DeflatedOpsField(ops []byte) []byte {
	var z bytes.Buffer
	w := deflaters.Get().(*flate.Writer)
	defer deflaters.Put(w)
	w.Reset(&z)
	// Writes to a bytes.Buffer do not fail.
	_, _ = w.Write(ops)
	_ = w.Close()
	w.Reset(io.Discard) // not to keep z
	out := protowire.AppendTag(make([]byte, 0, z.Len()+8), batchDeflatedOps, protowire.BytesType)
	return protowire.AppendBytes(out, z.Bytes())
}

// batchDeflatedOps is Batch.deflated_ops's field number.
const batchDeflatedOps = 2

// deflaters pools the writers DeflatedOpsField uses (some 600 KiB each).
var deflaters = sync.Pool{New: func() any {
	w, _ := flate.NewWriter(io.Discard, DeflateLevel) // fails only for a level out of range
	return w
}}

// inflaters pools the readers Inflate uses.
var inflaters = sync.Pool{New: func() any { return flate.NewReader(bytes.NewReader(nil)) }}

// ErrInflateLimit is InflateField's error for a field that inflates to
// more than its limit.
var ErrInflateLimit = errors.New("inflates past its limit")

// InflateField inflates one deflated_ops field (a raw DEFLATE stream) to
// at most limit bytes: the encoding of a Batch holding the field's
// operations. A field that inflates to more fails with ErrInflateLimit.
func InflateField(z []byte, limit int) ([]byte, error) {
	r := inflaters.Get().(io.ReadCloser)
	defer func() {
		_ = r.(flate.Resetter).Reset(bytes.NewReader(nil), nil) // not to keep z
		inflaters.Put(r)
	}()
	if err := r.(flate.Resetter).Reset(bytes.NewReader(z), nil); err != nil {
		return nil, err
	}
	var raw bytes.Buffer
	raw.Grow(min(8*len(z), limit+1))
	if _, err := raw.ReadFrom(io.LimitReader(r, int64(limit)+1)); err != nil {
		return nil, err
	}
	if raw.Len() > limit {
		return nil, ErrInflateLimit
	}
	return raw.Bytes(), nil
}

// Inflate moves the operations of b.DeflatedOps, if any, to the end of
// b.Ops, in order. It fails, leaving b as it was, on a field that is not
// DEFLATE, on fields that inflate to more than MaxBatchSize bytes in all,
// or that are not a Batch's encoding, or hold deflated_ops themselves.
func (b *Batch) Inflate() error {
	if len(b.GetDeflatedOps()) == 0 {
		return nil
	}
	var more Batch
	left := MaxBatchSize
	for i, z := range b.DeflatedOps {
		raw, err := InflateField(z, left)
		if errors.Is(err, ErrInflateLimit) {
			return fmt.Errorf("batch: deflated_ops inflate to more than %d bytes", MaxBatchSize)
		}
		if err != nil {
			return fmt.Errorf("batch: deflated_ops[%d]: %w", i, err)
		}
		left -= len(raw)
		// Unmarshal merges: the operations of each field are appended.
		if err := (proto.UnmarshalOptions{Merge: true}).Unmarshal(raw, &more); err != nil {
			return fmt.Errorf("batch: deflated_ops[%d]: %w", i, err)
		}
		if len(more.DeflatedOps) > 0 {
			return fmt.Errorf("batch: deflated_ops[%d]: they hold deflated_ops themselves", i)
		}
	}
	b.Ops = append(b.Ops, more.Ops...)
	b.DeflatedOps = nil
	return nil
}
