//go:build linux

package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// listenFloor listens for a floor's connections on network ("unix": a
// socket named name in dir; "tcp": a free port of 127.0.0.1).
func listenFloor(network, dir, name string) (net.Listener, error) {
	if network == "tcp" {
		return net.Listen("tcp", "127.0.0.1:0")
	}
	path := filepath.Join(dir, name)
	_ = os.Remove(path)
	return net.Listen("unix", path)
}

// loopbackTime measures how long total bytes take to write through one
// connection on network ("unix" or "tcp" on 127.0.0.1) to a reader that
// discards them, in 1 MiB writes: the floor of the first states' time
// that issue 24's target adds 20% to (the same bytes on the same
// machine, without gRPC, HTTP/2 or anything to read in them). The writer
// and the reader are two goroutines of this process, which the
// scheduler runs in turns on one core: every byte is still in that
// core's caches when it is read.
func loopbackTime(network, dir string, total int64) (time.Duration, error) {
	lis, err := listenFloor(network, dir, "loopback.sock")
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
		read <- discard(conn)
	}()
	conn, err := net.Dial(network, lis.Addr().String())
	if err != nil {
		return 0, fmt.Errorf("loopback baseline: %w", err)
	}
	start := time.Now()
	if err := writeFloor(conn, total); err != nil {
		return 0, fmt.Errorf("loopback baseline: %w", err)
	}
	if err := <-read; err != nil {
		return 0, fmt.Errorf("loopback baseline: %w", err)
	}
	return time.Since(start), nil
}

// floorBytes are what the floors write, 1 MiB at a time (only read).
var floorBytes = make([]byte, 1<<20)

// writeFloor writes total bytes to conn in 1 MiB writes and closes it.
func writeFloor(conn net.Conn, total int64) error {
	defer conn.Close()
	buf := floorBytes
	for left := total; left > 0; left -= int64(len(buf)) {
		if _, err := conn.Write(buf[:min(int64(len(buf)), left)]); err != nil {
			return err
		}
	}
	return conn.Close()
}

// connectionsTime measures how long n connections on network take to
// carry each its share of the first states' bytes (per), written by
// turns writers at a time (the controller's first states at once) to
// readers that discard them: all goroutines of this process, from the
// first connection's dial to the last reader's end. It is the floor of
// the first states with the backends' connections, one a backend,
// without gRPC, HTTP/2 or anything to read in them: when a first state
// is small (deflated), what a connection costs beside its bytes.
func connectionsTime(network, dir string, n int, per int64, turns int) (time.Duration, error) {
	lis, err := listenFloor(network, dir, "connections.sock")
	if err != nil {
		return 0, fmt.Errorf("connections baseline: %w", err)
	}
	defer lis.Close()
	errs := make(chan error, 2*n+1)
	var readers, writers sync.WaitGroup
	start := time.Now()
	readers.Go(func() {
		for range n {
			conn, err := lis.Accept()
			if err != nil {
				errs <- err
				return
			}
			readers.Go(func() {
				if err := discard(conn); err != nil {
					errs <- err
				}
			})
		}
	})
	turn := make(chan struct{}, turns)
	for range n {
		conn, err := net.Dial(network, lis.Addr().String())
		if err != nil {
			errs <- err
			_ = lis.Close() // the acceptor ends
			break
		}
		turn <- struct{}{}
		writers.Go(func() {
			defer func() { <-turn }()
			if err := writeFloor(conn, per); err != nil {
				errs <- err
			}
		})
	}
	writers.Wait()
	readers.Wait()
	took := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return 0, fmt.Errorf("connections baseline: %w", err)
	}
	return took, nil
}

// discard reads conn to its end and closes it.
func discard(conn net.Conn) error {
	defer conn.Close()
	_, err := io.Copy(io.Discard, conn)
	return err
}

// floorEnv tells a process started by loopbackProcesses its part:
// "read NETWORK ADDRESS" (it listens there, "127.0.0.1:0" for a free
// port, prints its address and discards what it reads) or "write NETWORK
// ADDRESS BYTES".
const floorEnv = "KPNG_SCALE_FLOOR"

// loopbackProcesses measures what loopbackTime does, with the writer and
// the reader in two processes (this program again), the writer pinned
// to CPU cores[0] and the reader to cores[1] (taskset), as a controller
// and its backends are when both are busy: every byte is written on one
// core and read on another. It returns the time from the writer's start
// to the reader's end, and both processes' CPU seconds.
func loopbackProcesses(ctx context.Context, network, dir string, total int64, cores []int) (time.Duration, float64, error) {
	self, err := os.Executable()
	if err != nil {
		return 0, 0, fmt.Errorf("loopback baseline on two cores: %w", err)
	}
	addr := "127.0.0.1:0"
	if network == "unix" {
		addr = filepath.Join(dir, "loopback2.sock")
		_ = os.Remove(addr)
	}
	start := func(cpu int, part string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, "taskset", "-c", strconv.Itoa(cpu), self)
		cmd.Env = append(os.Environ(), floorEnv+"="+part)
		cmd.Stderr = os.Stderr
		return cmd
	}
	reader := start(cores[1], "read "+network+" "+addr)
	out, err := reader.StdoutPipe()
	if err != nil {
		return 0, 0, fmt.Errorf("loopback baseline on two cores: %w", err)
	}
	if err := reader.Start(); err != nil {
		return 0, 0, fmt.Errorf("loopback baseline on two cores: %w", err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		_ = reader.Process.Kill()
		_ = reader.Wait()
		return 0, 0, fmt.Errorf("loopback baseline on two cores: the reader's address: %w", err)
	}
	writer := start(cores[0], fmt.Sprintf("write %s %s %d", network, strings.TrimSpace(line), total))
	began := time.Now()
	werr := writer.Run()
	if werr != nil {
		_ = reader.Process.Kill() // it may wait for a connection that never comes
	}
	rerr := reader.Wait()
	took := time.Since(began)
	if err := errors.Join(werr, rerr); err != nil {
		return 0, 0, fmt.Errorf("loopback baseline on two cores: %w", err)
	}
	cpu := 0.0
	for _, c := range []*exec.Cmd{reader, writer} {
		cpu += (c.ProcessState.UserTime() + c.ProcessState.SystemTime()).Seconds()
	}
	return took, cpu, nil
}

// floorPart runs this process as a part of loopbackProcesses when
// floorEnv says so, and reports whether it did.
func floorPart() (bool, error) {
	part := strings.Fields(os.Getenv(floorEnv))
	switch {
	case len(part) == 3 && part[0] == "read":
		lis, err := net.Listen(part[1], part[2])
		if err != nil {
			return true, err
		}
		defer lis.Close()
		fmt.Println(lis.Addr())
		conn, err := lis.Accept()
		if err != nil {
			return true, err
		}
		return true, discard(conn)
	case len(part) == 4 && part[0] == "write":
		total, err := strconv.ParseInt(part[3], 10, 64)
		if err != nil {
			return true, err
		}
		conn, err := net.Dial(part[1], part[2])
		if err != nil {
			return true, err
		}
		return true, writeFloor(conn, total)
	case len(part) > 0:
		return true, fmt.Errorf("%s=%q: want \"read NETWORK ADDRESS\" or \"write NETWORK ADDRESS BYTES\"", floorEnv, os.Getenv(floorEnv))
	}
	return false, nil
}

// twoCores returns two CPUs this process may run on, or nil when it may
// run on fewer or taskset is missing.
func twoCores() []int {
	if _, err := exec.LookPath("taskset"); err != nil {
		return nil
	}
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil
	}
	var cores []int
	for cpu := 0; cpu < 1024 && len(cores) < 2; cpu++ {
		if set.IsSet(cpu) {
			cores = append(cores, cpu)
		}
	}
	if len(cores) < 2 {
		return nil
	}
	return cores
}

// fanOutFloor measures how long one message of size bytes takes to reach
// n readers, each on a connection of its own on network ("unix" or "tcp"
// on 127.0.0.1), written to each in turn by one goroutine: the kernel's
// and the Go runtime's share of one change reaching every backend,
// without gRPC. It returns the median and p99 over rounds rounds.
func fanOutFloor(network, dir string, n, size, rounds int) (p50, p99 time.Duration, err error) {
	lis, err := listenFloor(network, dir, "fanout.sock")
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
		w, err := net.Dial(network, lis.Addr().String())
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
