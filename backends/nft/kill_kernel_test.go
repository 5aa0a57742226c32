//go:build linux

package nft

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"

	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/internal/racebuild"
	"sigs.k8s.io/kpng/internal/selfexec"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

// killHelperEnv makes the test binary run killHelper instead of the tests:
// its value is the path of the network namespace to program.
const killHelperEnv = "KPNG_NFT_KILL_HELPER"

// TestMain runs the tests, or killHelper in a process of its own, or
// compareTables for the soak.
func TestMain(m *testing.M) {
	if path := os.Getenv(killHelperEnv); path != "" {
		os.Exit(killHelper(path, os.Getenv("KPNG_NFT_KILL_FIRST"), os.Getenv("KPNG_NFT_KILL_ONCE") != "", atoi(os.Getenv("KPNG_NFT_KILL_PAUSE"))))
	}
	if spec := os.Getenv(compareEnv); spec != "" {
		os.Exit(compareTables(spec))
	}
	os.Exit(m.Run())
}

// killStates are the two states the killed proxier alternates between:
// 1,500 services of 4 endpoints; from A to B, every service's endpoints
// change, 400 services go and 400 others come (a partial transaction of
// some 10,000 objects).
func killStates() (a, b []*model.ServiceEndpoints) {
	service := func(i, shift int) *model.ServiceEndpoints {
		ip := netip.AddrFrom4([4]byte{10, 96, byte(i / 250), byte(1 + i%250)})
		var eps []*model.Endpoint
		for j := range 4 {
			n := i*4 + j + shift
			eps = append(eps, ep(netip.AddrFrom4([4]byte{10, 1, byte(n / 250), byte(1 + n%250)}).String(), j == 0))
		}
		return &model.ServiceEndpoints{Service: svc("kill", fmt.Sprintf("svc-%04d", i), ipset(ip.String()), tcp(80, 8080)), Endpoints: eps}
	}
	for i := range 1500 {
		a = append(a, service(i, 0))
		b = append(b, service(i+400, 1))
	}
	return a, b
}

// killHelper is the proxier the test kills: in the network namespace at
// path, it syncs the state first ("a" or "b") then the other, alternately,
// forever (or once with once), printing "begin <state>" before each Sync,
// "send" when a large transaction's connection is made (right before its
// batch is sent) and "end <state> <ms in the sink> <ms in all> <µs since
// send>" after it. With pause > 0, its transaction number pause (from 1)
// stops there instead, once its connection is made (in the middle of
// the transaction, before its batch is sent), prints "paused" and waits
// to be killed.
func killHelper(path, first string, once bool, pause int) int {
	f, err := os.Open(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// Open until the end: a closed descriptor would make the
	// connections below work in another namespace.
	defer f.Close()
	fd := int(f.Fd())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Large transactions get a connection of their own, dialled right
	// before the batch is sent: say when.
	inNS := ConnInNetNS(fd)
	var sent time.Time
	transaction := 0
	newConn := func(opts ...nftables.ConnOption) (*nftables.Conn, error) {
		return inNS(append(opts, nftables.WithSockOptions(func(*netlink.Conn) error {
			sent = time.Now()
			fmt.Println("send")
			if pause > 0 && transaction == pause {
				fmt.Println("paused")
				select {} // until killed
			}
			return nil
		}))...)
	}
	var last SyncResult
	s, err := New(ctx, Config{ServiceProxyName: "kill", Conn: newConn, Conntrack: conntrackAt(fd),
		AfterSync: func(r SyncResult) { last = r }})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	feeder := localsink.NewFeeder(s, localsink.FeederOptions{NoRetry: true})
	a, b := killStates()
	states := map[string][]*model.ServiceEndpoints{"a": a, "b": b}
	name := first
	for {
		feeder.SetAll(states[name])
		transaction++
		fmt.Printf("begin %s\n", name)
		start := time.Now()
		if err := feeder.Sync(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Printf("end %s %d %d %d\n", name, last.Duration.Milliseconds(), time.Since(start).Milliseconds(), time.Since(sent).Microseconds())
		if once {
			return 0
		}
		name = map[string]string{"a": "b", "b": "a"}[name]
	}
}

// TestKernelKilledWhileProgramming starts a proxier process that
// alternates between two large states (killHelper), and kills it with
// SIGKILL at a random moment of a random transaction, 12 times in a row
// (KPNG_KILLS; 4 under the race detector), each new process starting from the table the previous one left.
// After each kill the table read back from the kernel must be the first
// state's or the second's as a fresh sink programs them (or none, before
// the first transaction), never a mix of the two; a process started after
// the last kill converges to the state it is given. How many kills landed
// between a "begin" and its "end" is logged: the kernel applies a batch
// in the system call that sends it, so a kill takes effect before it
// (nothing applied) or after (all of it). Every fourth kill, the first
// included, is certain to land in the middle of a transaction: the
// process stops in its second transaction once the connection is made,
// right before the batch is sent (killHelper's pause), and is killed
// there; the table must then hold the state before that transaction, and
// at least those kills must be counted as mid-transaction.
func TestKernelKilledWhileProgramming(t *testing.T) {
	netns.RequirePrivileged(t)
	ns := netns.New(t, "kill")
	a, b := killStates()
	wantA := freshKernelTable(t, "kill", Options{}, a)
	wantB := freshKernelTable(t, "kill", Options{}, b)
	conn := connIn(t, ns)
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))

	kills := 12
	if racebuild.Enabled {
		kills = 4 // each killed process is a race-detecting test binary, ten times slower
	}
	if n := os.Getenv("KPNG_KILLS"); n != "" {
		fmt.Sscan(n, &kills)
	}
	start := time.Now()
	var midway, kept, replaced, atBatch, paused int
	var durations []int // ms in the sink, of the transactions that ended
	last := "none"      // the state the kernel held after the previous kill
	for i := range kills {
		first := []string{"a", "b"}[i%2]
		if i%4 == 0 {
			paused++
			cmd, lines := startKillHelper(t, ns, first, false, 2)
			// Wait for the pause; the state before the second
			// transaction is the first's.
			var ends []string
			for line := range lines {
				f := strings.Fields(line)
				if f[0] == "paused" {
					break
				}
				if f[0] == "end" {
					ends = append(ends, f[1])
					durations = append(durations, atoi(f[2]))
				}
			}
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()
			for line := range lines {
				if f := strings.Fields(line); f[0] == "end" {
					ends = append(ends, f[1])
				}
			}
			if !slices.Equal(ends, []string{first}) {
				t.Fatalf("kill %d, paused in the second transaction: the transactions that ended are %q, want only the first (%s): the kill was not in the middle of the second", i, ends, first)
			}
			before := first
			midway++
			got := mustReadKernelTable(t, conn, TableName("kill"))
			want := map[string]*kernelTable{"a": wantA, "b": wantB}[before]
			if diff := diffKernelTables(want, got); diff != "" {
				t.Fatalf("kill %d, in the middle of a transaction before its batch was sent: the table is not the state before it, %s (-before +kernel):\n%s", i, before, diff)
			}
			kept++
			last = before
			continue
		}
		cmd, lines := startKillHelper(t, ns, first, false, 0)
		// Kill it during its 1st to 3rd transaction: a third of the time
		// at a random moment after it began (mostly while the sink
		// computes it), else at a random moment within the time its
		// previous transactions took from their connection (made right
		// before the batch is sent) to their end: while the batch is
		// encoded, applied by the kernel in sendmsg(2), or answered.
		target, atSend := 1+r.IntN(3), r.IntN(3) != 0
		// before is the state the kernel holds when the target
		// transaction begins: the last one's before this process, then
		// that of each of its transactions that ended.
		begun, sent, ended, state, before := 0, false, false, "", last
		var sendToEnd time.Duration
		for (begun < target || (atSend && !sent)) && !ended {
			line, ok := <-lines
			if !ok {
				t.Fatalf("kill %d: the proxier exited before its transaction %d", i, target)
			}
			switch f := strings.Fields(line); f[0] {
			case "begin":
				begun, state = begun+1, f[1]
			case "send":
				sent = begun == target
			case "end":
				durations = append(durations, atoi(f[2]))
				var us int64
				fmt.Sscan(f[4], &us)
				sendToEnd = max(sendToEnd, time.Duration(us)*time.Microsecond)
				ended = begun == target // the target ended before its send was seen
				if !ended {
					before = f[1]
				}
			}
		}
		switch {
		case !atSend:
			time.Sleep(time.Duration(r.IntN(250)) * time.Millisecond)
		case sendToEnd > 0:
			time.Sleep(time.Duration(r.Int64N(int64(sendToEnd))))
			atBatch++
		default: // the first transaction: no measure yet
			time.Sleep(time.Duration(r.IntN(100)) * time.Millisecond)
			atBatch++
		}
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		// What the process printed before it died: the target's end,
		// even the next transaction's begin and end when the kill came
		// late.
		for line := range lines {
			switch f := strings.Fields(line); f[0] {
			case "begin":
				state = f[1]
			case "end":
				ended, before = true, f[1]
				durations = append(durations, atoi(f[2]))
			}
		}
		if !ended {
			midway++
		}
		got := mustReadKernelTable(t, conn, TableName("kill"))
		gotState := ""
		switch {
		case got == nil:
			gotState = "none"
		case diffKernelTables(wantA, got) == "":
			gotState = "a"
		case diffKernelTables(wantB, got) == "":
			gotState = "b"
		default:
			t.Fatalf("kill %d: the table is neither the first state nor the second (-first +kernel):\n%s", i, diffKernelTables(wantA, got))
		}
		// The kernel holds the last state a transaction ended with, or
		// the one of the transaction in progress (applied, the process
		// killed before it said so).
		switch {
		case gotState == before && ended:
			// Killed once the transaction had ended.
		case gotState == state:
			replaced++
		case gotState == before:
			kept++
		default:
			t.Errorf("kill %d: the table is %s, neither the state of the last transaction that ended (%s) nor that of the one in progress (%s)", i, gotState, before, state)
		}
		last = gotState
	}
	var median, fastest, slowest int
	if n := len(durations); n > 0 {
		slices.Sort(durations)
		median, fastest, slowest = durations[n/2], durations[0], durations[n-1]
	}
	t.Logf("%d kills in %v, %d between a transaction's begin and its end (%d of them paused there; %d of all after its batch was encoded or sent): of these, %d left the state before the transaction, %d the new one, never a mix (the %d transactions that ended took %d ms in the sink at the median, %d-%d)",
		kills, time.Since(start).Round(time.Millisecond), midway, paused, atBatch, kept, replaced, len(durations), median, fastest, slowest)
	if midway < paused {
		t.Errorf("%d kills in the middle of a transaction, want at least the %d paused there", midway, paused)
	}

	// A proxier started after the kills converges.
	cmd, lines := startKillHelper(t, ns, "b", true, 0)
	for range lines {
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the last proxier: %v", err)
	}
	if diff := diffKernelTables(wantB, mustReadKernelTable(t, conn, TableName("kill"))); diff != "" {
		t.Fatalf("after a clean run (-fresh +kernel):\n%s", diff)
	}
}

// atoi returns the number s, 0 if it is none.
func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// startKillHelper starts killHelper in ns and returns its process and
// the lines it prints (closed when it exits); pause > 0 stops it in that
// transaction (killHelper).
func startKillHelper(t *testing.T, ns *netns.NS, first string, once bool, pause int) (*exec.Cmd, <-chan string) {
	t.Helper()
	env := []string{killHelperEnv + "=" + ns.Path(), "KPNG_NFT_KILL_FIRST=" + first, "KPNG_NFT_KILL_PAUSE=" + strconv.Itoa(pause)}
	if once {
		env = append(env, "KPNG_NFT_KILL_ONCE=1")
	}
	return selfexec.Start(t, env, false)
}
