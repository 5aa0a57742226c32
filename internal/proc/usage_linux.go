//go:build linux

package proc

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on
// every Linux architecture Go supports.
const clockTicks = 100

// CPUSeconds returns the CPU time process pid has used so far, user and
// system (utime+stime of /proc/PID/stat), in seconds, at the kernel's
// 10 ms resolution.
func CPUSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("cpu time of process %d: %w", pid, err)
	}
	// The fields after the command name (in parentheses, which may hold
	// spaces): utime and stime are the 12th and 13th.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("cpu time of process %d: /proc/%d/stat has %d fields after the name, want at least 13", pid, pid, len(f))
	}
	u, err := strconv.ParseUint(f[11], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("cpu time of process %d: utime %q: %w", pid, f[11], err)
	}
	st, err := strconv.ParseUint(f[12], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("cpu time of process %d: stime %q: %w", pid, f[12], err)
	}
	return float64(u+st) / clockTicks, nil
}

// Memory returns process pid's resident set size now (VmRSS) and at its
// peak (VmHWM), in MiB.
func Memory(pid int) (rss, peak float64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, fmt.Errorf("memory of process %d: %w", pid, err)
	}
	found := 0
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || (f[0] != "VmRSS:" && f[0] != "VmHWM:") {
			continue
		}
		kib, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			return 0, 0, fmt.Errorf("memory of process %d: %s %q: %w", pid, f[0], f[1], err)
		}
		if f[0] == "VmRSS:" {
			rss = kib / 1024
		} else {
			peak = kib / 1024
		}
		found++
	}
	if found != 2 {
		return 0, 0, fmt.Errorf("memory of process %d: no VmRSS and VmHWM in /proc/%d/status", pid, pid)
	}
	return rss, peak, nil
}
