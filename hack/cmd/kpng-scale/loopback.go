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
