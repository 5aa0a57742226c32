//go:build linux

package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"time"
)

// loopbackTime measures how long total bytes take to write through a unix
// socket to a reader that discards them, in 1 MiB writes: the floor of
// the first states' time that issue 24's target adds 20% to (the same
// bytes on the same machine, without gRPC, HTTP/2 or anything to read in
// them).
func loopbackTime(dir string, total int64) (time.Duration, error) {
	path := filepath.Join(dir, "loopback.sock")
	_ = os.Remove(path)
	lis, err := net.Listen("unix", path)
	if err != nil {
		return 0, fmt.Errorf("loopback baseline: %w", err)
	}
	defer lis.Close()
	read := make(chan error, 1)
	go func() {
		conn, err := lis.Accept()
		if err != nil {
			read <- err
			return
		}
		defer conn.Close()
		_, err = io.Copy(io.Discard, conn)
		read <- err
	}()
	conn, err := net.Dial("unix", path)
	if err != nil {
		return 0, fmt.Errorf("loopback baseline: %w", err)
	}
	buf := make([]byte, 1<<20)
	start := time.Now()
	for left := total; left > 0; left -= int64(len(buf)) {
		if _, err := conn.Write(buf[:min(int64(len(buf)), left)]); err != nil {
			conn.Close()
			return 0, fmt.Errorf("loopback baseline: %w", err)
		}
	}
	conn.Close()
	if err := <-read; err != nil {
		return 0, fmt.Errorf("loopback baseline: %w", err)
	}
	return time.Since(start), nil
}

// fanOutFloor measures how long one message of size bytes takes to reach
// n readers, each on a unix socket of its own, written to each in turn by
// one goroutine: the kernel's and the Go runtime's share of one change
// reaching every backend, without gRPC. It returns the median and p99
// over rounds rounds.
func fanOutFloor(dir string, n, size, rounds int) (p50, p99 time.Duration, err error) {
	path := filepath.Join(dir, "fanout.sock")
	_ = os.Remove(path)
	lis, err := net.Listen("unix", path)
	if err != nil {
		return 0, 0, fmt.Errorf("fan-out floor: %w", err)
	}
	defer lis.Close()
	got := make(chan struct{}, n)
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range n {
		w, err := net.Dial("unix", path)
		if err != nil {
			return 0, 0, fmt.Errorf("fan-out floor: %w", err)
		}
		r, err := lis.Accept()
		if err != nil {
			w.Close()
			return 0, 0, fmt.Errorf("fan-out floor: %w", err)
		}
		conns = append(conns, w, r)
		go func() {
			buf := make([]byte, size)
			for {
				if _, err := io.ReadFull(r, buf); err != nil {
					return
				}
				got <- struct{}{}
			}
		}()
	}
	msg := make([]byte, size)
	var times []time.Duration
	for range rounds {
		start := time.Now()
		for i := 0; i < len(conns); i += 2 {
			if _, err := conns[i].Write(msg); err != nil {
				return 0, 0, fmt.Errorf("fan-out floor: %w", err)
			}
		}
		for range n {
			<-got
		}
		times = append(times, time.Since(start))
	}
	return quantile(times, 0.5), quantile(times, 0.99), nil
}
