package kpngv1

import (
	"bytes"
	"compress/flate"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// deflatedOf is the encoding of a Batch whose deflated_ops are raw
// compressed as they are.
func deflatedOf(t *testing.T, raw []byte) *Batch {
	t.Helper()
	var z bytes.Buffer
	w, _ := flate.NewWriter(&z, flate.BestSpeed)
	if _, err := w.Write(raw); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return &Batch{DeflatedOps: [][]byte{z.Bytes()}}
}

func TestInflate(t *testing.T) {
	ops := []*Op{
		{Op: &Op_SetService{SetService: &Service{Namespace: "ns", Name: "a"}}},
		{Op: &Op_SetEndpoint{SetEndpoint: &SetEndpoint{Service: &ServiceKey{Namespace: "ns", Name: "a"}, Key: "10.0.0.1"}}},
		{Op: &Op_Sync{Sync: &Sync{}}},
	}
	// As a controller sends it: one op as it is, the others deflated, in
	// two fields.
	var b Batch
	wire := append(protowire.AppendTag(nil, 1, protowire.BytesType), protowire.AppendBytes(nil, mustMarshal(t, ops[0]))...)
	wire = append(wire, DeflatedOpsField(mustMarshal(t, &Batch{Ops: ops[1:2]}))...)
	wire = append(wire, DeflatedOpsField(mustMarshal(t, &Batch{Ops: ops[2:]}))...)
	if err := proto.Unmarshal(wire, &b); err != nil {
		t.Fatal(err)
	}
	if len(b.DeflatedOps) != 2 || len(b.Ops) != 1 {
		t.Fatalf("decoded %d ops and %d deflated_ops fields, want 1 and 2", len(b.Ops), len(b.DeflatedOps))
	}
	if err := b.Inflate(); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(&b, &Batch{Ops: ops}) {
		t.Errorf("inflated: %v, want %v", &b, &Batch{Ops: ops})
	}
	if err := b.Inflate(); err != nil || len(b.Ops) != 3 {
		t.Errorf("a second Inflate: %v, %d ops; want nothing done", err, len(b.Ops))
	}

	nested, _ := proto.Marshal(&Batch{DeflatedOps: [][]byte{{1}}})
	half := deflatedOf(t, bytes.Repeat([]byte{0x0a, 0x00}, MaxBatchSize/4+1)).DeflatedOps[0] // empty ops
	for name, tc := range map[string]struct {
		b    *Batch
		want string
	}{
		"not DEFLATE":                   {&Batch{DeflatedOps: [][]byte{[]byte("not a deflate stream at all")}}, "deflated_ops"},
		"not a Batch":                   {deflatedOf(t, []byte{0xff, 0xff, 0xff}), "deflated_ops"},
		"deflated_ops in them":          {deflatedOf(t, nested), "hold deflated_ops themselves"},
		"more than MaxBatchSize":        {deflatedOf(t, make([]byte, MaxBatchSize+1)), "more than 16777216 bytes"},
		"more than MaxBatchSize in all": {&Batch{DeflatedOps: [][]byte{half, half}}, "more than 16777216 bytes"},
	} {
		t.Run(name, func(t *testing.T) {
			tc.b.Ops = ops[:1]
			err := tc.b.Inflate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one saying %q", err, tc.want)
			}
			if len(tc.b.Ops) != 1 || len(tc.b.DeflatedOps) == 0 {
				t.Errorf("%d ops and %d deflated_ops fields after a failed Inflate, want them as they were", len(tc.b.Ops), len(tc.b.DeflatedOps))
			}
		})
	}
}

func mustMarshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzInflate: any bytes arriving as deflated_ops give a clear error or
// operations that encode again, never a panic.
func FuzzInflate(f *testing.F) {
	f.Add([]byte("not deflate"))
	ops, _ := proto.Marshal(&Batch{Ops: []*Op{{Op: &Op_Sync{Sync: &Sync{StateHash: []byte{1, 2}}}}}})
	var b Batch
	if err := proto.Unmarshal(DeflatedOpsField(ops), &b); err != nil {
		f.Fatal(err)
	}
	f.Add(b.DeflatedOps[0])
	f.Fuzz(func(t *testing.T, data []byte) {
		b := &Batch{DeflatedOps: [][]byte{data, data}}
		if err := b.Inflate(); err != nil {
			if !strings.Contains(err.Error(), "deflated_ops") {
				t.Errorf("error %q does not name deflated_ops", err)
			}
			return
		}
		if _, err := proto.Marshal(b); err != nil {
			t.Errorf("inflated ops do not encode: %v", err)
		}
	})
}
