//go:build linux

package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"

	"sigs.k8s.io/kpng/api/kpngv1"
)

// The raw backends: a Watch stream (and with --peers a Peers stream beside
// it) spoken directly in HTTP/2 and gRPC's message framing on its own
// connection, the way any gRPC client does on the wire, but reading the
// controller's bytes in place. On one machine
// the backends share its two cores with the controller; through grpc-go's
// client each byte was copied three times and each change cost the
// backends as much CPU as the controller (kpng-scale's own figures), so
// that the run measured its own clients as much as the controller. A
// backend on a node of a real cluster pays that on its own node.

// rawReadBuffer is a raw backend's read buffer: a frame's header and any
// frame but DATA fit (16 KiB frames, the HTTP/2 default, which the
// backends do not raise).
const rawReadBuffer = 32 << 10

// rawMessages pools the buffers in which a message received in several
// DATA frames is put together: only the backends receiving one at a time
// hold one.
var rawMessages = sync.Pool{New: func() any { b := make([]byte, 0, 256<<10); return &b }}

// watchRaw opens the stream (and the Peers stream, when the backend
// follows the replicas) on its own connection to the controller at addr
// on network ("unix": a socket's path; "tcp": host:port, plain) and reads
// it until ctx ends or it fails; the error, if any, is in b.err.
func (b *backend) watchRaw(ctx context.Context, network, addr string) {
	b.err = b.readRaw(ctx, network, addr)
	if !b.synced {
		close(b.firstState)
	}
}

func (b *backend) readRaw(ctx context.Context, network, addr string) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return fmt.Errorf("watch as %s: %w", b.name, err)
	}
	if b.tls != nil {
		tc := tls.Client(conn, b.tls)
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = conn.Close()
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("watch as %s: TLS: %w", b.name, err)
		}
		if p := tc.ConnectionState().NegotiatedProtocol; p != "h2" {
			_ = conn.Close()
			return fmt.Errorf("watch as %s: TLS: the controller chose protocol %q, want h2", b.name, p)
		}
		conn, b.nodeCert = tc, true
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	c := &rawConn{b: b, conn: conn, w: bufio.NewWriterSize(conn, 4096), buf: make([]byte, rawReadBuffer)}
	c.fr = http2.NewFramer(c.w, nil)
	if err := c.begin(); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("watch as %s: %w", b.name, err)
	}
	err = c.read()
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("watch as %s: %w", b.name, err)
}

// rawConn is one raw backend's connection.
type rawConn struct {
	b    *backend
	conn net.Conn
	w    *bufio.Writer
	fr   *http2.Framer // writes only

	buf        []byte
	start, end int // the bytes of buf not yet read

	// The DATA frame being read: its stream, its bytes not yet in buf.
	dataStream uint32
	dataLeft   int
	// unacked counts the DATA bytes received since the last window
	// update, peersUnacked those of them on the Peers stream.
	unacked, peersUnacked int
	// peersMsgs holds the Peers stream's bytes not yet read as messages.
	peersMsgs []byte

	// The gRPC message being read: its 5-byte prefix, then its bytes.
	prefix  [5]byte
	prefixN int
	msgLen  int
	msg     *[]byte // from rawMessages, nil between messages
	// streamLeft is what is left to read of a message read as it comes
	// (backend.streamed), not put together.
	streamLeft int

	// headers is the header block being received (HEADERS, CONTINUATION)
	// on stream headersStream; all are decoded, in order, since they
	// share the connection's HPACK table.
	headers       []byte
	headersStream uint32
	headersEnd    bool // its HEADERS frame ended the stream (trailers)
	dec           *hpack.Decoder
	status        string // grpc-status and grpc-message of the trailers
	message       string
}

// streamID is the Watch's HTTP/2 stream, peersStreamID the Peers
// stream's (a backend that follows the controller's replicas).
const (
	streamID      = 1
	peersStreamID = 3
)

// begin writes the connection preface, the settings (the flow-control
// windows of client/remote), then each call's headers and request: the
// Watch, and the Peers when the backend follows the replicas.
func (c *rawConn) begin() error {
	if _, err := c.w.WriteString(http2.ClientPreface); err != nil {
		return err
	}
	if err := c.fr.WriteSettings(http2.Setting{ID: http2.SettingEnablePush}, http2.Setting{ID: http2.SettingInitialWindowSize, Val: kpngv1.WindowSize}); err != nil {
		return err
	}
	if err := c.fr.WriteWindowUpdate(0, kpngv1.WindowSize-65535); err != nil {
		return err
	}
	var hb []byte
	enc := hpack.NewEncoder(&appendWriter{&hb})
	if err := c.call(enc, &hb, streamID, kpngv1.Controller_Watch_FullMethodName,
		&kpngv1.WatchRequest{NodeName: c.b.name, NodeIndependent: c.b.independent, AcceptDeflated: c.b.deflate}); err != nil {
		return err
	}
	if c.b.peers {
		if err := c.call(enc, &hb, peersStreamID, kpngv1.Controller_Peers_FullMethodName, &kpngv1.PeersRequest{}); err != nil {
			return err
		}
	}
	return c.w.Flush()
}

// call writes the headers of a call of method on stream id, encoded by
// enc (the connection's HPACK encoder, which writes to hb), and its one
// request, which ends the client's side of the stream.
func (c *rawConn) call(enc *hpack.Encoder, hb *[]byte, id uint32, method string, req proto.Message) error {
	body, err := proto.Marshal(req)
	if err != nil {
		return err
	}
	*hb = (*hb)[:0]
	for _, f := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":path", method}, {":authority", "localhost"},
		{"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		if err := enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}); err != nil {
			return err
		}
	}
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: *hb, EndHeaders: true}); err != nil {
		return err
	}
	msg := make([]byte, 5, 5+len(body))
	binary.BigEndian.PutUint32(msg[1:], uint32(len(body)))
	return c.fr.WriteData(id, true, append(msg, body...))
}

// appendWriter appends what is written to a slice.
type appendWriter struct{ b *[]byte }

func (w *appendWriter) Write(p []byte) (int, error) {
	*w.b = append(*w.b, p...)
	return len(p), nil
}

// fill reads more bytes into buf, moving the unread ones to its start
// when they are fewer than need from its end.
func (c *rawConn) fill(need int) error {
	if c.start == c.end {
		c.start, c.end = 0, 0
	} else if c.end == len(c.buf) || len(c.buf)-c.start < need {
		c.end = copy(c.buf, c.buf[c.start:c.end])
		c.start = 0
	}
	n, err := c.conn.Read(c.buf[c.end:])
	c.end += n
	if n > 0 {
		return nil
	}
	if err == nil {
		err = io.ErrNoProgress
	}
	return err
}

// read reads frames until a stream ends or the connection fails.
func (c *rawConn) read() error {
	for {
		if c.dataLeft > 0 {
			if c.start == c.end {
				if err := c.fill(1); err != nil {
					return err
				}
			}
			n := min(c.dataLeft, c.end-c.start)
			data := c.data
			if c.dataStream == peersStreamID {
				data = c.peersData
			}
			if err := data(c.buf[c.start : c.start+n]); err != nil {
				return err
			}
			c.start += n
			c.dataLeft -= n
			continue
		}
		for c.end-c.start < 9 {
			if err := c.fill(9); err != nil {
				return err
			}
		}
		h := c.buf[c.start : c.start+9]
		length := int(h[0])<<16 | int(h[1])<<8 | int(h[2])
		typ, flags := http2.FrameType(h[3]), http2.Flags(h[4])
		id := binary.BigEndian.Uint32(h[5:]) & (1<<31 - 1)
		if typ == http2.FrameData {
			if flags.Has(http2.FlagDataPadded) {
				// HTTP/2 allows padding; grpc-go sends none, and this
				// reader, which reads DATA in place, does not take it.
				return errors.New("a padded DATA frame")
			}
			c.start += 9
			c.dataStream, c.dataLeft = id, length
			if err := c.received(id, length); err != nil {
				return err
			}
			continue
		}
		if length > len(c.buf)-9 {
			return fmt.Errorf("a %v frame of %d bytes", typ, length)
		}
		for c.end-c.start < 9+length {
			if err := c.fill(9 + length); err != nil {
				return err
			}
		}
		payload := c.buf[c.start+9 : c.start+9+length]
		c.start += 9 + length
		done, err := c.control(typ, flags, id, payload)
		if err != nil || done {
			return err
		}
	}
}

// received counts a DATA frame's bytes on stream id and gives them back
// to the controller's flow-control windows (the connection's and each
// stream's) once a quarter of a window is unacknowledged.
func (c *rawConn) received(id uint32, n int) error {
	c.unacked += n
	if id == peersStreamID {
		c.peersUnacked += n
	}
	if c.unacked < kpngv1.WindowSize/4 {
		return nil
	}
	for _, u := range []struct {
		id uint32
		n  int
	}{{0, c.unacked}, {streamID, c.unacked - c.peersUnacked}, {peersStreamID, c.peersUnacked}} {
		if u.n == 0 {
			continue
		}
		if err := c.fr.WriteWindowUpdate(u.id, uint32(u.n)); err != nil {
			return err
		}
	}
	c.unacked, c.peersUnacked = 0, 0
	return c.w.Flush()
}

// peersData reads the bytes of a DATA frame of the Peers stream: gRPC
// messages, each a PeerAddresses (a few hundred bytes at most), put
// together and handed to the backend.
func (c *rawConn) peersData(p []byte) error {
	c.peersMsgs = append(c.peersMsgs, p...)
	for len(c.peersMsgs) >= 5 {
		if c.peersMsgs[0] != 0 {
			return errors.New("the Peers stream: a compressed message")
		}
		n := int(binary.BigEndian.Uint32(c.peersMsgs[1:]))
		if n > kpngv1.MaxBatchSize {
			return fmt.Errorf("the Peers stream: a message of %d bytes", n)
		}
		if len(c.peersMsgs) < 5+n {
			return nil
		}
		var list kpngv1.PeerAddresses
		if err := proto.Unmarshal(c.peersMsgs[5:5+n], &list); err != nil {
			return fmt.Errorf("the Peers stream: %w", err)
		}
		c.b.peersReceived(list.GetIps())
		c.peersMsgs = c.peersMsgs[:copy(c.peersMsgs, c.peersMsgs[5+n:])]
	}
	return nil
}

// lastStream is the last stream the backend opened.
func (c *rawConn) lastStream() uint32 {
	if c.b.peers {
		return peersStreamID
	}
	return streamID
}

// streamName names stream id in errors.
func streamName(id uint32) string {
	if id == peersStreamID {
		return "Peers stream"
	}
	return "stream"
}

// control handles a frame other than DATA; done: the stream ended.
func (c *rawConn) control(typ http2.FrameType, flags http2.Flags, id uint32, payload []byte) (done bool, err error) {
	switch typ {
	case http2.FrameSettings:
		if flags.Has(http2.FlagSettingsAck) {
			return false, nil
		}
		if err := c.fr.WriteSettingsAck(); err != nil {
			return false, err
		}
		return false, c.w.Flush()
	case http2.FramePing:
		if flags.Has(http2.FlagPingAck) || len(payload) != 8 {
			return false, nil
		}
		if err := c.fr.WritePing(true, [8]byte(payload)); err != nil {
			return false, err
		}
		return false, c.w.Flush()
	case http2.FrameGoAway:
		if len(payload) < 8 {
			return false, errors.New("the controller closed the connection (GOAWAY)")
		}
		last, code := binary.BigEndian.Uint32(payload)&(1<<31-1), http2.ErrCode(binary.BigEndian.Uint32(payload[4:]))
		if code == http2.ErrCodeNo && last >= c.lastStream() {
			return false, nil // graceful: the stream goes on until it ends
		}
		return false, fmt.Errorf("the controller closed the connection (GOAWAY %v): %q", code, payload[8:])
	case http2.FrameRSTStream:
		if (id == streamID || id == c.lastStream()) && len(payload) == 4 {
			return false, fmt.Errorf("the controller reset the %s: %v", streamName(id), http2.ErrCode(binary.BigEndian.Uint32(payload)))
		}
	case http2.FrameHeaders, http2.FrameContinuation:
		if typ == http2.FrameHeaders {
			c.headers, c.headersStream, c.headersEnd = c.headers[:0], id, flags.Has(http2.FlagHeadersEndStream)
			if flags.Has(http2.FlagHeadersPriority) || flags.Has(http2.FlagHeadersPadded) {
				return false, errors.New("a HEADERS frame with priority or padding") // grpc-go sends none
			}
		}
		c.headers = append(c.headers, payload...)
		if !flags.Has(http2.FlagHeadersEndHeaders) {
			return false, nil
		}
		if c.dec == nil {
			c.dec = hpack.NewDecoder(4096, func(f hpack.HeaderField) {
				switch f.Name {
				case "grpc-status":
					c.status = f.Value
				case "grpc-message":
					c.message = f.Value
				}
			})
		}
		c.status, c.message = "", ""
		if _, err := c.dec.Write(c.headers); err != nil {
			return false, fmt.Errorf("the controller's headers: %w", err)
		}
		if err := c.dec.Close(); err != nil {
			return false, fmt.Errorf("the controller's headers: %w", err)
		}
		if c.headersEnd {
			return true, fmt.Errorf("the %s ended: grpc-status %s: %s", streamName(c.headersStream), c.status, c.message)
		}
	}
	return false, nil
}

// data reads the bytes of a DATA frame: gRPC messages, each a 5-byte
// prefix (not compressed, length) and the Batch, handed to the backend;
// one within p is read in place, one in several frames put together.
func (c *rawConn) data(p []byte) error {
	for len(p) > 0 {
		if c.streamLeft > 0 {
			n := min(len(p), c.streamLeft)
			c.b.streamed(p[:n])
			p = p[n:]
			if c.streamLeft -= n; c.streamLeft == 0 {
				c.prefixN = 0
			}
			continue
		}
		if c.prefixN < 5 {
			n := copy(c.prefix[c.prefixN:], p)
			c.prefixN += n
			p = p[n:]
			if c.prefixN < 5 {
				return nil
			}
			if c.prefix[0] != 0 {
				return errors.New("a compressed message")
			}
			c.msgLen = int(binary.BigEndian.Uint32(c.prefix[1:]))
			if c.msgLen > kpngv1.MaxBatchSize {
				return fmt.Errorf("a message of %d bytes", c.msgLen)
			}
			if c.b.light && !c.b.synced && c.msgLen > smallBatch {
				// A snapshot's batch of services: hashed as it comes.
				c.streamLeft = c.msgLen
				continue
			}
			if len(p) >= c.msgLen {
				// All of it here: read in place.
				m := p[:c.msgLen]
				p = p[c.msgLen:]
				c.prefixN = 0
				if err := c.b.scan(m); err != nil {
					return err
				}
				continue
			}
			c.msg = rawMessages.Get().(*[]byte)
			*c.msg = (*c.msg)[:0]
		}
		n := min(len(p), c.msgLen-len(*c.msg))
		*c.msg = append(*c.msg, p[:n]...)
		p = p[n:]
		if len(*c.msg) == c.msgLen {
			err := c.b.scan(*c.msg)
			rawMessages.Put(c.msg)
			c.msg, c.prefixN = nil, 0
			if err != nil {
				return err
			}
		}
	}
	return nil
}
