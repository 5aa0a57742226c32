//go:build linux

package nft

import (
	"errors"
	"io"
	"os"
	"syscall"

	"github.com/mdlayher/netlink"
)

// dialSocket is the netlink.Socket of a relay whose Conn has a TestDial
// (google/nftables' seam for its socket, which the unprivileged tests fill
// with a fake kernel): a send hands the messages to dial and keeps its
// answer for the next receive; a receive with no answer kept asks dial,
// with a nil request, for what the socket would read next. io.EOF from
// dial means "nothing more": the receive then returns no messages.
type dialSocket struct {
	dial    func([]netlink.Message) ([]netlink.Message, error)
	answers []netlink.Message
	err     error
}

// dialSocketPID is the port ID of a dialSocket's netlink.Conn.
const dialSocketPID = 1

// newDialConn returns a netlink.Conn whose socket is dial.
func newDialConn(dial func([]netlink.Message) ([]netlink.Message, error)) *netlink.Conn {
	return netlink.NewConn(&dialSocket{dial: dial}, dialSocketPID)
}

// Close implements netlink.Socket.
func (s *dialSocket) Close() error { return nil }

// Send implements netlink.Socket.
func (s *dialSocket) Send(m netlink.Message) error {
	return s.SendMessages([]netlink.Message{m})
}

// SendMessages implements netlink.Socket: the answer of dial waits for the
// next Receive (a send's error too, as the kernel's answers would).
func (s *dialSocket) SendMessages(msgs []netlink.Message) error {
	answers, err := s.dial(msgs)
	s.answers = append(s.answers, answers...)
	s.err = err
	return nil
}

// Receive implements netlink.Socket.
func (s *dialSocket) Receive() ([]netlink.Message, error) {
	msgs, err := s.answers, s.err
	s.answers, s.err = nil, nil
	if len(msgs) == 0 && err == nil {
		msgs, err = s.dial(nil)
	}
	if errors.Is(err, io.EOF) {
		return msgs, nil
	}
	var errno syscall.Errno
	if errors.As(err, &errno) && !isSyscallError(err) {
		// As a socket's read would report it.
		err = os.NewSyscallError("recvmsg", err)
	}
	return msgs, err
}

// isSyscallError reports whether err already says which system call
// failed.
func isSyscallError(err error) bool {
	var se *os.SyscallError
	return errors.As(err, &se)
}
