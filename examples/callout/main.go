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
// callout running longer than --timeout is killed; see README.md.
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

	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/client"
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

	o.callout.Command = command
	o.callout.Stdout, o.callout.Stderr = stdout, stderr
	o.callout.Once = kpng.Once
	if kpng.Once {
		o.callout.MaxAttempts = o.onceAttempts
	}
	runner, err := callout.NewRunner(o.callout)
	if err != nil {
		return usage(stderr, err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	defer klog.Flush()
	return watch(ctx, &kpng, runner, stderr)
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
