//go:build linux

package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"hash/crc32"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"sigs.k8s.io/kpng/api/kpngv1"
)

// The field numbers of api/kpngv1/kpng.proto the backends read.
const (
	batchOps      = 1 // Batch.ops
	batchDeflated = 2 // Batch.deflated_ops

	opReset       = 1 // Op.reset
	opSetService  = 2 // Op.set_service
	opSetEndpoint = 4 // Op.set_endpoint
	opSync        = 6 // Op.sync

	serviceNamespace = 1 // Service.namespace and ServiceKey.namespace
	serviceName      = 2 // Service.name and ServiceKey.name

	setEndpointService  = 1 // SetEndpoint.service
	setEndpointKey      = 2 // SetEndpoint.key
	setEndpointEndpoint = 3 // SetEndpoint.endpoint

	endpointLocal    = 2 // Endpoint.local
	endpointReady    = 3 // Endpoint.ready
	endpointNodeName = 6 // Endpoint.node_name
)

// rawCodec hands a stream's messages to the backend as bytes: a backend
// reads only the few fields it checks (protowire) instead of decoding
// whole batches, so that thousands of them fit beside the controller on
// one machine. It marshals the WatchRequest with proto.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("rawCodec: cannot marshal %T", v)
	}
	return proto.Marshal(m)
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	b, ok := v.(*backend)
	if !ok {
		return fmt.Errorf("rawCodec: cannot unmarshal into %T", v)
	}
	return b.scan(data)
}

// change is one EndpointSlice change of the run: endpoint key of service
// name made not ready, which every backend must receive as a set_endpoint
// of that endpoint, not ready.
type change struct {
	service, key string
	// arrived counts the backends that hold the change; done is closed
	// when all do; at[i] is when backend i got it (UnixNano, 0: not yet).
	arrived atomic.Int32
	done    chan struct{}
	at      []int64
}

// backend is one lightweight node backend: a Watch stream as node name,
// which counts the bytes it receives, checks its first state (the
// services and endpoints of the run's namespace, and its Local endpoints)
// and records when each change of the run reaches it (when the Sync that
// ends its round arrives).
type backend struct {
	id        int
	name      string
	namespace string
	changes   map[string]int // "service/key" → index in all
	all       []*change
	total     int // backends in the run
	// independent: the stream is node-independent (the backend computes
	// its Local endpoints from their node names, as client/remote does).
	independent bool
	// light: the backend does not read its first state's fields, only
	// which operations it holds. Every backend hashes its first state's
	// messages (stateHash): on a node-independent stream every backend
	// is sent the same bytes, and the run checks that they are those of
	// backends that read them all.
	light bool
	// raw: the backend speaks HTTP/2 itself (h2.go), not through
	// grpc-go's client.
	raw bool
	// tls, for a raw backend, is its TLS client configuration (its node's
	// certificate), nil for plain TCP or a unix socket; nodeCert is set
	// once its handshake is done.
	tls       *tls.Config
	nodeCert  bool
	stateHash uint32 // CRC-32C (hashState)
	// deflate: the backend asks for deflated operations
	// (WatchRequest.accept_deflated), as client/remote does.
	deflate bool
	// inflateGain is how many more bytes the deflated batches of the
	// first state inflated to than they took (a backend reading every
	// field).
	inflateGain int

	// peers: the backend follows the controller's replicas too, on a
	// Peers stream of its connection, as client/remote does when it
	// reaches the controllers by a name (deploy/'s node backends);
	// replicas is the run's change of them every backend must receive.
	peers    bool
	replicas *atomic.Pointer[replicaChange]
	// Read by the run after the backends are gone: lists received,
	// the last change received, the Peers stream's error.
	peerLists int
	peersSeen *replicaChange
	peersErr  error

	bytes atomic.Int64

	// Read by the run after firstState is closed.
	synced     bool
	firstAt    time.Time
	services   int // set_service ops of namespace in the first state
	endpoints  int // set_endpoint ops of namespace in the first state
	local      int // of which local
	localSent  int // endpoints sent local on a node-independent stream
	unexpected int // set_endpoint ops after the first state that are no change of the run, or not as it made them
	// replicasServed counts the set_service ops of the controller's own
	// Service (--peers), which is not one of the Services it serves.
	replicasServed int
	firstState     chan struct{}
	pending        []int // changes seen in the round not yet ended
	err            error
	receivedAfter  atomic.Int64 // changes received after the first state
}

// watch opens the stream on conn and reads it until ctx ends or it
// fails; the error, if any, is in b.err.
func (b *backend) watch(ctx context.Context, conn *grpc.ClientConn) {
	b.err = b.read(ctx, conn)
	if !b.synced {
		close(b.firstState)
	}
}

func (b *backend) read(ctx context.Context, conn *grpc.ClientConn) error {
	stream, err := conn.NewStream(ctx, &kpngv1.Controller_ServiceDesc.Streams[0], kpngv1.Controller_Watch_FullMethodName,
		grpc.ForceCodec(rawCodec{}), grpc.MaxCallRecvMsgSize(kpngv1.MaxBatchSize))
	if err != nil {
		return fmt.Errorf("watch as %s: %w", b.name, err)
	}
	if err := stream.SendMsg(&kpngv1.WatchRequest{NodeName: b.name, NodeIndependent: b.independent, AcceptDeflated: b.deflate}); err != nil {
		return fmt.Errorf("watch as %s: send the request: %w", b.name, err)
	}
	if err := stream.CloseSend(); err != nil {
		return fmt.Errorf("watch as %s: %w", b.name, err)
	}
	for {
		if err := stream.RecvMsg(b); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("watch as %s: %w", b.name, err)
		}
	}
}

// replicaChange is a change of the controller's replicas (its Service's
// EndpointSlice): every backend following them must receive the list
// want (their addresses, in order, comma-separated).
type replicaChange struct {
	want string
	// arrived counts the backends that hold it; done is closed when all
	// do; last is when the last got it (UnixNano).
	arrived atomic.Int32
	total   int32
	done    chan struct{}
	last    atomic.Int64
}

// newReplicaChange returns the change to list want, for total backends.
func newReplicaChange(want string, total int) *replicaChange {
	return &replicaChange{want: want, total: int32(total), done: make(chan struct{})}
}

// peersReceived takes a list of the controller's replicas from the Peers
// stream: when it is the run's change, the backend holds it.
func (b *backend) peersReceived(ips []string) {
	b.peerLists++
	ch := b.replicas.Load()
	if ch == nil || ch == b.peersSeen || strings.Join(ips, ",") != ch.want {
		return
	}
	b.peersSeen = ch
	if ch.arrived.Add(1) == ch.total {
		ch.last.Store(time.Now().UnixNano())
		close(ch.done)
	}
}

// followPeers reads the Peers stream of a backend on grpc-go's client
// until ctx ends or it fails; the error, if any, is in b.peersErr.
func (b *backend) followPeers(ctx context.Context, conn *grpc.ClientConn) {
	stream, err := kpngv1.NewControllerClient(conn).Peers(ctx, &kpngv1.PeersRequest{})
	for err == nil {
		var list *kpngv1.PeerAddresses
		if list, err = stream.Recv(); err == nil {
			b.peersReceived(list.GetIps())
		}
	}
	if ctx.Err() == nil {
		b.peersErr = fmt.Errorf("the replicas as %s: %w", b.name, err)
	}
}

// smallBatch is the size under which a light backend reads a first
// state's batch operation by operation for its sync; the larger ones are
// the snapshot's services (128 KiB each), whose sync comes alone after
// them.
const smallBatch = 16 << 10

// errMalformed is a batch the backend cannot read.
var errMalformed = errors.New("malformed batch")

// castagnoli is CRC-32C's table: the backends' stateHash, at twice
// maphash's speed on this machine (26 against 12 GB/s), for the 36 GB of
// 5,000 first states.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// hashState adds p to the state's hash.
func (b *backend) hashState(p []byte) { b.stateHash = crc32.Update(b.stateHash, castagnoli, p) }

// streamed reads part of a first state's large batch as it comes (a raw
// light backend's; h2.go): its bytes counted and hashed, as scan does
// with a whole batch. Such a batch holds services only: the controller
// sends the snapshot's sync alone in a small batch, and the Reset is
// small too.
func (b *backend) streamed(p []byte) {
	b.bytes.Add(int64(len(p)))
	b.hashState(p)
}

// scan reads one Batch. Until the first state ends, each message but
// the Reset's (its node's own) goes into stateHash whole.
func (b *backend) scan(data []byte) error {
	b.bytes.Add(int64(len(data)))
	if !b.synced {
		kind, err := firstOpKind(data)
		if err != nil {
			return err
		}
		if kind != opReset {
			b.hashState(data)
		}
		if b.light {
			// Only its kind, for the sync that ends it: the controller
			// sends a snapshot's sync in a batch of its own (Hub's
			// snapshotLocked), so the operations of a large batch are
			// not read one by one; a small one may hold a sync after
			// other operations (a small state, a resumed one).
			sync := kind == opSync
			if !sync && len(data) <= smallBatch {
				sync, err = hasSync(data)
			}
			if sync {
				b.sync()
			}
			return err
		}
		n, err := eachOp(data, b.op)
		if n > 0 {
			b.inflateGain += n - len(data)
		}
		return err
	}
	_, err := eachOp(data, b.op)
	return err
}

// firstOpKind is the kind (the field number) of a Batch's first
// operation, 0 for a Batch without one, deflatedKind for a Batch whose
// operations are all deflated (which it does not inflate).
func firstOpKind(data []byte) (protowire.Number, error) {
	var kind protowire.Number
	deflated, err := eachPlainOp(data, func(op []byte) error {
		if len(op) == 0 {
			return errStop // an empty Op: no kind
		}
		k, _, n := protowire.ConsumeTag(op)
		if n < 0 {
			return errMalformed
		}
		kind = k
		return errStop
	})
	if errors.Is(err, errStop) {
		return kind, nil
	}
	if err == nil && len(deflated) > 0 {
		kind = deflatedKind
	}
	return kind, err
}

// deflatedKind is firstOpKind's kind of a Batch of deflated operations
// only: no Op field has its number.
const deflatedKind protowire.Number = 1 << 20

// errStop ends an eachPlainOp early.
var errStop = errors.New("stop")

// eachOp calls f with each operation of a Batch, those of its
// deflated_ops (inflated) last, and returns the bytes they inflated to.
func eachOp(data []byte, f func(op []byte) error) (inflated int, err error) {
	deflated, err := eachPlainOp(data, f)
	for _, z := range deflated {
		if err != nil {
			break
		}
		var raw []byte
		if raw, err = kpngv1.InflateField(z, kpngv1.MaxBatchSize-inflated); err != nil {
			err = fmt.Errorf("deflated_ops: %w", err)
			break
		}
		inflated += len(raw)
		var more [][]byte
		if more, err = eachPlainOp(raw, f); err == nil && more != nil {
			err = errMalformed
		}
	}
	return inflated, err
}

// eachPlainOp calls f with each operation of a Batch's ops and returns
// its deflated_ops fields, not inflated.
func eachPlainOp(data []byte, f func(op []byte) error) (deflated [][]byte, err error) {
	for len(data) > 0 {
		num, typ, n := protowire.ConsumeTag(data)
		if n < 0 {
			return nil, errMalformed
		}
		data = data[n:]
		if typ != protowire.BytesType || (num != batchOps && num != batchDeflated) {
			if n = protowire.ConsumeFieldValue(num, typ, data); n < 0 {
				return nil, errMalformed
			}
			data = data[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(data)
		if n < 0 {
			return nil, errMalformed
		}
		data = data[n:]
		if num == batchDeflated {
			deflated = append(deflated, v)
			continue
		}
		if err := f(v); err != nil {
			return nil, err
		}
	}
	return deflated, nil
}

// hasSync tells whether a Batch holds a sync operation, reading only each
// operation's first byte: a Batch is a run of Batch.ops fields (their tag
// byte, a varint length, the Op), and an Op's first byte is the tag of
// its kind (all below 16: one byte). A light backend reads its first
// state's 100,000 operations this way: eachOp's general decoding cost the
// shared cores seconds with 5,000 backends.
func hasSync(data []byte) (bool, error) {
	const opsTag = byte(batchOps<<3 | protowire.BytesType)
	const syncTag = byte(opSync<<3 | protowire.BytesType)
	for len(data) > 0 {
		if data[0] != opsTag {
			// Another field (deflated_ops, not inflated: a controller
			// deflates batches of services, never a sync): skipped, as
			// eachPlainOp does.
			num, typ, n := protowire.ConsumeTag(data)
			if n < 0 {
				return false, errMalformed
			}
			m := protowire.ConsumeFieldValue(num, typ, data[n:])
			if m < 0 {
				return false, errMalformed
			}
			data = data[n+m:]
			continue
		}
		l, n := uint64(0), 1
		for shift := 0; ; shift += 7 {
			if n >= len(data) || shift > 28 {
				return false, errMalformed
			}
			c := data[n]
			n++
			l |= uint64(c&0x7f) << shift
			if c < 0x80 {
				break
			}
		}
		if l > uint64(len(data)-n) {
			return false, errMalformed
		}
		if l > 0 && data[n] == syncTag {
			return true, nil
		}
		data = data[n+int(l):]
	}
	return false, nil
}

// fields calls f with each field of message m.
func fields(m []byte, f func(num protowire.Number, typ protowire.Type, v []byte, x uint64)) error {
	for len(m) > 0 {
		num, typ, n := protowire.ConsumeTag(m)
		if n < 0 {
			return errMalformed
		}
		m = m[n:]
		switch typ {
		case protowire.BytesType:
			v, n := protowire.ConsumeBytes(m)
			if n < 0 {
				return errMalformed
			}
			f(num, typ, v, 0)
			m = m[n:]
		case protowire.VarintType:
			x, n := protowire.ConsumeVarint(m)
			if n < 0 {
				return errMalformed
			}
			f(num, typ, nil, x)
			m = m[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, m)
			if n < 0 {
				return errMalformed
			}
			m = m[n:]
		}
	}
	return nil
}

// serviceKey reads the namespace and name of a Service or a ServiceKey
// (the same field numbers).
func serviceKey(m []byte) (ns, name string, err error) {
	err = fields(m, func(num protowire.Number, _ protowire.Type, v []byte, _ uint64) {
		switch num {
		case serviceNamespace:
			ns = string(v)
		case serviceName:
			name = string(v)
		}
	})
	return ns, name, err
}

// op reads one Op.
func (b *backend) op(op []byte) error {
	var err error
	perr := fields(op, func(num protowire.Number, _ protowire.Type, v []byte, _ uint64) {
		switch num {
		case opSetService:
			var ns, name string
			ns, name, err = serviceKey(v)
			if ns == b.namespace && !b.synced {
				b.services++
			}
			if ns == peersNamespace && name == peersService {
				b.replicasServed++
			}
		case opSetEndpoint:
			err = b.setEndpoint(v)
		case opSync:
			b.sync()
		}
	})
	if perr != nil {
		return perr
	}
	return err
}

// setEndpoint reads one SetEndpoint.
func (b *backend) setEndpoint(v []byte) error {
	var ns, name, key, node string
	var local, ready bool
	err := fields(v, func(num protowire.Number, _ protowire.Type, v []byte, _ uint64) {
		switch num {
		case setEndpointService:
			ns, name, _ = serviceKey(v)
		case setEndpointKey:
			key = string(v)
		case setEndpointEndpoint:
			_ = fields(v, func(num protowire.Number, _ protowire.Type, v []byte, x uint64) {
				switch num {
				case endpointLocal:
					local = x != 0
				case endpointReady:
					ready = x != 0
				case endpointNodeName:
					node = string(v)
				}
			})
		}
	})
	if err != nil || ns != b.namespace {
		return err
	}
	if !b.synced {
		b.endpoints++
		if b.independent {
			if local {
				b.localSent++
			}
			local = node == b.name
		}
		if local {
			b.local++
		}
		return nil
	}
	i, ok := b.changes[name+"/"+key]
	if !ok || ready {
		b.unexpected++
		return nil
	}
	b.pending = append(b.pending, i)
	return nil
}

// sync ends a round: the first state, or changes.
func (b *backend) sync() {
	now := time.Now()
	if !b.synced {
		b.synced = true
		b.firstAt = now
		close(b.firstState)
		return
	}
	for _, i := range b.pending {
		c := b.all[i]
		if c.at[b.id] != 0 {
			continue
		}
		c.at[b.id] = now.UnixNano()
		b.receivedAfter.Add(1)
		if int(c.arrived.Add(1)) == b.total {
			close(c.done)
		}
	}
	b.pending = b.pending[:0]
}
