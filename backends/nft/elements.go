//go:build linux

package nft

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// This file marshals the messages of set elements, which are most of a
// full sync's bytes (at 10,000 services × 10 endpoints, 310,000 elements
// of 330,000 objects). google/nftables marshals each element as a tree of
// attributes, every level in a slice of its own, then again as the
// message (makeElemList): half of what a cold start allocated, a good
// part of the collector's work (BenchmarkColdStart), and the transaction
// was held twice at the flush, as messages and as the batch's buffer.
// kpng writes the same bytes itself, at the last moment: the transaction
// adds a placeholder through google/nftables (SetAddElements without
// elements: a message in its place in the batch, with the set's name, ID
// and table), and hands the relay an elementList, which the relay writes
// in the placeholder's place straight into the batch's buffer when it
// sends it (relay.fill, relay.send). TestMarshalElementsAsGoogleNftables
// checks that the bytes are google/nftables' own for every kind of
// element kpng sends.

// elementMessage is the type of a message adding set elements, and
// delElementMessage of one deleting them.
const (
	elementMessage    = netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWSETELEM)
	delElementMessage = netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_DELSETELEM)
)

// appendAttr appends to b the netlink attribute typ holding data, padded
// to 4 bytes (as netlink.MarshalAttributes writes it).
func appendAttr(b []byte, typ uint16, data []byte) []byte {
	b = binary.NativeEndian.AppendUint16(b, uint16(unix.NLA_HDRLEN+len(data)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, data...)
	return pad(b, len(data))
}

// appendStringAttr appends the attribute typ holding s and its final NUL.
func appendStringAttr(b []byte, typ uint16, s string) []byte {
	b = binary.NativeEndian.AppendUint16(b, uint16(unix.NLA_HDRLEN+len(s)+1))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, s...)
	b = append(b, 0)
	return pad(b, len(s)+1)
}

// beginNested appends the header of the nested attribute typ, its length
// to be written by endNested, and returns where it starts.
func beginNested(b []byte, typ uint16) ([]byte, int) {
	start := len(b)
	b = append(b, 0, 0, 0, 0)
	binary.NativeEndian.PutUint16(b[start+2:], typ)
	return b, start
}

// endNested writes the length of the nested attribute started at start:
// what was appended since (its contents are attributes, each padded).
func endNested(b []byte, start int) []byte {
	binary.NativeEndian.PutUint16(b[start:], uint16(len(b)-start))
	return b
}

// pad appends the padding of an attribute holding n bytes.
func pad(b []byte, n int) []byte {
	for range nlaAlign(n) - n {
		b = append(b, 0)
	}
	return b
}

// appendElement appends the i-th element (from 0) of a message, e, as
// google/nftables' makeElemList marshals it for set s.
func appendElement(b []byte, s *nftables.Set, i int, e *nftables.SetElement) []byte {
	b, item := beginNested(b, uint16(i+1)|unix.NLA_F_NESTED)
	if e.IntervalEnd {
		b = appendAttr(b, unix.NFTA_SET_ELEM_FLAGS|unix.NLA_F_NESTED, binary.BigEndian.AppendUint32(nil, unix.NFT_SET_ELEM_INTERVAL_END))
	}
	var key int
	b, key = beginNested(b, unix.NFTA_SET_ELEM_KEY|unix.NLA_F_NESTED)
	b = endNested(appendAttr(b, unix.NFTA_DATA_VALUE, e.Key), key)
	if len(e.KeyEnd) > 0 {
		b, key = beginNested(b, nftables.NFTA_SET_ELEM_KEY_END|unix.NLA_F_NESTED)
		b = endNested(appendAttr(b, unix.NFTA_DATA_VALUE, e.KeyEnd), key)
	}
	if s.HasTimeout && e.Timeout != 0 {
		b = appendAttr(b, unix.NFTA_SET_ELEM_TIMEOUT, binary.BigEndian.AppendUint64(nil, uint64(e.Timeout.Milliseconds())))
	}
	switch {
	case e.VerdictData != nil:
		var data, verdict int
		b, data = beginNested(b, unix.NFTA_SET_ELEM_DATA|unix.NLA_F_NESTED)
		b, verdict = beginNested(b, unix.NFTA_SET_ELEM_DATA|unix.NLA_F_NESTED)
		var code [4]byte
		binary.BigEndian.PutUint32(code[:], uint32(e.VerdictData.Kind))
		b = appendAttr(b, unix.NFTA_DATA_VALUE, code[:])
		if e.VerdictData.Chain != "" {
			b = appendStringAttr(b, unix.NFTA_SET_ELEM_DATA, e.VerdictData.Chain)
		}
		b = endNested(endNested(b, verdict), data)
	case len(e.Val) > 0:
		var data int
		b, data = beginNested(b, unix.NFTA_SET_ELEM_DATA|unix.NLA_F_NESTED)
		b = endNested(appendAttr(b, unix.NFTA_DATA_VALUE, e.Val), data)
	}
	if e.Comment != "" {
		// userdata.AppendString: one TLV of the comment and its NUL.
		n := len(e.Comment) + 1
		b = binary.NativeEndian.AppendUint16(b, uint16(unix.NLA_HDRLEN+2+n))
		b = binary.NativeEndian.AppendUint16(b, unix.NFTA_SET_ELEM_USERDATA)
		b = append(b, byte(userdata.NFTNL_UDATA_SET_ELEM_COMMENT), byte(n))
		b = append(b, e.Comment...)
		b = pad(append(b, 0), 2+n)
	}
	return endNested(b, item)
}

// elementListHead appends the attributes of a message of set elements
// that come before the elements: the set's name, ID and table.
func elementListHead(b []byte, s *nftables.Set) []byte {
	b = appendStringAttr(b, unix.NFTA_SET_NAME, s.Name)
	b = appendAttr(b, unix.NFTA_LOOKUP_SET_ID, binary.BigEndian.AppendUint32(nil, s.ID))
	return appendStringAttr(b, unix.NFTA_SET_TABLE, s.Table.Name)
}

// elementList is the payload of one message of set elements (everything
// after its nfgenmsg header): its size, and how to write it. The relay
// writes it when it sends the batch, straight into the batch's buffer
// (relay.send): the elements of a full sync, most of its bytes, are
// never held marshaled but there (a fifth of the process's live heap at
// the flush of 50,000 services, where the transaction was held twice).
type elementList struct {
	set  *nftables.Set
	size int
	// from and to are the elements' indexes, elem makes the i-th.
	from, to int
	elem     func(i int) (nftables.SetElement, error)
}

// newElementList returns the payload adding (or deleting) elem(from) to
// elem(to-1) in s, as google/nftables' SetAddElements writes it: the
// set's name, ID and table, then the elements. Its size is measured by
// writing it into scratch, a buffer reused from message to message. elem
// must give the same elements when the relay writes them. The attribute
// of the elements has a 16-bit length: the caller keeps them under
// elementBytesPerMessage.
func newElementList(s *nftables.Set, from, to int, elem func(i int) (nftables.SetElement, error), scratch *[]byte) (elementList, error) {
	l := elementList{set: s, from: from, to: to, elem: elem}
	b, err := l.append((*scratch)[:0])
	*scratch = b
	if err != nil {
		return elementList{}, err
	}
	l.size = len(b)
	return l, nil
}

// append appends the payload to b.
func (l elementList) append(b []byte) ([]byte, error) {
	b = elementListHead(b, l.set)
	b, list := beginNested(b, unix.NFTA_SET_ELEM_LIST_ELEMENTS|unix.NLA_F_NESTED)
	for i := l.from; i < l.to; i++ {
		e, err := l.elem(i)
		if err != nil {
			return b, err
		}
		b = appendElement(b, l.set, i-l.from, &e)
	}
	if len(b)-list > 0xffff {
		return b, errors.New("elements over 64 KiB in one message")
	}
	return endNested(b, list), nil
}

// write writes the payload into b, which has its size.
func (l elementList) write(b []byte) error {
	out, err := l.append(b[:0:len(b)])
	switch {
	case err != nil:
		return err
	case len(out) != l.size || &out[0] != &b[0]:
		return fmt.Errorf("set %s: the elements of a message changed size (%d bytes, then %d)", l.set.Name, l.size, len(out))
	}
	return nil
}

// nfgenmsgLen is the length of the header of an nftables message's
// payload (struct nfgenmsg: family, version, resource ID).
const nfgenmsgLen = 4

// isPlaceholder reports whether data, the payload of a message of set
// elements, is a placeholder: its last attribute, walked from the first,
// is an empty list of elements (the bytes of a real message's last
// element can look the same: an address ending in 4.0.3.128).
func isPlaceholder(data []byte) bool {
	for off := nfgenmsgLen; off+unix.NLA_HDRLEN <= len(data); {
		l := int(binary.NativeEndian.Uint16(data[off:]))
		if l < unix.NLA_HDRLEN {
			return false
		}
		next := off + nlaAlign(l)
		if next >= len(data) {
			return next == len(data) && l == unix.NLA_HDRLEN &&
				binary.NativeEndian.Uint16(data[off+2:]) == unix.NFTA_SET_ELEM_LIST_ELEMENTS|unix.NLA_F_NESTED
		}
		off = next
	}
	return false
}

// ofPlaceholder reports whether the placeholder data is the message of l:
// its attributes before the elements are the same.
func (l elementList) ofPlaceholder(data []byte) bool {
	return bytes.Equal(data[nfgenmsgLen:len(data)-unix.NLA_HDRLEN], elementListHead(nil, l.set))
}
