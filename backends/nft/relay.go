//go:build linux

package nft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"github.com/mdlayher/netlink/nltest"
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
	// userData is the user data of the sets of the transaction being
	// written, by name: the NEWSET messages of those sets carry it
	// instead of what google/nftables wrote.
	userData map[string][]byte
	// sendErr is the error of the last send, which the next receive
	// returns (nltest keeps a send's error for every receive after it,
	// and google/nftables receives once per message); drained says it
	// was returned: until the next send, receives find nothing.
	sendErr error
	drained bool
}

// newRelay makes conn send through a new relay, whose socket is opened in
// conn's namespace with the socket options given (or is conn's TestDial,
// without them), and returns it. conn must not be lasting (a lasting Conn
// has a socket of its own): the relay's socket is the one that lasts.
func newRelay(conn *nftables.Conn, opts ...nftables.SockOption) (*relay, error) {
	r := &relay{userData: map[string][]byte{}}
	if conn.TestDial != nil {
		r.sock = nltest.Dial(conn.TestDial)
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
	}
	conn.TestDial = r.exchange
	return r, nil
}

// Close closes the relay's socket.
func (r *relay) Close() error { return r.sock.Close() }

// begin starts a transaction: the user data of its sets are given anew.
func (r *relay) begin() {
	clear(r.userData)
	r.sendErr, r.drained = nil, false
}

// exchange is the Conn's socket (an nltest.Func): a request is a batch to
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
		return r.sock.Receive()
	}
	r.drained = false
	for i := range req {
		// The socket writes its own port ID.
		req[i].Header.PID = 0
		if req[i].Header.Type != newSetMessage {
			continue
		}
		data, err := withUserData(req[i].Data, r.userData)
		if err != nil {
			r.sendErr = err
			return nil, nil
		}
		req[i].Data = data
		// The Conn sized the message for its own data: the socket
		// sizes it again.
		req[i].Header.Length = 0
	}
	if _, err := r.sock.SendMessages(req); err != nil {
		r.sendErr = fmt.Errorf("send %d netlink messages: %w", len(req), err)
	}
	return nil, nil
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

// nlaAlign rounds a netlink attribute's length up to 4 bytes.
func nlaAlign(n int) int { return (n + unix.NLA_ALIGNTO - 1) &^ (unix.NLA_ALIGNTO - 1) }
