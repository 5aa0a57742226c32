// Package callout runs a program, the callout, on each new state of a kpng
// backend, with the state on the program's standard input.
//
// A Runner decouples the producer of states (kpng's watcher, which must
// never be blocked) from the callout, which may be slow, fail or hang:
// Submit stores the state in a one-slot mailbox and returns at once, and Run
// executes the callout for the latest state, one run at a time. States
// submitted while the callout runs coalesce (only the latest is run next);
// failures are retried with exponential backoff; a run that exceeds its
// timeout is killed together with every process it started.
package callout

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"k8s.io/klog/v2"
)

// Defaults for the Config fields, used by kpng-callout's flags.
const (
	DefaultTimeout     = 30 * time.Second
	DefaultRetryMin    = time.Second
	DefaultRetryMax    = 30 * time.Second
	DefaultStderrLimit = 4 << 10
)

// waitDelay bounds how long a run waits, once the callout has exited or
// been killed, for the processes it left behind to close its standard output
// and error (see exec.Cmd.WaitDelay).
const waitDelay = 2 * time.Second

// Config configures a Runner.
type Config struct {
	// Command is the callout: the program (looked up in $PATH when it has
	// no slash) and its arguments, as returned by Split. Required.
	Command []string
	// Timeout bounds one run. A callout still running after Timeout is
	// killed with SIGKILL, with its whole process group (the children it
	// started, unless they left the group), and the run counts as failed.
	// Required (> 0).
	Timeout time.Duration
	// RetryMin is the delay after a first failure; each further
	// consecutive failure doubles it, up to RetryMax. A success resets it.
	// Both are required (0 < RetryMin <= RetryMax).
	RetryMin, RetryMax time.Duration
	// Once makes Run return after the first submitted state: nil once the
	// callout has succeeded for it, an error after MaxAttempts failed
	// attempts.
	Once bool
	// MaxAttempts bounds the attempts in Once mode; 0 means no bound. It
	// is ignored without Once, where a failing state is retried until it
	// succeeds or a newer state replaces it.
	MaxAttempts int
	// Stdout receives the callout's standard output; nil discards it.
	Stdout io.Writer
	// Stderr receives the callout's standard error as it is written; nil
	// discards it. Either way its last StderrLimit bytes are kept for the
	// log line of a failed run.
	Stderr io.Writer
	// StderrLimit is how much of the callout's standard error a failure's
	// log line holds (its end); 0 means DefaultStderrLimit.
	StderrLimit int
	// Logger receives the runner's log lines; the zero value means
	// klog.Background(), i.e. klog's global logger.
	Logger klog.Logger
	// Observe, if set, is called after each run of the callout, from
	// Run's goroutine, with its outcome: for metrics.
	Observe func(Outcome)
}

// Outcome is what one run of the callout came to.
type Outcome struct {
	// Duration is how long the run took.
	Duration time.Duration
	// Err is nil when the callout succeeded.
	Err error
	// TimedOut is set when the callout was killed after Config.Timeout.
	TimedOut bool
	// Submitted is when the state the callout ran on was submitted: a
	// success applies the states submitted up to then (the older ones
	// were replaced by it), for health (metrics.Recorder.Applied).
	Submitted time.Time
}

// submission is a state and when it was submitted.
type submission struct {
	state []byte
	at    time.Time
}

// Runner runs the callout for the latest submitted state. Create it with
// NewRunner, feed it with Submit from any goroutine, and call Run once.
type Runner struct {
	cfg     Config
	log     klog.Logger
	box     *mailbox[submission]
	started atomic.Bool
}

// NewRunner checks cfg and returns a Runner for it.
func NewRunner(cfg Config) (*Runner, error) {
	switch {
	case len(cfg.Command) == 0 || cfg.Command[0] == "":
		return nil, errors.New("callout: no command")
	case cfg.Timeout <= 0:
		return nil, fmt.Errorf("callout: timeout %v is not positive", cfg.Timeout)
	case cfg.RetryMin <= 0:
		return nil, fmt.Errorf("callout: minimum retry delay %v is not positive", cfg.RetryMin)
	case cfg.RetryMax < cfg.RetryMin:
		return nil, fmt.Errorf("callout: maximum retry delay %v is less than the minimum %v", cfg.RetryMax, cfg.RetryMin)
	case cfg.MaxAttempts < 0:
		return nil, fmt.Errorf("callout: negative number of attempts %d", cfg.MaxAttempts)
	case cfg.StderrLimit < 0:
		return nil, fmt.Errorf("callout: negative stderr limit %d", cfg.StderrLimit)
	}
	if cfg.StderrLimit == 0 {
		cfg.StderrLimit = DefaultStderrLimit
	}
	cfg.Command = append([]string(nil), cfg.Command...)
	log := cfg.Logger
	if log.GetSink() == nil {
		log = klog.Background()
	}
	return &Runner{cfg: cfg, log: log, box: newMailbox[submission]()}, nil
}

// Submit hands a state to the runner: the bytes the callout reads on its
// standard input (an empty state runs the callout with an empty input). It
// never blocks: a state that has not started running yet is replaced by
// the new one. state must not be modified afterwards. The time of the call
// is the Outcome.Submitted of the runs on state.
func (r *Runner) Submit(state []byte) {
	r.box.put(submission{state: state, at: time.Now()})
}

// Run executes the callout for the submitted states until ctx is done,
// one run at a time and always for the latest state:
//
//   - after a success, it waits for the next state;
//   - after a failure (non-zero exit, timeout, or a program that cannot
//     start), it logs the exit status and the end of the callout's stderr,
//     waits the backoff delay, then runs the latest state again: the newest
//     submitted one if any, else the one that failed;
//   - when ctx is done, it kills the running callout's process group,
//     waits for it to exit and returns.
//
// Without Config.Once it returns nil when ctx is done. With Once it
// returns nil once the callout succeeded for the first state, an error
// after Config.MaxAttempts failed attempts, or an error wrapping ctx's
// error when ctx is done first. Run may be called only once.
func (r *Runner) Run(ctx context.Context) error {
	if !r.started.CompareAndSwap(false, true) {
		return errors.New("callout: Runner.Run called more than once")
	}
	var (
		state    submission
		pending  bool          // state still has to succeed
		failures int           // consecutive failed attempts
		delay    time.Duration // the last backoff delay; 0 after a success
	)
	for {
		if !pending {
			select {
			case <-ctx.Done():
				return r.stopped(ctx)
			case <-r.box.wait():
			}
			state, pending = r.box.take()
			if !pending {
				continue
			}
		}

		res := r.runOnce(ctx, state.state)
		// A run killed because ctx ended is no outcome of the callout.
		if r.cfg.Observe != nil && (res.err == nil || ctx.Err() == nil) {
			r.cfg.Observe(Outcome{Duration: res.duration, Err: res.err, TimedOut: res.timedOut, Submitted: state.at})
		}
		if ctx.Err() != nil {
			return r.stopped(ctx)
		}
		if res.err == nil {
			if failures > 0 {
				r.log.Info("Callout succeeded after failures", "failures", failures, "duration", res.duration)
			} else {
				r.log.V(2).Info("Callout succeeded", "duration", res.duration, "stdinBytes", len(state.state))
			}
			failures, delay, pending = 0, 0, false
			if r.cfg.Once {
				return nil
			}
			continue
		}

		failures++
		kv := []any{"command", r.cfg.Command[0], "exitStatus", res.exitStatus, "stderr", res.stderr,
			"duration", res.duration, "failures", failures}
		if r.cfg.Once && r.cfg.MaxAttempts > 0 && failures >= r.cfg.MaxAttempts {
			r.log.Error(res.err, "Callout failed, giving up", kv...)
			return fmt.Errorf("callout failed %d times, giving up: %w", failures, res.err)
		}
		delay = r.nextDelay(delay)
		r.log.Error(res.err, "Callout failed, will retry", append(kv, "retryIn", delay)...)
		if !sleep(ctx, delay) {
			return r.stopped(ctx)
		}
		if newer, ok := r.box.take(); ok {
			r.log.V(2).Info("Running a newer state instead of retrying the failed one")
			state = newer
		}
	}
}

// stopped is Run's result when ctx is done.
func (r *Runner) stopped(ctx context.Context) error {
	if r.cfg.Once {
		return fmt.Errorf("callout: stopped before the callout succeeded: %w", context.Cause(ctx))
	}
	return nil
}

// nextDelay returns the backoff delay that follows prev (0: none yet).
func (r *Runner) nextDelay(prev time.Duration) time.Duration {
	if prev <= 0 {
		return r.cfg.RetryMin
	}
	if prev >= r.cfg.RetryMax/2 {
		return r.cfg.RetryMax
	}
	return 2 * prev
}

// sleep waits for d, and reports false if ctx was done first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// result is the outcome of one run of the callout.
type result struct {
	// err is nil on success.
	err error
	// exitStatus is the callout's exit status, -1 when it was killed by a
	// signal or did not start.
	exitStatus int
	// stderr is the end of what the callout wrote on its standard error.
	stderr   string
	duration time.Duration
	// timedOut is set when the callout was killed after the timeout.
	timedOut bool
}

// runOnce runs the callout once with state on its standard input, killing
// its process group when the timeout expires or ctx is done.
func (r *Runner) runOnce(ctx context.Context, state []byte) result {
	// The run starts before its timeout's clock does: a run killed at
	// the timeout lasted at least the timeout (a preemption between the
	// two once made a killed run's duration 998 ms of a 1 s timeout, and
	// TestRunnerKillsHangingCalloutAndItsChildren failed).
	start := time.Now()
	runCtx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	cmd := exec.CommandContext(runCtx, r.cfg.Command[0], r.cfg.Command[1:]...)
	cmd.Stdin = bytes.NewReader(state)
	cmd.Stdout = r.cfg.Stdout
	stderr := &tailBuffer{limit: r.cfg.StderrLimit}
	cmd.Stderr = &teeWriter{keep: stderr, pass: r.cfg.Stderr}
	inNewProcessGroup(cmd)
	cmd.Cancel = func() error { return killProcessGroup(cmd) }
	cmd.WaitDelay = waitDelay

	err := cmd.Run()
	res := result{exitStatus: -1, duration: time.Since(start)}
	if cmd.ProcessState != nil {
		res.exitStatus = cmd.ProcessState.ExitCode()
	}
	res.stderr = stderr.String()
	switch {
	case err == nil:
	case errors.Is(err, exec.ErrWaitDelay) && cmd.ProcessState != nil && cmd.ProcessState.Success():
		// The callout succeeded, but processes it started kept its
		// output open: no longer wait for them.
		r.log.Info("Callout exited successfully but left processes holding its output open; not waiting for them",
			"command", r.cfg.Command[0], "waited", waitDelay)
	case ctx.Err() == nil && errors.Is(runCtx.Err(), context.DeadlineExceeded):
		res.timedOut = true
		res.err = fmt.Errorf("callout %s timed out after %v and was killed: %w", r.cfg.Command[0], r.cfg.Timeout, err)
	default:
		res.err = fmt.Errorf("callout %s: %w", r.cfg.Command[0], err)
	}
	return res
}

// teeWriter writes to keep, and to pass when it is not nil, ignoring pass's
// errors: a broken pass-through must not make the callout fail.
type teeWriter struct {
	keep io.Writer
	pass io.Writer
}

// Write implements io.Writer.
func (t *teeWriter) Write(p []byte) (int, error) {
	if t.pass != nil {
		_, _ = t.pass.Write(p)
	}
	return t.keep.Write(p)
}

// tailBuffer keeps the last limit bytes written to it. It is not safe for
// concurrent use (exec.Cmd writes a stream from one goroutine, and Run
// reads it after Wait).
type tailBuffer struct {
	limit   int
	buf     []byte
	dropped int64
}

// Write implements io.Writer; it never fails.
func (b *tailBuffer) Write(p []byte) (int, error) {
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.limit; over > b.limit { // compact rarely
		b.dropped += int64(over)
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

// String returns the last limit bytes (starting at a character boundary),
// preceded by a note of how much was dropped, if anything was.
func (b *tailBuffer) String() string {
	tail, dropped := b.buf, b.dropped
	if over := len(tail) - b.limit; over > 0 {
		tail, dropped = tail[over:], dropped+int64(over)
	}
	for len(tail) > 0 && dropped > 0 && !utf8.RuneStart(tail[0]) {
		tail, dropped = tail[1:], dropped+1
	}
	if dropped == 0 {
		return string(tail)
	}
	return fmt.Sprintf("[%d bytes dropped]...%s", dropped, tail)
}
