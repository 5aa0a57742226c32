//go:build linux

package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// elementMonitor follows the nftables notifications of one network
// namespace (the netlink group NFNLGRP_NFTABLES, through google/nftables'
// Monitor). The kernel sends a transaction's notifications when it commits
// it, followed by a NEWGEN message: the moment they are read is the moment
// the transaction's objects are in the kernel, to within this process's
// wake-up and the parsing of the transaction's messages. No polling.
type elementMonitor struct {
	nsFile  *os.File
	conn    *nftables.Conn
	mon     *nftables.Monitor
	commits chan commit
	done    chan struct{}
}

// commit is one committed transaction as the monitor read it: when, and
// the data of the map elements it added.
type commit struct {
	at     time.Time
	values [][]byte
	// err says the monitor failed (its socket overflowed, ...): commits
	// were lost and the monitor has stopped.
	err error
}

// monitorBuffer is the receive buffer of the monitor's socket: a
// proxier's periodic sync may notify thousands of objects at once.
const monitorBuffer = 64 << 20

// newElementMonitor starts a monitor of the namespace at path.
func newElementMonitor(path string) (*elementMonitor, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("nftables monitor: %w", err)
	}
	conn, err := nftables.New(nftables.WithNetNSFd(int(f.Fd())), nftables.WithSockOptions(forceReceiveBuffer(monitorBuffer)))
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("nftables monitor in %s: %w", path, err)
	}
	// Every action and object: the NEWGEN message that ends each
	// transaction's notifications must not be filtered out.
	mon := nftables.NewMonitor(nftables.WithMonitorEventBuffer(1024))
	events, err := conn.AddGenerationalMonitor(mon)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("nftables monitor in %s: %w", path, err)
	}
	m := &elementMonitor{nsFile: f, conn: conn, mon: mon, commits: make(chan commit, 1<<16), done: make(chan struct{})}
	go func() {
		defer close(m.done)
		for evs := range events {
			c := commit{at: time.Now()}
			if evs.GeneratedBy != nil && evs.GeneratedBy.Type == nftables.MonitorEventTypeOOB {
				c.err = evs.GeneratedBy.Error
				if c.err == nil {
					c.err = errors.New("monitor stopped")
				}
			}
			for _, ev := range evs.Changes {
				if ev.Type != nftables.MonitorEventTypeNewSetElem {
					continue
				}
				elems, _ := ev.Data.([]nftables.SetElement)
				for _, e := range elems {
					if len(e.Val) > 0 {
						c.values = append(c.values, e.Val)
					}
				}
			}
			// When nobody has read for 65,536 commits, the oldest go.
			sendDropOldest(m.commits, c)
		}
	}()
	return m, nil
}

// forceReceiveBuffer sets the socket's receive buffer with
// SO_RCVBUFFORCE (root: above net.core.rmem_max).
func forceReceiveBuffer(bytes int) nftables.SockOption {
	return func(c *netlink.Conn) error {
		rc, err := c.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, bytes)
		}); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("SO_RCVBUFFORCE %d: %w", bytes, serr)
		}
		return nil
	}
}

// drain forgets the commits read so far.
func (m *elementMonitor) drain() {
	for {
		select {
		case <-m.commits:
		default:
			return
		}
	}
}

// endpointValue returns the data of a map element holding addr . port
// (ipv4_addr . inet_service: each part in a 4-byte register, the port
// big-endian and padded), as both kpng's endpoint maps and kube-proxy's
// DNAT maps hold it.
func endpointValue(addr netip.Addr, port uint16) []byte {
	a := addr.As4()
	v := make([]byte, 8)
	copy(v, a[:])
	binary.BigEndian.PutUint16(v[4:], port)
	return v
}

// wait returns when the first commit read after since that adds a map
// element whose data is want was read.
func (m *elementMonitor) wait(want []byte, since time.Time, timeout time.Duration) (time.Time, error) {
	deadline := time.After(timeout)
	for {
		select {
		case c := <-m.commits:
			if c.err != nil {
				return time.Time{}, fmt.Errorf("nftables monitor: %w", c.err)
			}
			if c.at.Before(since) {
				continue
			}
			for _, v := range c.values {
				if string(v) == string(want) {
					return c.at, nil
				}
			}
		case <-m.done:
			return time.Time{}, errors.New("nftables monitor stopped")
		case <-deadline:
			return time.Time{}, fmt.Errorf("no element %x committed within %s", want, timeout)
		}
	}
}

// close stops the monitor.
func (m *elementMonitor) close() {
	_ = m.mon.Close()
	<-m.done
	m.nsFile.Close()
}
