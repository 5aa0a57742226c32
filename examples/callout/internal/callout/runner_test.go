package callout

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/klog/v2/textlogger"

	"sigs.k8s.io/kpng/internal/proc"
	"sigs.k8s.io/kpng/internal/testio"
)

// patience bounds every wait for something that should happen promptly; it
// is a failure limit, not an assertion on timing.
const patience = 10 * time.Second

// script writes a bash script with body to a fresh directory and returns
// its path.
func script(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "callout.sh")
	if err := os.WriteFile(path, []byte("#!/bin/bash\nset -u\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// lineWriter sends each complete line written to it on lines.
type lineWriter struct {
	mu      sync.Mutex
	partial []byte
	lines   chan string
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.partial = append(w.partial, p...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			return len(p), nil
		}
		select {
		case w.lines <- string(w.partial[:i]):
		default:
			return 0, errors.New("lineWriter: test not reading lines")
		}
		w.partial = w.partial[i+1:]
	}
}

// harness runs a Runner in the background and collects its output.
type harness struct {
	t       *testing.T
	r       *Runner
	lines   chan string        // the callout's stdout, line by line
	log     *testio.SyncBuffer // the runner's log
	cancel  context.CancelFunc
	done    chan error // Run's result
	stopped bool
	err     error
	leaks   func()
}

// start creates a Runner for cfg (filling in Stdout, Logger and, when
// unset, fast retries) and runs it until the test ends or h.stop.
func start(t *testing.T, cfg Config) *harness {
	t.Helper()
	h := &harness{t: t, lines: make(chan string, 10000), log: &testio.SyncBuffer{}, done: make(chan error, 1)}
	h.leaks = goroutineCheck(t)
	cfg.Stdout = &lineWriter{lines: h.lines}
	cfg.Logger = textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(h.log), textlogger.Verbosity(2)))
	if cfg.Timeout == 0 {
		cfg.Timeout = time.Hour
	}
	if cfg.RetryMin == 0 {
		cfg.RetryMin, cfg.RetryMax = 10*time.Millisecond, 40*time.Millisecond
	}
	r, err := NewRunner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.r = r
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { h.done <- r.Run(ctx) }()
	t.Cleanup(func() {
		h.stop()
		if t.Failed() {
			t.Logf("runner log:\n%s", h.log.String())
		}
	})
	return h
}

// next returns the callout's next line of output.
func (h *harness) next() string {
	h.t.Helper()
	select {
	case l := <-h.lines:
		return l
	case <-time.After(patience):
		h.t.Fatalf("no output from the callout within %v", patience)
		return ""
	}
}

// expect checks the callout's next lines.
func (h *harness) expect(want ...string) {
	h.t.Helper()
	for _, w := range want {
		if got := h.next(); got != w {
			h.t.Fatalf("callout printed %q, want %q", got, w)
		}
	}
}

// wait waits for Run to return by itself.
func (h *harness) wait() error {
	h.t.Helper()
	select {
	case h.err = <-h.done:
		h.stopped = true
		h.cancel()
		h.leaks()
		return h.err
	case <-time.After(patience):
		h.t.Fatalf("Run did not return within %v", patience)
		return nil
	}
}

// stop cancels Run's context, checks that Run returns promptly and that no
// goroutine is left behind, and returns Run's result.
func (h *harness) stop() error {
	h.t.Helper()
	if h.stopped {
		return h.err
	}
	h.stopped = true
	h.cancel()
	select {
	case h.err = <-h.done:
	case <-time.After(patience):
		h.t.Errorf("Run did not return within %v of its context being cancelled", patience)
		return nil
	}
	h.leaks()
	return h.err
}

// goroutineCheck records the number of goroutines, and returns a function
// that fails the test when that number is not reached again (goroutines
// that end asynchronously get a little time), printing the stacks.
func goroutineCheck(t *testing.T) func() {
	base := runtime.NumGoroutine()
	return func() {
		t.Helper()
		deadline := time.Now().Add(patience)
		for runtime.NumGoroutine() > base {
			if time.Now().After(deadline) {
				var stacks strings.Builder
				_ = pprof.Lookup("goroutine").WriteTo(&stacks, 1)
				t.Errorf("goroutine leak: %d goroutines, %d before the runner started:\n%s", runtime.NumGoroutine(), base, stacks.String())
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// expectGone fails the test unless the processes exit promptly (a killed
// orphan is reaped by init asynchronously).
func expectGone(t *testing.T, pids ...int) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for _, pid := range pids {
		for proc.Alive(pid) {
			if time.Now().After(deadline) {
				t.Errorf("process %d is still running", pid)
				_ = syscall.Kill(pid, syscall.SIGKILL)
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// pids parses "label:pid pid..." lines.
func pids(t *testing.T, line, label string) []int {
	t.Helper()
	rest, ok := strings.CutPrefix(line, label+":")
	if !ok {
		t.Fatalf("callout printed %q, want %s:<pids>", line, label)
	}
	var out []int
	for _, f := range strings.Fields(rest) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("callout printed %q: %v", line, err)
		}
		out = append(out, pid)
	}
	return out
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestRunnerDeliversEachState(t *testing.T) {
	out := filepath.Join(t.TempDir(), "states")
	sh := script(t, `cat >> "$1"; echo -- >> "$1"; echo ran`)
	h := start(t, Config{Command: []string{sh, out}})

	states := []string{"{\"a\":1}\n", "{\"b\":2}\n{\"c\":3}\n", "", "no newline"}
	var want strings.Builder
	for _, s := range states {
		h.r.Submit([]byte(s))
		h.expect("ran")
		want.WriteString(s + "--\n")
	}
	h.r.Submit(nil) // nil is the empty state too
	h.expect("ran")
	want.WriteString("--\n")
	if err := h.stop(); err != nil {
		t.Errorf("Run = %v, want nil after cancel", err)
	}
	if got := readFile(t, out); got != want.String() {
		t.Errorf("the callout read\n%q\nwant\n%q", got, want.String())
	}
}

func TestRunnerCoalescesStatesWhileTheCalloutRuns(t *testing.T) {
	dir := t.TempDir()
	fifo, runs := filepath.Join(dir, "gate"), filepath.Join(dir, "runs")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// State 1 blocks until the test writes a line to the fifo.
	sh := script(t, `state=$(cat)
echo "$state" >> "$2"
echo "start:$state"
if [ "$state" = 1 ]; then read -r _ < "$1"; fi
echo "done:$state"`)
	h := start(t, Config{Command: []string{sh, fifo, runs}})

	h.r.Submit([]byte("1"))
	h.expect("start:1")
	for i := 2; i <= 10; i++ {
		h.r.Submit([]byte(strconv.Itoa(i)))
	}
	release(t, fifo)
	h.expect("done:1", "start:10", "done:10")
	// Had an intermediate state run, it would show before this one.
	h.r.Submit([]byte("11"))
	h.expect("start:11", "done:11")
	h.stop()
	if got, want := readFile(t, runs), "1\n10\n11\n"; got != want {
		t.Errorf("the callout ran for states %q, want %q", got, want)
	}
}

// release writes a line to fifo, unblocking the callout that reads it.
func release(t *testing.T, fifo string) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		f, err := os.OpenFile(fifo, os.O_WRONLY, 0) // blocks until the callout opens it
		if err == nil {
			_, err = f.WriteString("go\n")
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(patience):
		t.Fatal("the callout never opened the fifo")
	}
}

func TestRunnerRetriesFailuresWithBackoff(t *testing.T) {
	dir := t.TempDir()
	count, times := filepath.Join(dir, "count"), filepath.Join(dir, "times")
	// Attempts 1, 2, 3 and 5 fail with status 7.
	sh := script(t, `cat > /dev/null
n=$(( $(cat "$1" 2>/dev/null || echo 0) + 1 ))
echo $n > "$1"
date +%s%N >> "$2"
case $n in 1|2|3|5) echo "boom $n" >&2; exit 7;; esac
echo "ok:$n"`)
	const min, max = 50 * time.Millisecond, 120 * time.Millisecond
	var stderr testio.SyncBuffer
	h := start(t, Config{Command: []string{sh, count, times}, RetryMin: min, RetryMax: max, Stderr: &stderr})

	h.r.Submit([]byte("x"))
	h.expect("ok:4")
	h.r.Submit([]byte("y"))
	h.expect("ok:6")
	h.stop()

	log := h.log.String()
	failures := regexp.MustCompile(`"Callout failed, will retry" err="callout \S+: exit status 7" command="\S+" exitStatus=7 stderr=<\s+boom (\d)\s+> duration="[^"]+" failures=(\d) retryIn="(\w+)"`).
		FindAllStringSubmatch(log, -1)
	var got []string
	for _, f := range failures {
		got = append(got, fmt.Sprintf("boom %s failures=%s retryIn=%s", f[1], f[2], f[3]))
	}
	want := []string{
		"boom 1 failures=1 retryIn=50ms",
		"boom 2 failures=2 retryIn=100ms",
		"boom 3 failures=3 retryIn=120ms", // capped at --retry-max
		"boom 5 failures=1 retryIn=50ms",  // the success reset the backoff
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("failure log lines:\n%s\nwant:\n%s\nlog:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"), log)
	}
	if !strings.Contains(log, `"Callout succeeded after failures" failures=3`) {
		t.Errorf("no log of the recovery after 3 failures:\n%s", log)
	}
	if got, want := stderr.String(), "boom 1\nboom 2\nboom 3\nboom 5\n"; got != want {
		t.Errorf("stderr passed through = %q, want %q", got, want)
	}

	// The attempts are at least the backoff delay apart.
	var starts []time.Time
	for _, l := range strings.Fields(readFile(t, times)) {
		ns, err := strconv.ParseInt(l, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		starts = append(starts, time.Unix(0, ns))
	}
	if len(starts) != 6 {
		t.Fatalf("%d attempts, want 6", len(starts))
	}
	for i, d := range []time.Duration{min, 2 * min, max, 0, min} {
		if gap := starts[i+1].Sub(starts[i]); gap < d {
			t.Errorf("attempt %d started %v after attempt %d, want at least %v", i+2, gap, i+1, d)
		}
	}
}

func TestRunnerNewerStateSupersedesFailingOne(t *testing.T) {
	sh := script(t, `state=$(cat); echo "start:$state"; [ "$state" != bad ] || { echo "bad state" >&2; exit 3; }`)
	const delay = 200 * time.Millisecond
	h := start(t, Config{Command: []string{sh}, RetryMin: delay, RetryMax: delay})

	h.r.Submit([]byte("bad"))
	h.expect("start:bad")
	started := time.Now()
	h.r.Submit([]byte("good"))
	h.expect("start:good")
	if gap := time.Since(started); gap < delay {
		t.Errorf("the newer state ran %v after the failure, want after the backoff delay %v", gap, delay)
	}
	h.r.Submit([]byte("good2")) // the bad state is not retried before this one
	h.expect("start:good2")
	h.stop()
	if n := strings.Count(h.log.String(), `"Callout failed`); n != 1 {
		t.Errorf("%d failures logged, want 1:\n%s", n, h.log.String())
	}
}

func TestRunnerKillsHangingCalloutAndItsChildren(t *testing.T) {
	count := filepath.Join(t.TempDir(), "count")
	// The first attempt hangs with a child; the retry succeeds.
	sh := script(t, `cat > /dev/null
n=$(( $(cat "$1" 2>/dev/null || echo 0) + 1 ))
echo $n > "$1"
if [ $n = 1 ]; then
	sleep 1000 &
	echo "pids:$$ $!"
	wait
fi
echo "ok:$n"`)
	// The retry must finish within the timeout too: 300 ms was too short
	// for a shell on a loaded 2-core machine (the retry was killed).
	const timeout = time.Second
	var mu sync.Mutex
	var outcomes []Outcome
	h := start(t, Config{Command: []string{sh, count}, Timeout: timeout, Observe: func(o Outcome) {
		mu.Lock()
		defer mu.Unlock()
		outcomes = append(outcomes, o)
	}})

	submitting := time.Now()
	h.r.Submit([]byte("x"))
	started := time.Now()
	hung := pids(t, h.next(), "pids")
	h.expect("ok:2")
	if took := time.Since(started); took < timeout {
		t.Errorf("the retry came %v after the hanging run started, before the %v timeout", took, timeout)
	}
	expectGone(t, hung...)
	// The output comes before the callout exits: wait for its outcome.
	for deadline := time.Now().Add(patience); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		mu.Lock()
		n := len(outcomes)
		mu.Unlock()
		if n == 2 {
			break
		}
	}
	h.stop()
	mu.Lock()
	if len(outcomes) != 2 || !outcomes[0].TimedOut || outcomes[0].Err == nil || outcomes[0].Duration < timeout || outcomes[1].TimedOut || outcomes[1].Err != nil {
		t.Errorf("outcomes %+v, want a timeout of at least %v, then a success", outcomes, timeout)
	}
	// Both runs were on the state submitted once, and say when.
	for _, o := range outcomes {
		if o.Submitted.Before(submitting) || o.Submitted.After(started) {
			t.Errorf("outcome %+v: Submitted is not the time of Submit, between %v and %v", o, submitting, started)
		}
	}
	mu.Unlock()
	log := h.log.String()
	if !regexp.MustCompile(`"Callout failed, will retry" err="callout \S+ timed out after 1s and was killed: signal: killed" command="\S+" exitStatus=-1 stderr="" duration="[^"]+" failures=1 retryIn="10ms"`).MatchString(log) {
		t.Errorf("no log of the timeout:\n%s", log)
	}
}

func TestRunnerSubmitNeverBlocks(t *testing.T) {
	sh := script(t, `cat > /dev/null; echo started; sleep 1000`)
	h := start(t, Config{Command: []string{sh}})
	h.r.Submit([]byte("first"))
	h.expect("started")
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 100000 {
			h.r.Submit([]byte(strconv.Itoa(i)))
		}
	}()
	select {
	case <-done:
	case <-time.After(patience):
		t.Fatal("Submit blocked while the callout hangs")
	}
	if err := h.stop(); err != nil {
		t.Errorf("Run = %v, want nil", err)
	}
}

func TestRunnerStopKillsRunningCallout(t *testing.T) {
	for _, once := range []bool{false, true} {
		t.Run(fmt.Sprintf("once=%v", once), func(t *testing.T) {
			sh := script(t, `cat > /dev/null; sleep 1000 & echo "pids:$$ $!"; wait`)
			h := start(t, Config{Command: []string{sh}, Once: once})
			h.r.Submit([]byte("x"))
			running := pids(t, h.next(), "pids")
			err := h.stop() // fails the test unless Run returns promptly, without leaks
			switch {
			case !once && err != nil:
				t.Errorf("Run = %v, want nil", err)
			case once && !errors.Is(err, context.Canceled):
				t.Errorf("Run = %v, want an error wrapping context.Canceled", err)
			}
			expectGone(t, running...)
		})
	}
}

func TestRunnerStopWhileIdleOrBackingOff(t *testing.T) {
	t.Run("idle", func(t *testing.T) {
		h := start(t, Config{Command: []string{"true"}})
		if err := h.stop(); err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
	})
	t.Run("backing off", func(t *testing.T) {
		sh := script(t, `echo failed; exit 1`)
		h := start(t, Config{Command: []string{sh}, RetryMin: time.Hour, RetryMax: time.Hour})
		h.r.Submit(nil)
		h.expect("failed")
		if err := h.stop(); err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
	})
}

func TestRunnerOnce(t *testing.T) {
	t.Run("success", func(t *testing.T) {
		h := start(t, Config{Command: []string{"cat"}, Once: true, MaxAttempts: 3})
		h.r.Submit([]byte("state\n"))
		h.expect("state")
		if err := h.wait(); err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
	})
	t.Run("gives up", func(t *testing.T) {
		count := filepath.Join(t.TempDir(), "count")
		sh := script(t, `n=$(( $(cat "$1" 2>/dev/null || echo 0) + 1 )); echo $n > "$1"; echo "try $n" >&2; exit 3`)
		h := start(t, Config{Command: []string{sh, count}, Once: true, MaxAttempts: 3})
		h.r.Submit([]byte("state"))
		err := h.wait()
		if err == nil || !strings.Contains(err.Error(), "callout failed 3 times, giving up") || !strings.Contains(err.Error(), "exit status 3") {
			t.Errorf("Run = %v, want an error after 3 failures with exit status 3", err)
		}
		if got := strings.TrimSpace(readFile(t, count)); got != "3" {
			t.Errorf("%s attempts, want 3", got)
		}
		log := h.log.String()
		if !strings.Contains(log, `"Callout failed, giving up"`) || strings.Count(log, `"Callout failed, will retry"`) != 2 || !strings.Contains(log, "try 3") {
			t.Errorf("want two retries then giving up with the last stderr in the log:\n%s", log)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		sh := script(t, `sleep 1000 & echo "pids:$$ $!"; wait`)
		h := start(t, Config{Command: []string{sh}, Once: true, MaxAttempts: 1, Timeout: 200 * time.Millisecond})
		h.r.Submit(nil)
		running := pids(t, h.next(), "pids")
		if err := h.wait(); err == nil || !strings.Contains(err.Error(), "timed out after 200ms") {
			t.Errorf("Run = %v, want a timeout error", err)
		}
		expectGone(t, running...)
	})
}

func TestRunnerLogsEndOfLongStderr(t *testing.T) {
	// 1000 lines of 10 bytes, 10000 bytes, then "the end".
	sh := script(t, `for i in $(seq 1000 1999); do echo "line $i" >&2; done; echo "the end" >&2; exit 1`)
	var stderr testio.SyncBuffer
	h := start(t, Config{Command: []string{sh}, Once: true, MaxAttempts: 1, Stderr: &stderr})
	h.r.Submit(nil)
	if err := h.wait(); err == nil {
		t.Fatal("Run = nil, want an error")
	}
	if got := stderr.String(); len(got) != 10008 || !strings.HasPrefix(got, "line 1000\n") {
		t.Errorf("stderr passed through: %d bytes starting %q, want all 10008", len(got), got[:min(len(got), 20)])
	}
	log := h.log.String()
	if !strings.Contains(log, "[5912 bytes dropped]...") || !strings.Contains(log, "line 1999") || !strings.Contains(log, "the end") || strings.Contains(log, "line 1000") {
		t.Errorf("the log should hold the last 4096 bytes of stderr:\n%s", log)
	}
}

func TestRunnerCommandThatCannotStart(t *testing.T) {
	h := start(t, Config{Command: []string{filepath.Join(t.TempDir(), "missing")}, Once: true, MaxAttempts: 2})
	h.r.Submit(nil)
	err := h.wait()
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Run = %v, want a not-exist error", err)
	}
}

func TestRunnerRunTwice(t *testing.T) {
	r, err := NewRunner(Config{Command: []string{"true"}, Timeout: time.Second, RetryMin: time.Second, RetryMax: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.Run(ctx); err != nil {
		t.Errorf("Run with a cancelled context = %v, want nil", err)
	}
	if err := r.Run(ctx); err == nil {
		t.Error("a second Run returned nil, want an error")
	}
}

func TestNewRunnerRejectsBadConfig(t *testing.T) {
	ok := Config{Command: []string{"true"}, Timeout: time.Second, RetryMin: time.Second, RetryMax: time.Second}
	if _, err := NewRunner(ok); err != nil {
		t.Fatalf("NewRunner(%+v): %v", ok, err)
	}
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"no command", func(c *Config) { c.Command = nil }, "no command"},
		{"empty program", func(c *Config) { c.Command = []string{""} }, "no command"},
		{"no timeout", func(c *Config) { c.Timeout = 0 }, "timeout 0s is not positive"},
		{"no retry-min", func(c *Config) { c.RetryMin = 0 }, "minimum retry delay 0s is not positive"},
		{"retry-max < retry-min", func(c *Config) { c.RetryMax = time.Millisecond }, "maximum retry delay 1ms is less than the minimum 1s"},
		{"negative attempts", func(c *Config) { c.MaxAttempts = -1 }, "negative number of attempts"},
		{"negative stderr limit", func(c *Config) { c.StderrLimit = -1 }, "negative stderr limit"},
	} {
		cfg := ok
		tc.mod(&cfg)
		if _, err := NewRunner(cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: NewRunner = %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

func TestMailboxKeepsTheLatest(t *testing.T) {
	m := newMailbox[[]byte]()
	if _, ok := m.take(); ok {
		t.Error("a new mailbox is not empty")
	}
	m.put([]byte("1"))
	m.put([]byte("2"))
	select {
	case <-m.wait():
	default:
		t.Fatal("no token after put")
	}
	if v, ok := m.take(); !ok || string(v) != "2" {
		t.Errorf("take = %q, %v; want the latest, 2", v, ok)
	}
	if v, ok := m.take(); ok {
		t.Errorf("take after take = %q, want empty", v)
	}
	m.put(nil)
	if v, ok := m.take(); !ok || v != nil {
		t.Errorf("take = %q, %v; want the empty state", v, ok)
	}
}

func TestTailBuffer(t *testing.T) {
	for _, tc := range []struct {
		limit  int
		writes []string
		want   string
	}{
		{10, nil, ""},
		{10, []string{"short"}, "short"},
		{10, []string{"exactly10!"}, "exactly10!"},
		{10, []string{"0123456789", "abc"}, "[3 bytes dropped]...3456789abc"},
		{4, []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"}, "[6 bytes dropped]...ghij"},
		{4, []string{"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", "end!"}, "[30 bytes dropped]...end!"},
		// never starts in the middle of a character: é is 2 bytes
		{4, []string{"aébcd"}, "[3 bytes dropped]...bcd"},
	} {
		b := &tailBuffer{limit: tc.limit}
		for _, w := range tc.writes {
			if n, err := b.Write([]byte(w)); n != len(w) || err != nil {
				t.Fatalf("Write = %d, %v", n, err)
			}
		}
		if got := b.String(); got != tc.want {
			t.Errorf("limit %d, writes %q: %q, want %q", tc.limit, tc.writes, got, tc.want)
		}
	}
}
