// Package app is the kpng controller's command line: an input (kube, file,
// api) feeding an output (to-api, to-file, to-local <backend>). Programs
// that want other in-process backends build their own kpng with Main and
// their Backend list.
package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"

	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/client"
	"sigs.k8s.io/kpng/client/metrics"
	"sigs.k8s.io/kpng/localsink"
)

// Version is kpng's version, set at link time with
// -ldflags "-X sigs.k8s.io/kpng/cmd/kpng/app.Version=v1.2.3"; when unset,
// the module version from the build info is used.
var Version = ""

// Backend is an in-process backend that `kpng ... to-local <name>` runs.
type Backend struct {
	// Name is the subcommand, e.g. "to-nft".
	Name string
	// Help is a one-line description.
	Help string
	// Bind registers the backend's flags on fs and returns the function
	// that builds the backend once the flags are parsed. The sink is fed
	// until ctx ends.
	Bind func(fs *flag.FlagSet) func(ctx context.Context, env BackendEnv) (localsink.Sink, error)
}

// BackendEnv is what an in-process backend learns from the input.
type BackendEnv struct {
	// ServiceProxyName is the kube input's --service-proxy-name; empty for
	// the other inputs, and for the services without that label.
	ServiceProxyName string
	// Metrics records the rounds fed to the backend (the kube and api
	// inputs; nil for file): its Healthy is what the health check node
	// ports follow, its Registry takes the backend's own metrics.
	Metrics *metrics.Recorder
}

// ErrBackendDone is returned by a backend's build function when the
// backend did all its work while being built (a cleanup, say): kpng then
// exits with status 0 without running the input.
var ErrBackendDone = errors.New("backend done")

// usageError is an error in the command line: exit status 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

// Usagef returns an error in the command line (exit status 2), for
// backends that check their flags.
func Usagef(format string, args ...any) error { return usagef(format, args...) }

// errHelp reports that help was printed.
var errHelp = errors.New("help")

// Main runs kpng with args (without the program name) and returns its exit
// status: 0 on a clean stop, 2 for usage errors, 1 for other failures.
func Main(args []string, stdout, stderr io.Writer, backends ...Backend) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return Exec(ctx, args, stdout, stderr, backends...)
}

// Exec is Main without the signal handling: it runs until ctx ends.
func Exec(ctx context.Context, args []string, stdout, stderr io.Writer, backends ...Backend) int {
	defer klog.Flush()
	err := run(ctx, args, stdout, stderr, backends)
	var ue usageError
	switch {
	case err == nil, errors.Is(err, errHelp):
		return 0
	case errors.As(err, &ue), client.IsUsageError(err):
		fmt.Fprintf(stderr, "kpng: %v (see kpng --help)\n", err)
		return 2
	default:
		fmt.Fprintf(stderr, "kpng: %v\n", err)
		return 1
	}
}

const topHelp = `kpng: the Kubernetes side of a service proxier.

Usage:
  kpng [klog flags] [--profiling-bind-address=ADDR] <input> [input flags] <output> [output flags]
  kpng version

Inputs (where the state comes from):
  kube     watch the Kubernetes API server (services of one service-proxy-name)
  file     read a state file (YAML or JSON), reloaded when it changes
  api      watch another kpng controller

Outputs (where the state goes):
  to-api   serve backends over gRPC (unix socket by default)
  to-file  write the state to a file on every change
  to-local run an in-process backend: to-local <backend> [backend flags]

Examples:
  kpng kube --service-proxy-name=kpng-example to-api
  kpng kube --service-proxy-name=kpng-example to-file --output=state.yaml
  kpng file --input=state.yaml to-api --listen=unix:///tmp/kpng.sock
  kpng kube --service-proxy-name=kpng-example to-local to-json

Run "kpng <input> --help" and "kpng <input> <output> --help" for their flags.
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer, backends []Backend) error {
	global := flag.NewFlagSet("kpng", flag.ContinueOnError)
	klog.InitFlags(global)
	profiling := global.String("profiling-bind-address", "", "serve Go's profiles (net/http/pprof, /debug/pprof/) at this address, unauthenticated: for measurements (e.g. 127.0.0.1:10350; empty: not served)")
	rest, err := parse(global, args, stderr, topHelp)
	if err != nil {
		return err
	}
	if len(rest) == 0 {
		fmt.Fprint(stderr, topHelp)
		return usagef("missing input")
	}
	switch rest[0] {
	case "version":
		fmt.Fprintln(stdout, version())
		return nil
	case "help":
		fmt.Fprint(stdout, topHelp)
		return nil
	}
	rest0 := rest[0]
	in, ok := inputs[rest0]
	if !ok {
		return usagef("unknown input %q (want kube, file or api)", rest[0])
	}
	fs := flag.NewFlagSet("kpng "+rest[0], flag.ContinueOnError)
	start, env := in.bind(fs)
	rest, err = parse(fs, rest[1:], stderr, in.help)
	if err != nil {
		return err
	}
	if len(rest) == 0 {
		return usagef("%s: missing output (to-api, to-file or to-local)", fs.Name())
	}
	out, err := bindOutput(fs.Name(), rest, stderr, backends, rest0 == "kube", env)
	if err != nil {
		return err
	}
	if err := serveProfiling(ctx, *profiling); err != nil {
		return err
	}
	return start(ctx, out)
}

// parse parses fs, printing help (and returning errHelp) for -h/--help.
func parse(fs *flag.FlagSet, args []string, stderr io.Writer, help string) ([]string, error) {
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stderr, help)
			fmt.Fprintf(stderr, "\nFlags of %s:\n", fs.Name())
			fs.SetOutput(stderr)
			fs.PrintDefaults()
			return nil, errHelp
		}
		return nil, usagef("%s: %v", fs.Name(), err)
	}
	return fs.Args(), nil
}

func version() string {
	if Version != "" {
		return "kpng " + Version
	}
	v := "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		v = bi.Main.Version
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				v += " " + s.Value
			}
		}
	}
	return "kpng " + strings.TrimSpace(v)
}
