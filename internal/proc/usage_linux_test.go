//go:build linux

package proc

import (
	"os"
	"testing"
)

// TestCPUSecondsAndMemory burns CPU in this process and checks that its
// CPU time grows, and that its RSS is read (positive, and at most its
// peak); a process that does not exist is an error.
func TestCPUSecondsAndMemory(t *testing.T) {
	before, err := CPUSeconds(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	x, after := 0, before
	// About 5 ms of work a round: 2,000 rounds are far more than the 10
	// ms resolution needs.
	for round := 0; after <= before; round++ {
		if round == 2000 {
			t.Fatalf("CPU time still %.2f s after 2,000 rounds of work", after)
		}
		for i := range 10_000_000 {
			x += i
		}
		if after, err = CPUSeconds(os.Getpid()); err != nil {
			t.Fatal(err)
		}
	}
	_ = x
	rss, peak, err := Memory(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if rss <= 0 || rss > peak {
		t.Errorf("RSS %.1f MiB, peak %.1f MiB: want 0 < RSS ≤ peak", rss, peak)
	}
	if _, err := CPUSeconds(1 << 30); err == nil {
		t.Error("the CPU time of a process that does not exist")
	}
	if _, _, err := Memory(1 << 30); err == nil {
		t.Error("the memory of a process that does not exist")
	}
}
