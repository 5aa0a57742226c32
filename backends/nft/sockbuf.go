//go:build linux

package nft

import (
	"fmt"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// ackBytes is the receive buffer space one answer of the kernel takes (its
// truesize, not its 36 bytes): the relay asks for none (quietBatch), but
// the kernel answers every message it rejects.
const ackBytes = 1024

// minReceiveBuffer is the smallest receive buffer set on the socket.
const minReceiveBuffer = 4 << 20

// receiveBufferFor returns the receive buffer a transaction of messages
// messages needs for an answer to each (the relay asks for none, but the
// kernel answers each message it rejects, with the message).
func receiveBufferFor(messages int) int {
	return max(minReceiveBuffer, messages*ackBytes)
}

// sendBufferFor returns the send buffer a transaction of messages messages
// (elements map elements among them) needs: google/nftables sends a whole
// batch in one sendmsg, and the kernel refuses (EMSGSIZE) a netlink
// datagram larger than the socket's send buffer. The buffer is only that
// limit (the kernel allocates the datagram at its real size), so the bound
// is generous: 2 KiB per message (a rule, a chain) and 512 bytes per
// element (a key and a verdict naming a chain of up to 255 bytes).
func sendBufferFor(messages, elements int) int {
	return max(minReceiveBuffer, messages*2048+elements*512)
}

// sendBuffer returns a socket option setting the send buffer to bytes,
// with SO_SNDBUFFORCE or, failing that, SO_SNDBUF.
func sendBuffer(bytes int) nftables.SockOption {
	return socketBuffer("send", unix.SO_SNDBUFFORCE, bytes, (*netlink.Conn).SetWriteBuffer)
}

// receiveBuffer returns a socket option setting the receive buffer to
// bytes, with SO_RCVBUFFORCE (root: above net.core.rmem_max) or, failing
// that, SO_RCVBUF. Without it, a transaction of a few hundred messages
// overflows the default buffer with its acks (ENOBUFS), and its outcome is
// then unknown.
func receiveBuffer(bytes int) nftables.SockOption {
	return socketBuffer("receive", unix.SO_RCVBUFFORCE, bytes, (*netlink.Conn).SetReadBuffer)
}

// socketBuffer returns a socket option setting one of the socket's
// buffers (what: "send" or "receive") to bytes with the socket option
// force, or with fallback (limited by the system's maximum) when that is
// refused.
func socketBuffer(what string, force, bytes int, fallback func(*netlink.Conn, int) error) nftables.SockOption {
	return func(c *netlink.Conn) error {
		rc, err := c.SyscallConn()
		if err != nil {
			return fmt.Errorf("netlink socket: %w", err)
		}
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, force, bytes)
		}); err != nil {
			return fmt.Errorf("netlink socket: %w", err)
		}
		if serr != nil {
			if err := fallback(c, bytes); err != nil {
				return fmt.Errorf("set the netlink %s buffer to %d bytes: %w", what, bytes, err)
			}
		}
		return nil
	}
}
