//go:build linux

package nfmonitor

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"sigs.k8s.io/kpng/internal/netns"
)

// tinyBuffer is the receive buffer of the monitors that must lose
// notifications: the kernel raises it to its minimum (some 4 KiB), which
// holds one or two of the messages a transaction's notifications are
// packed in.
const tinyBuffer = 1

// burstRules is the number of rules the burst adds in one transaction:
// a notification each, some 400 KiB of them.
const burstRules = 3000

// burstScript returns an nft script adding, in one transaction, table
// inet name with a chain of rules rules.
func burstScript(name string, rules int) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "add table inet %s\nadd chain inet %s c\n", name, name)
	for i := range rules {
		fmt.Fprintf(&b, "add rule inet %s c ip daddr 10.%d.%d.%d counter accept\n", name, i>>16&0xff, i>>8&0xff, i&0xff)
	}
	return []byte(b.String())
}

// startNft starts `nft -f -` in ns with script as its input; `ip netns
// exec` executes nft in the process it is started as.
func startNft(t *testing.T, ns *netns.NS, script []byte) (*exec.Cmd, *strings.Builder) {
	t.Helper()
	cmd := exec.Command("ip", "netns", "exec", ns.Name, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(string(script))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("nft -f in %s: %v", ns, err)
	}
	return cmd, &stderr
}

// waitNft waits for an nft started by startNft.
func waitNft(t *testing.T, cmd *exec.Cmd, stderr *strings.Builder) {
	t.Helper()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("nft -f: %v: %s", err, stderr)
	}
}

// lossCounter counts a monitor's Lost calls (its lost method is a
// Config.Lost), and signals them on ch (one pending at most).
type lossCounter struct {
	n  atomic.Int32
	ch chan struct{}
}

func newLossCounter() *lossCounter { return &lossCounter{ch: make(chan struct{}, 1)} }

func (l *lossCounter) lost() {
	l.n.Add(1)
	select {
	case l.ch <- struct{}{}:
	default:
	}
}

// startIn starts a monitor of cfg in ns (cfg.NetNS set to it), stopped
// when the test ends.
func startIn(t *testing.T, ns *netns.NS, cfg Config) *Monitor {
	t.Helper()
	f, err := os.Open(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	// The monitor's sockets keep the namespace.
	defer f.Close()
	cfg.NetNS = int(f.Fd())
	ctx, cancel := context.WithCancel(context.Background())
	mon, err := Start(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); <-mon.Done() })
	return mon
}

// TestKernelLostNotifications commits, in a network namespace of its
// own, a transaction of burstRules rules (the burst) that the monitor
// counts as its backend's own (Own: its nft process), then another
// program's small one (the marker). With a tiny receive buffer, the
// burst's notifications overflow the socket (ENOBUFS): Lost must be
// called, and the marker's repair must be the first, naming the marker
// alone (had a batch of the burst been taken for a foreign one, it would
// have been repaired before or with it). With the default buffer, the
// same burst loses nothing (the control: the loss is the buffer's). It
// fails when the monitor stops at ENOBUFS instead of calling Lost.
func TestKernelLostNotifications(t *testing.T) {
	netns.RequirePrivileged(t)
	netns.RequireCommands(t, "ip", "nft")
	for _, tc := range []struct {
		name   string
		buffer int
		lost   bool
	}{
		{"tiny buffer", tinyBuffer, true},
		{"default buffer", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := netns.New(t, "nfmon")
			var burstPID atomic.Uint32
			losses := newLossCounter()
			repairs := make(chan string, 100)
			startIn(t, ns, Config{
				ReceiveBuffer: tc.buffer,
				Watch: func(c Change, _ []byte) bool {
					return c.Family == 1 && (c.Table == "burst" || c.Table == "marker")
				},
				Own: func(b Batch) bool { return b.ProcPID == burstPID.Load() },
				Repair: func(why string, foreign []Batch) {
					for _, b := range foreign {
						if tc.lost && !b.Cut {
							t.Errorf("after an overrun: batch %s not Cut (it may lack changes the kernel dropped)", b)
						}
					}
					repairs <- why
				},
				Lost: losses.lost,
			})

			// The burst's process ID is known before it commits (nft
			// reads its script first), and Own is called Settle after a
			// batch ends at the earliest.
			cmd, stderr := startNft(t, ns, burstScript("burst", burstRules))
			burstPID.Store(uint32(cmd.Process.Pid))
			waitNft(t, cmd, stderr)
			if tc.lost {
				select {
				case <-losses.ch:
				case <-time.After(10 * time.Second):
					t.Fatalf("a transaction of %d rules with a receive buffer of %d bytes: Lost not called (waited 10 s)", burstRules, tc.buffer)
				}
			}
			// The marker, another program's: its repair comes after the
			// burst's batches were all classified.
			cmd, stderr = startNft(t, ns, []byte("add table inet marker\n"))
			markerPID := cmd.Process.Pid
			waitNft(t, cmd, stderr)
			select {
			case why := <-repairs:
				// The marker's batch, never after a repair of the
				// burst's or with it as another transaction. It is Cut,
				// with changes of the burst, when the burst's end was
				// lost (a loss the repair says it covers).
				by := fmt.Sprintf("(by nft, pid %d)", markerPID)
				alone := "add table inet marker " + by
				cut := by + " (and maybe by a transaction whose end was lost, or with changes lost)"
				if !strings.Contains(why, "add table inet marker") || why != alone && !strings.Contains(why, cut) || strings.Contains(why, "more transactions") {
					t.Errorf("the first repair: %q, want the marker's, %q, or its batch cut by the burst's lost end (the burst is the backend's own)", why, alone)
				}
				t.Logf("the first repair: %s", why)
			case <-time.After(10 * time.Second):
				t.Fatalf("the marker, another program's transaction: no repair (waited 10 s)")
			}
			t.Logf("buffer %d: Lost called %d times", tc.buffer, losses.n.Load())
			if !tc.lost && losses.n.Load() != 0 {
				t.Errorf("default buffer: Lost called %d times for a transaction of %d rules, want none", losses.n.Load(), burstRules)
			}
		})
	}
}

// TestKernelMute commits, in a network namespace of its own, a burst of
// burstRules rules that the monitor counts as its backend's own, then
// another program's marker:
//   - listening: every change of the burst is read (the control: the
//     count below can tell);
//   - muted around the burst (unmute with its one commit): none of the
//     burst's changes is read, nothing is lost, and the marker's repair
//     is the first and only call, naming the marker alone (listening
//     again, the monitor does not take the muted generations for lost
//     ones);
//   - muted while another program commits too: Lost is called.
//
// It fails when Mute does not stop the notifications (the burst read),
// or when unmute does not compare the generations (no Lost), or does not
// resync (a Lost, or a Cut marker, after the muted burst alone). The
// burst's time in each case is logged: the cost of the kernel's
// notifications to one listener.
func TestKernelMute(t *testing.T) {
	netns.RequirePrivileged(t)
	netns.RequireCommands(t, "ip", "nft")
	for _, tc := range []struct {
		name    string
		mute    bool
		foreign bool
	}{
		{"listening", false, false},
		{"muted", true, false},
		{"muted, another program commits", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := netns.New(t, "nfmute")
			var burstPID atomic.Uint32
			var watched atomic.Int32
			losses := newLossCounter()
			repairs := make(chan string, 100)
			mon := startIn(t, ns, Config{
				Watch: func(c Change, _ []byte) bool {
					if c.Family == 1 && strings.HasPrefix(c.Table, "burst") {
						watched.Add(1)
						return true
					}
					return c.Family == 1 && (c.Table == "marker" || c.Table == "foreign")
				},
				Own:    func(b Batch) bool { return b.ProcPID == burstPID.Load() },
				Repair: func(why string, _ []Batch) { repairs <- why },
				Lost:   losses.lost,
			})

			unmute := func(int) {}
			if tc.mute {
				unmute = mon.Mute()
			}
			start := time.Now()
			cmd, stderr := startNft(t, ns, burstScript("burst", burstRules))
			burstPID.Store(uint32(cmd.Process.Pid))
			waitNft(t, cmd, stderr)
			t.Logf("a transaction of %d rules, %s: %v", burstRules, tc.name, time.Since(start).Round(time.Millisecond))
			if tc.foreign {
				cmd, stderr := startNft(t, ns, []byte("add table inet foreign\n"))
				waitNft(t, cmd, stderr)
			}
			unmute(1)
			if tc.foreign {
				select {
				case <-losses.ch:
				case <-time.After(10 * time.Second):
					t.Fatal("another program committed while the monitor was muted: Lost not called (waited 10 s)")
				}
				return
			}
			// The marker, another program's: its repair comes after the
			// burst's batches were all classified.
			cmd, stderr = startNft(t, ns, []byte("add table inet marker\n"))
			markerPID := cmd.Process.Pid
			waitNft(t, cmd, stderr)
			select {
			case why := <-repairs:
				if want := fmt.Sprintf("add table inet marker (by nft, pid %d)", markerPID); why != want {
					t.Errorf("the first repair: %q, want the marker's alone, %q", why, want)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the marker, another program's transaction: no repair (waited 10 s)")
			}
			n := watched.Load()
			t.Logf("%s: %d changes of the burst read", tc.name, n)
			switch {
			case tc.mute && n != 0:
				t.Errorf("muted: %d changes of the burst read, want none", n)
			case !tc.mute && n < burstRules:
				t.Errorf("listening: %d changes of the burst read, want at least its %d rules", n, burstRules)
			}
			if l := losses.n.Load(); l != 0 {
				t.Errorf("Lost called %d times, want none (the burst is the backend's own)", l)
			}
		})
	}
}
