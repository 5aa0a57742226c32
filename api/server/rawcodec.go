package server

import (
	"errors"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
)

// rawBatch is a Batch message already encoded (the concatenation of its
// pieces), sent as it is: the bytes of the node-independent stream,
// shared by every stream sending them.
type rawBatch mem.BufferSlice

// rawCodec is gRPC's proto codec, but for rawBatch, which it hands to the
// transport as it is, neither copied nor rebuilt (its buffers' Ref and
// Free do nothing: the bytes belong to the hub, which never changes them,
// and gRPC only reads the slice).
type rawCodec struct{}

func (rawCodec) proto() encoding.CodecV2 { return encoding.GetCodecV2("proto") }

// Marshal implements encoding.CodecV2.
func (c rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if b, ok := v.(rawBatch); ok {
		return mem.BufferSlice(b), nil
	}
	p := c.proto()
	if p == nil {
		return nil, errors.New("the proto codec is not registered")
	}
	return p.Marshal(v)
}

// Unmarshal implements encoding.CodecV2.
func (c rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	p := c.proto()
	if p == nil {
		return errors.New("the proto codec is not registered")
	}
	return p.Unmarshal(data, v)
}

// Name implements encoding.CodecV2: it replaces the proto codec.
func (rawCodec) Name() string { return "proto" }

// codecOption is the server option that lets streams send rawBatch.
func codecOption() grpc.ServerOption { return grpc.ForceServerCodecV2(rawCodec{}) }
