//go:build linux

package nft

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// TestQuietBatch checks that the messages of an nftables batch lose the
// acknowledgement google/nftables asks for, and that anything else (a
// dump, a lone message) is sent as it is.
func TestQuietBatch(t *testing.T) {
	ack := netlink.Request | netlink.Acknowledge
	msg := func(typ netlink.HeaderType, flags netlink.HeaderFlags) netlink.Message {
		return netlink.Message{Header: netlink.Header{Type: typ, Flags: flags}}
	}
	begin, end := netlink.HeaderType(unix.NFNL_MSG_BATCH_BEGIN), netlink.HeaderType(unix.NFNL_MSG_BATCH_END)
	batch := []netlink.Message{msg(begin, netlink.Request), msg(newSetMessage, ack|netlink.Create), msg(newSetMessage, ack), msg(end, netlink.Request)}
	if !quietBatch(batch) {
		t.Fatal("a batch is not taken as one")
	}
	for i, m := range batch {
		if m.Header.Flags&netlink.Acknowledge != 0 || m.Header.Flags&netlink.Request == 0 {
			t.Errorf("message %d: flags %v, want a request without acknowledgement", i, m.Header.Flags)
		}
	}
	if batch[1].Header.Flags&netlink.Create == 0 {
		t.Errorf("the other flags are lost: %v", batch[1].Header.Flags)
	}
	for name, req := range map[string][]netlink.Message{
		"dump":          {msg(newSetMessage, ack|netlink.Dump)},
		"no batch end":  {msg(begin, netlink.Request), msg(newSetMessage, ack)},
		"lone messages": {msg(newSetMessage, ack), msg(newSetMessage, ack)},
	} {
		if quietBatch(req) {
			t.Errorf("%s: taken as a batch", name)
		}
		for i, m := range req {
			if m.Header.Type == newSetMessage && m.Header.Flags&netlink.Acknowledge == 0 {
				t.Errorf("%s: message %d lost its acknowledgement", name, i)
			}
		}
	}
}

// TestFirstRejection reads datagrams as the kernel queues them after a
// batch: nothing, acknowledgements (code 0), and rejections carrying the
// message rejected.
func TestFirstRejection(t *testing.T) {
	answer := func(code int32, payload int) []byte {
		b := make([]byte, unix.NLMSG_HDRLEN+4+payload)
		binary.NativeEndian.PutUint32(b, uint32(len(b)))
		binary.NativeEndian.PutUint16(b[4:], unix.NLMSG_ERROR)
		binary.NativeEndian.PutUint32(b[unix.NLMSG_HDRLEN:], uint32(code))
		return b
	}
	join := func(parts ...[]byte) []byte {
		var b []byte
		for _, p := range parts {
			b = append(b, p...)
		}
		return b
	}
	for _, tc := range []struct {
		name string
		b    []byte
		want error
	}{
		{"nothing", nil, nil},
		{"an acknowledgement", answer(0, unix.NLMSG_HDRLEN), nil},
		{"a rejection", answer(-int32(unix.ENOENT), 40), unix.ENOENT},
		{"acknowledged, then rejected twice: the first", join(answer(0, 16), answer(-int32(unix.EBUSY), 16), answer(-int32(unix.EINVAL), 16)), unix.EBUSY},
		{"truncated rejection", answer(-int32(unix.ELOOP), 100)[:unix.NLMSG_HDRLEN+4+10], unix.ELOOP},
		{"a header only", answer(0, 0)[:unix.NLMSG_HDRLEN], nil},
	} {
		err := firstRejection(tc.b)
		if (err == nil) != (tc.want == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}
