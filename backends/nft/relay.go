//go:build linux

package nft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// relay carries the messages of an nftables.Conn to a netlink socket it
// owns, and adds to the messages creating sets the user data that nft
// keeps in a set (typeof.go), which google/nftables (v0.3.0) has no field
// for. It is the Conn's TestDial, google/nftables' seam for the socket:
// the Conn marshals a transaction and reads its acknowledgements as with a
// socket of its own, through the relay.
//
// The socket is a netlink socket in the Conn's namespace (its NetNS), or,
// when the Conn has a TestDial of its own (the unprivileged tests), that
// one: the test then sees the messages as the kernel would. A relay is
// not safe for concurrent use; it lasts as long as its socket (Close).
type relay struct {
	sock *netlink.Conn
	// raw is the kernel socket (nil for a TestDial), pid its port ID:
	// send writes a batch to it in one buffer of its own.
	raw syscall.RawConn
	pid uint32
	// userData is the user data of the sets of the transaction being
	// written, by name: the NEWSET messages of those sets carry it
	// instead of what google/nftables wrote.
	userData map[string][]byte
	// elements are the payloads of the transaction's messages of set
	// elements, in the order of their placeholders (elements.go);
	// filled counts those given their place.
	elements []elementList
	filled   int
	// lists are, message by message, the payloads that send writes in
	// place of the messages' own (nil: none).
	lists []*elementList
	// sendErr is the error of the last send, which the next receive
	// returns (the Conn's test socket keeps a send's error for every
	// receive after it, and google/nftables receives once per message);
	// drained says it was returned: until the next send, receives find
	// nothing.
	sendErr error
	drained bool
	// quiet says that the last batch went to the kernel without asking
	// for an acknowledgement of each message (quietBatch): the kernel
	// answers only the messages it rejects, and had answered before the
	// send returned; answered says that those answers were read (each
	// of google/nftables' receives after that gets an acknowledgement
	// made here). buf is the buffer they are read into.
	quiet, answered bool
	buf             []byte
	// fault is the tests' seam for the socket's errors (nil in
	// production): see faultFunc.
	fault faultFunc
}

// relayOp is what the relay is about to do with its socket.
type relayOp int

const (
	// relaySend is the send of a transaction's batch.
	relaySend relayOp = iota
	// relayReceive is a receive of the kernel's answers.
	relayReceive
)

// faultFunc is the relay's seam for injecting socket errors (applier.fault
// hands it to the relays of an applier): it is called before each send
// and each receive, and an error it returns is taken as the socket's, the
// operation not done: a send fails with nothing sent (a busy kernel,
// EBUSY), a receive fails with the kernel's answers left unread (a
// receive buffer overrun, ENOBUFS, after the kernel applied the batch).
// Tests set it; nothing else does.
type faultFunc func(op relayOp) error

// newRelay makes conn send through a new relay, whose socket is opened in
// conn's namespace with the socket options given (or is conn's TestDial,
// without them), and returns it. conn must not be lasting (a lasting Conn
// has a socket of its own): the relay's socket is the one that lasts.
func newRelay(conn *nftables.Conn, opts ...nftables.SockOption) (*relay, error) {
	r := &relay{userData: map[string][]byte{}}
	if conn.TestDial != nil {
		r.sock = newDialConn(conn.TestDial)
	} else {
		sock, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: conn.NetNS})
		if err != nil {
			return nil, fmt.Errorf("netlink socket: %w", err)
		}
		for _, opt := range opts {
			if err := opt(sock); err != nil {
				sock.Close()
				return nil, err
			}
		}
		r.sock = sock
		if err := r.useRaw(); err != nil {
			sock.Close()
			return nil, err
		}
	}
	conn.TestDial = r.exchange
	return r, nil
}

// Close closes the relay's socket.
func (r *relay) Close() error { return r.sock.Close() }

// begin starts a transaction: the user data of its sets are given anew.
func (r *relay) begin() {
	clear(r.userData)
	r.elements, r.filled = nil, 0
	r.sendErr, r.drained = nil, false
}

// fill returns the payload that the message of set elements data is to
// carry: when data is a placeholder, the next one handed to the relay;
// nil for a message of google/nftables' own elements, sent as it is.
func (r *relay) fill(data []byte) (*elementList, error) {
	if !isPlaceholder(data) {
		return nil, nil
	}
	if r.filled == len(r.elements) {
		return nil, errors.New("a message of set elements without its elements")
	}
	l := &r.elements[r.filled]
	if !l.ofPlaceholder(data) {
		return nil, fmt.Errorf("the elements of message %d of set elements are of set %s, not the placeholder's", r.filled, l.set.Name)
	}
	r.filled++
	return l, nil
}

// exchange is the Conn's socket (its TestDial): a request is a batch to
// send, nil asks for what the socket received.
func (r *relay) exchange(req []netlink.Message) ([]netlink.Message, error) {
	if req == nil {
		switch {
		case r.sendErr != nil:
			err := r.sendErr
			r.sendErr, r.drained = nil, true
			return nil, err
		case r.drained:
			return nil, io.EOF
		}
		if r.quiet && r.answered {
			return madeAck, nil
		}
		if r.fault != nil {
			if err := r.fault(relayReceive); err != nil {
				r.answered = r.quiet
				return nil, err
			}
		}
		if r.quiet {
			r.answered = true
			if err := r.readAnswers(); err != nil {
				return nil, err
			}
			return madeAck, nil
		}
		return r.sock.Receive()
	}
	r.drained, r.answered = false, false
	r.quiet = r.raw != nil && quietBatch(req)
	r.lists = nil
	for i := range req {
		// The socket writes its own port ID.
		req[i].Header.PID = 0
		switch req[i].Header.Type {
		case newSetMessage:
			data, err := withUserData(req[i].Data, r.userData)
			if err != nil {
				r.sendErr = err
				return nil, nil
			}
			req[i].Data = data
		case elementMessage, delElementMessage:
			l, err := r.fill(req[i].Data)
			if err != nil {
				r.sendErr = err
				return nil, nil
			}
			if l == nil {
				continue
			}
			if r.lists == nil {
				r.lists = make([]*elementList, len(req))
			}
			r.lists[i] = l
		default:
			continue
		}
		// The Conn sized the message for its own data: the socket
		// sizes it again.
		req[i].Header.Length = 0
	}
	if n := len(r.elements) - r.filled; n > 0 {
		r.sendErr = fmt.Errorf("%d messages of set elements without their place in the batch", n)
		return nil, nil
	}
	if r.fault != nil {
		if err := r.fault(relaySend); err != nil {
			r.sendErr = fmt.Errorf("send %d netlink messages: %w", len(req), err)
			return nil, nil
		}
	}
	if err := r.send(req); err != nil {
		r.sendErr = fmt.Errorf("send %d netlink messages: %w", len(req), err)
	}
	// The payloads' functions hold the transaction's data: let it go.
	r.elements, r.lists = nil, nil
	return nil, nil
}

// madeAck is the acknowledgement exchange gives google/nftables for a
// message of a quiet batch that the kernel did not reject: a netlink
// error message of code 0, as the kernel's (the code, then the header of
// the message acknowledged, here zero).
var madeAck = []netlink.Message{{Header: netlink.Header{Type: netlink.Error}, Data: make([]byte, 4+unix.NLMSG_HDRLEN)}}

// quietBatch takes back the acknowledgement google/nftables asks for each
// message of the nftables batch req (it sets NLM_F_ACK on every one), and
// reports whether req is such a batch (a read of the table, say, is sent
// as it is). The kernel processes a batch, commit included, within the
// sendmsg that carries it (nfnetlink_rcv_batch runs in the sender's
// context) and then answers only the messages it rejected, or the batch
// when the commit fails: when the send returns, its answers, if any, are
// queued on the socket (readAnswers). An acknowledgement per message cost
// the kernel a message each and the process a receive each, with a
// buffer of its own: about a fifth of the memory a full sync allocated
// (BenchmarkColdStart).
func quietBatch(req []netlink.Message) bool {
	if len(req) < 2 || req[0].Header.Type != netlink.HeaderType(unix.NFNL_MSG_BATCH_BEGIN) ||
		req[len(req)-1].Header.Type != netlink.HeaderType(unix.NFNL_MSG_BATCH_END) {
		return false
	}
	for i := range req {
		req[i].Header.Flags &^= netlink.Acknowledge
	}
	return true
}

// answerBuffer is the size of the buffer answers are read into: an answer
// rejecting a message carries that message (a message of set elements is
// at most about 64 KiB).
const answerBuffer = 128 << 10

// readAnswers reads what the kernel queued on the socket for the last
// batch, without waiting (it answered within the send), and returns the
// first rejection found (the Conn that google/nftables receives from
// makes it a netlink.OpError, as for a socket of its own), or nil when
// the kernel rejected nothing.
func (r *relay) readAnswers() error {
	if r.buf == nil {
		r.buf = make([]byte, answerBuffer)
	}
	var first error
	for {
		var n int
		var recvErr error
		err := r.raw.Read(func(fd uintptr) bool {
			n, _, _, _, recvErr = unix.Recvmsg(int(fd), r.buf, nil, unix.MSG_DONTWAIT)
			return true
		})
		if err == nil {
			err = recvErr
		}
		switch {
		case errors.Is(err, unix.EAGAIN):
			return first
		case err != nil:
			return os.NewSyscallError("recvmsg", err)
		case n == 0:
			return first
		}
		if err := firstRejection(r.buf[:min(n, len(r.buf))]); err != nil && first == nil {
			first = err
		}
	}
}

// firstRejection returns the error of the first netlink error message of
// code other than 0 in the datagram b, or nil.
func firstRejection(b []byte) error {
	for len(b) >= unix.NLMSG_HDRLEN {
		l := int(binary.NativeEndian.Uint32(b))
		typ := binary.NativeEndian.Uint16(b[4:])
		if l < unix.NLMSG_HDRLEN || l > len(b) {
			l = len(b)
		}
		if typ == unix.NLMSG_ERROR && l >= unix.NLMSG_HDRLEN+4 {
			if code := int32(binary.NativeEndian.Uint32(b[unix.NLMSG_HDRLEN:])); code != 0 {
				return unix.Errno(-code)
			}
		}
		b = b[min(nlaAlign(l), len(b)):]
	}
	return nil
}

// useRaw makes the relay write its batches to its kernel socket itself
// (send), with the socket's port ID.
func (r *relay) useRaw() error {
	raw, err := r.sock.SyscallConn()
	if err != nil {
		return fmt.Errorf("netlink socket: %w", err)
	}
	var sa unix.Sockaddr
	var nameErr error
	if err := raw.Control(func(fd uintptr) { sa, nameErr = unix.Getsockname(int(fd)) }); err != nil {
		return fmt.Errorf("netlink socket: %w", err)
	}
	nl, ok := sa.(*unix.SockaddrNetlink)
	if nameErr != nil || !ok {
		return fmt.Errorf("netlink socket: its port ID: %v (%T)", nameErr, sa)
	}
	r.raw, r.pid = raw, nl.Pid
	return nil
}

// send sends msgs in one datagram, as (*netlink.Conn).SendMessages does
// (a message without a length or a port ID gets its own and the
// socket's), but marshaled straight into one buffer of the batch's size,
// the payloads of r.lists written there: the library marshals each
// message apart and appends it to a buffer that grows as it goes, which
// at 50,000 services (a batch of 100 MB) held the batch about three
// times over for a moment, at the process's peak. A message without a
// sequence number (google/nftables numbers them) goes the library's way.
func (r *relay) send(msgs []netlink.Message) error {
	if r.raw == nil {
		return r.sendMaterialized(msgs)
	}
	size := 0
	for i := range msgs {
		h := &msgs[i].Header
		if h.Sequence == 0 {
			return r.sendMaterialized(msgs)
		}
		n := len(msgs[i].Data)
		if l := r.list(i); l != nil {
			n = nfgenmsgLen + l.size
		}
		if h.Length == 0 {
			h.Length = uint32(nlaAlign(unix.NLMSG_HDRLEN + n))
		}
		if h.PID == 0 {
			h.PID = r.pid
		}
		if int(h.Length) != nlaAlign(int(h.Length)) || int(h.Length) < unix.NLMSG_HDRLEN+n {
			return fmt.Errorf("message %d: length %d for %d bytes of data", i, h.Length, n)
		}
		size += int(h.Length)
	}
	buf := make([]byte, size)
	off := 0
	for i, m := range msgs {
		binary.NativeEndian.PutUint32(buf[off:], m.Header.Length)
		binary.NativeEndian.PutUint16(buf[off+4:], uint16(m.Header.Type))
		binary.NativeEndian.PutUint16(buf[off+6:], uint16(m.Header.Flags))
		binary.NativeEndian.PutUint32(buf[off+8:], m.Header.Sequence)
		binary.NativeEndian.PutUint32(buf[off+12:], m.Header.PID)
		data := buf[off+unix.NLMSG_HDRLEN:]
		if l := r.list(i); l != nil {
			copy(data, m.Data[:nfgenmsgLen])
			if err := l.write(data[nfgenmsgLen : nfgenmsgLen+l.size]); err != nil {
				return err
			}
		} else {
			copy(data, m.Data)
		}
		off += int(m.Header.Length)
	}
	var sendErr error
	err := r.raw.Write(func(fd uintptr) bool {
		sendErr = unix.Sendmsg(int(fd), buf, nil, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}, 0)
		return !errors.Is(sendErr, unix.EAGAIN)
	})
	if err == nil {
		err = sendErr
	}
	if err != nil {
		return fmt.Errorf("sendmsg: %w", err)
	}
	return nil
}

// list returns the payload send writes for message i, or nil.
func (r *relay) list(i int) *elementList {
	if r.lists == nil {
		return nil
	}
	return r.lists[i]
}

// sendMaterialized sends msgs through the library (SendMessages), the
// payloads of r.lists written into the messages first.
func (r *relay) sendMaterialized(msgs []netlink.Message) error {
	for i := range msgs {
		l := r.list(i)
		if l == nil {
			continue
		}
		data := make([]byte, nfgenmsgLen+l.size)
		copy(data, msgs[i].Data[:nfgenmsgLen])
		if err := l.write(data[nfgenmsgLen:]); err != nil {
			return err
		}
		msgs[i].Data = data
		msgs[i].Header.Length = 0
	}
	_, err := r.sock.SendMessages(msgs)
	return err
}

// newSetMessage is the type of the netlink message creating a set.
const newSetMessage = netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWSET)

// withUserData returns data, the payload of a NEWSET message (an nfgenmsg
// header, then attributes), with its NFTA_SET_USERDATA attribute replaced
// by the user data of the set in userData (added if it had none), or data
// itself for a set that userData does not hold.
func withUserData(data []byte, userData map[string][]byte) ([]byte, error) {
	const header = 4 // struct nfgenmsg
	if len(data) < header {
		return nil, errors.New("NEWSET message without a header")
	}
	var name string
	var attrs [][]byte // the attributes but the user data, with padding
	for off := header; off < len(data); {
		if len(data)-off < unix.NLA_HDRLEN {
			return nil, fmt.Errorf("NEWSET message: truncated attribute at byte %d", off)
		}
		l := int(binary.NativeEndian.Uint16(data[off:]))
		typ := binary.NativeEndian.Uint16(data[off+2:]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
		if l < unix.NLA_HDRLEN || off+l > len(data) {
			return nil, fmt.Errorf("NEWSET message: attribute of %d bytes at byte %d of %d", l, off, len(data))
		}
		next := min(off+nlaAlign(l), len(data))
		switch typ {
		case unix.NFTA_SET_NAME:
			name = string(data[off+unix.NLA_HDRLEN : off+l])
			if n := len(name); n > 0 && name[n-1] == 0 {
				name = name[:n-1]
			}
			attrs = append(attrs, data[off:next])
		case unix.NFTA_SET_USERDATA:
		default:
			attrs = append(attrs, data[off:next])
		}
		off = next
	}
	ud, ok := userData[name]
	if !ok {
		return data, nil
	}
	out := make([]byte, header, len(data)+unix.NLA_HDRLEN+nlaAlign(len(ud)))
	copy(out, data[:header])
	for _, a := range attrs {
		out = append(out, a...)
		// The last attribute of a message may lack its padding.
		out = append(out, make([]byte, nlaAlign(len(a))-len(a))...)
	}
	out = binary.NativeEndian.AppendUint16(out, uint16(unix.NLA_HDRLEN+len(ud)))
	out = binary.NativeEndian.AppendUint16(out, unix.NFTA_SET_USERDATA)
	out = append(out, ud...)
	return append(out, make([]byte, nlaAlign(len(ud))-len(ud))...), nil
}

// nlaAlign rounds a netlink attribute's length up to 4 bytes (netlink
// messages are aligned the same way: NLMSG_ALIGNTO is 4 too).
func nlaAlign(n int) int { return (n + unix.NLA_ALIGNTO - 1) &^ (unix.NLA_ALIGNTO - 1) }
