// Command kpng-callout runs a program, the callout, each time the state of
// the services of one service-proxy-name changes, with the state on the
// program's standard input in kpng-json's format: one JSON object per
// service, each followed by a newline (an empty state is an empty input).
// It is the "minor variation of kpng-json" of kpng's blog post:
//
//	CALLOUT=jq kpng-callout --service-proxy-name=kpng-example
//
// $CALLOUT is the program and its arguments, split like a shell splits
// words but run without a shell (see callout.Split). States that arrive
// while the callout runs coalesce, failures are retried with backoff, and a
// callout running longer than --timeout is killed; /healthz and /livez
// follow the callout's success (a state is applied when a run on it, or
// on a newer one, succeeds); see README.md.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/client"
	"sigs.k8s.io/kpng/client/metrics"
	"sigs.k8s.io/kpng/examples/callout/internal/callout"
	"sigs.k8s.io/kpng/localsink"
)

// name is the program name used in messages.
const name = "kpng-callout"

func main() {
	os.Exit(run(os.Args[1:], os.Getenv("CALLOUT"), os.Stdout, os.Stderr))
}

// options are kpng-callout's own flags.
type options struct {
	callout      callout.Config
	onceAttempts int
}

// run is main without the exit: it parses args, runs the callout given in
// calloutEnv (the value of $CALLOUT) on each state until SIGINT or SIGTERM
// (or, with --once, for the first state) and returns the exit status: 0 on
// a clean stop or a successful --once, 1 when the callout never succeeded
// with --once, 2 with a one-line message on stderr for bad flags, $CALLOUT
// or configuration.
func run(args []string, calloutEnv string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	var kpng client.Flags
	kpng.Bind(fs)
	var o options
	fs.DurationVar(&o.callout.Timeout, "timeout", callout.DefaultTimeout, "kill the callout (and its process group) when one run takes longer; the run counts as failed")
	fs.DurationVar(&o.callout.RetryMin, "retry-min", callout.DefaultRetryMin, "delay before retrying after a first failure; doubled on each further consecutive failure")
	fs.DurationVar(&o.callout.RetryMax, "retry-max", callout.DefaultRetryMax, "maximum delay between retries")
	fs.IntVar(&o.onceAttempts, "once-attempts", 3, "with --once, how many times the callout is tried for the first state before giving up (exit status 1)")

	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stderr)
			fmt.Fprintf(stderr, "Usage: CALLOUT='program [args...]' %s [flags]\n\n"+
				"Runs $CALLOUT with the JSON state (as printed by kpng-json) on its stdin each time it changes.\n\n", name)
			fs.PrintDefaults()
			return 0
		}
		return usage(stderr, err)
	}
	if fs.NArg() > 0 {
		return usage(stderr, fmt.Errorf("unexpected argument %q", fs.Arg(0)))
	}
	switch {
	case o.callout.Timeout <= 0:
		return usage(stderr, fmt.Errorf("--timeout=%v: must be positive", o.callout.Timeout))
	case o.callout.RetryMin <= 0:
		return usage(stderr, fmt.Errorf("--retry-min=%v: must be positive", o.callout.RetryMin))
	case o.callout.RetryMax < o.callout.RetryMin:
		return usage(stderr, fmt.Errorf("--retry-max=%v: must not be less than --retry-min=%v", o.callout.RetryMax, o.callout.RetryMin))
	case o.onceAttempts < 1:
		return usage(stderr, fmt.Errorf("--once-attempts=%d: must be at least 1", o.onceAttempts))
	}
	command, err := callout.Split(calloutEnv)
	if err != nil {
		return usage(stderr, fmt.Errorf("$CALLOUT: %w", err))
	}
	if len(command) == 0 {
		return usage(stderr, errors.New("$CALLOUT is not set: set it to the program to run on each state, e.g. CALLOUT=jq"))
	}
	if _, err := exec.LookPath(command[0]); err != nil {
		return usage(stderr, fmt.Errorf("$CALLOUT: %w", err))
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	defer klog.Flush()
	// The metrics and health servers start before the watch, so that the
	// callout's metrics join the Recorder's; they end with ctx. A round
	// ends when its state is handed to the runner: the state is applied
	// when a run of the callout on it, or on a newer one, succeeds.
	kpng.AppliedLater = true
	rec, err := kpng.StartMetrics(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
	o.callout.Command = command
	o.callout.Stdout, o.callout.Stderr = stdout, stderr
	o.callout.Once = kpng.Once
	if kpng.Once {
		o.callout.MaxAttempts = o.onceAttempts
	}
	if o.callout.Observe, err = calloutMetrics(rec); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
	runner, err := callout.NewRunner(o.callout)
	if err != nil {
		return usage(stderr, err)
	}
	return watch(ctx, &kpng, runner, stderr)
}

// calloutMetrics registers the callout's metrics with rec and returns
// what records each run: kpng_callout_runs_total{result} (success,
// failure, timeout) and kpng_callout_duration_seconds, and, for health,
// each success as the states submitted up to its own applied
// (rec.Applied).
func calloutMetrics(rec *metrics.Recorder) (func(callout.Outcome), error) {
	runs := prometheus.NewCounterVec(prometheus.CounterOpts(rec.Opts("callout_runs_total",
		"Runs of the callout, by result: success, failure (it exited with an error or could not start) or timeout (killed after --timeout).")), []string{"result"})
	o := rec.Opts("callout_duration_seconds", "How long each run of the callout took, in seconds.")
	duration := prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: o.Namespace, Name: o.Name, Help: o.Help, ConstLabels: o.ConstLabels,
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 14)})
	for _, c := range []prometheus.Collector{runs, duration} {
		if err := rec.Registry().Register(c); err != nil {
			return nil, fmt.Errorf("callout metrics: %w", err)
		}
	}
	for _, r := range []string{"success", "failure", "timeout"} {
		runs.WithLabelValues(r)
	}
	return func(out callout.Outcome) {
		duration.Observe(out.Duration.Seconds())
		switch {
		case out.TimedOut:
			runs.WithLabelValues("timeout").Inc()
		case out.Err != nil:
			runs.WithLabelValues("failure").Inc()
		default:
			runs.WithLabelValues("success").Inc()
			rec.Applied(out.Submitted)
		}
	}, nil
}

// watch runs the watcher and the runner until ctx is done, or with --once
// until the runner is done with the first state, and returns the exit
// status.
func watch(ctx context.Context, kpng *client.Flags, runner *callout.Runner, stderr io.Writer) int {
	runnerCtx, stopRunner := context.WithCancel(ctx)
	defer stopRunner()
	runnerDone := make(chan error, 1)
	go func() { runnerDone <- runner.Run(runnerCtx) }()

	watchErr := kpng.Run(ctx, localsink.NewFullState(func(items []*client.ServiceEndpoints) {
		state, err := encode(items)
		if err != nil {
			klog.ErrorS(err, "Cannot encode the state; not running the callout for it")
			return
		}
		runner.Submit(state)
	}))
	if watchErr != nil || !kpng.Once {
		// A watcher error, or a stop without --once: stop the runner
		// too. With --once, the watcher returns after the first state
		// and the runner finishes with it.
		stopRunner()
	}
	runErr := <-runnerDone

	switch {
	case watchErr != nil && client.IsUsageError(watchErr):
		return usage(stderr, watchErr)
	case watchErr != nil:
		fmt.Fprintf(stderr, "%s: %v\n", name, watchErr)
		return 1
	case ctx.Err() != nil:
		klog.InfoS("Stopped by signal")
		return 0
	case runErr != nil:
		fmt.Fprintf(stderr, "%s: %v\n", name, runErr)
		return 1
	}
	return 0
}

// encode returns the state exactly as kpng-json prints it: each item
// encoded by a json.Encoder, one object per line.
func encode(items []*client.ServiceEndpoints) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for _, item := range items {
		if err := enc.Encode(item); err != nil {
			return nil, fmt.Errorf("encode the state as JSON: %w", err)
		}
	}
	return buf.Bytes(), nil
}

// usage prints err on one line and returns exit status 2.
func usage(stderr io.Writer, err error) int {
	fmt.Fprintf(stderr, "%s: %v\n", name, err)
	return 2
}
