//go:build linux

package proc

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

func TestAlive(t *testing.T) {
	if !Alive(os.Getpid()) {
		t.Errorf("this process is not alive")
	}
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	if !Alive(pid) {
		t.Errorf("a running child is not alive")
	}
	_ = cmd.Process.Kill()
	// Killed but not reaped: a zombie, which is not alive.
	deadline := time.Now().Add(5 * time.Second)
	for Alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("a killed child (a zombie until reaped) is still alive after 5 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = cmd.Wait()
	if Alive(pid) {
		t.Errorf("a reaped child is alive")
	}
}
