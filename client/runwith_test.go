package client

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

// TestMainWithOwnFlags: a program's own flags sit beside kpng's on one
// command line, newSink sees both after parsing, and its results map to
// the exit statuses MainWith documents.
func TestMainWithOwnFlags(t *testing.T) {
	for _, tc := range []struct {
		name     string
		args     []string
		sinkErr  error
		wantCode int
		wantErr  string // in stderr; "" wants it empty
	}{
		{"own and kpng flags, nil sink", []string{"--table=t1", "--service-proxy-name=p1", "--cleanup"}, nil, 0, ""},
		{"usage error from newSink", []string{"--table=", "--cleanup"}, UsageError(errors.New("--table: empty")), 2, "--table: empty"},
		{"other error from newSink", []string{"--table=t1", "--cleanup"}, errors.New("no such table"), 1, "no such table"},
		{"unknown flag", []string{"--bogus"}, nil, 2, "flag provided but not defined: -bogus"},
		{"bad own flag value", []string{"--cleanup=maybe"}, nil, 2, `invalid boolean value "maybe" for -cleanup`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var table string
			var cleanup, built bool
			bind := func(fs *flag.FlagSet) {
				fs.StringVar(&table, "table", "default", "the table")
				fs.BoolVar(&cleanup, "cleanup", false, "remove the table and exit")
			}
			var stderr bytes.Buffer
			code := MainWith(tc.args, &stderr, bind, func(ctx context.Context, f *Flags) (Sink, error) {
				built = true
				if ctx.Err() != nil {
					t.Errorf("newSink's context already done: %v", ctx.Err())
				}
				if strings.Contains(strings.Join(tc.args, " "), "--service-proxy-name=p1") && f.ServiceProxyName != "p1" {
					t.Errorf("kpng's --service-proxy-name = %q in newSink, want p1", f.ServiceProxyName)
				}
				if !cleanup {
					t.Error("own flag --cleanup not parsed before newSink")
				}
				return nil, tc.sinkErr
			})
			if code != tc.wantCode {
				t.Errorf("exit status %d, want %d (stderr %q)", code, tc.wantCode, stderr.String())
			}
			out := stderr.String()
			if tc.wantErr == "" && out != "" {
				t.Errorf("stderr = %q, want nothing", out)
			}
			if tc.wantErr != "" && (strings.Count(out, "\n") != 1 || !strings.Contains(out, tc.wantErr)) {
				t.Errorf("stderr = %q, want one line containing %q", out, tc.wantErr)
			}
			if parseFails := tc.sinkErr == nil && tc.wantCode == 2; built == parseFails {
				t.Errorf("newSink called = %v on %v", built, tc.args)
			}
			if tc.name == "own and kpng flags, nil sink" && table != "t1" {
				t.Errorf("--table = %q, want t1", table)
			}
		})
	}
}

// TestMainWithHelp: -h lists the program's flags with kpng's.
func TestMainWithHelp(t *testing.T) {
	var stderr bytes.Buffer
	code := MainWith([]string{"-h"}, &stderr, func(fs *flag.FlagSet) {
		fs.String("table", "", "the table this backend programs")
	}, func(context.Context, *Flags) (Sink, error) {
		t.Error("newSink called on -h")
		return nil, nil
	})
	if code != 0 {
		t.Errorf("exit status %d on -h, want 0", code)
	}
	for _, want := range []string{"-table", "the table this backend programs", "-service-proxy-name", "-kubeconfig"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("-h output lacks %q:\n%s", want, stderr.String())
		}
	}
}

func TestUsageError(t *testing.T) {
	if UsageError(nil) != nil {
		t.Error("UsageError(nil) != nil")
	}
	base := errors.New("bad")
	err := UsageError(base)
	if !IsUsageError(err) || !errors.Is(err, base) || err.Error() != "bad" {
		t.Errorf("UsageError(bad) = %v: IsUsageError %v, wraps %v", err, IsUsageError(err), errors.Is(err, base))
	}
	if IsUsageError(base) {
		t.Error("IsUsageError of a plain error")
	}
}

// closingSink records the states it is given and whether it was closed.
type closingSink struct {
	localsink.Sink
	mu     sync.Mutex
	states int
	closed bool
}

func (c *closingSink) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	return nil
}

// TestMainWithRuns: against the API server, MainWith runs the sink that
// newSink built from the parsed flags (here until the first state,
// --once), then closes it.
func TestMainWithRuns(t *testing.T) {
	cp.Require(t)
	var prefix string
	sink := &closingSink{}
	sink.Sink = localsink.NewFullState(func([]*model.ServiceEndpoints) {
		sink.mu.Lock()
		sink.states++
		sink.mu.Unlock()
	})
	var stderr bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- MainWith([]string{"--kubeconfig=" + cp.KubeconfigPath(), "--service-proxy-name=runwith-test",
			"--node-name=node-a", "--once", "--prefix=p-"}, &stderr,
			func(fs *flag.FlagSet) { fs.StringVar(&prefix, "prefix", "", "a prefix") },
			func(_ context.Context, f *Flags) (Sink, error) {
				if prefix != "p-" || f.ServiceProxyName != "runwith-test" || !f.Once {
					return nil, UsageError(errors.New("flags not parsed before newSink"))
				}
				return sink, nil
			})
	}()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit status %d: %s", code, stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatal("MainWith --once did not return within 60s")
	}
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if sink.states != 1 || !sink.closed {
		t.Errorf("sink got %d states and closed = %v, want 1 state and closed", sink.states, sink.closed)
	}
}

// plainCloser is a sink whose Close has no result, as the reference
// backends' (userspace, healthcheck).
type plainCloser struct {
	localsink.Sink
	closed bool
}

func (p *plainCloser) Close() { p.closed = true }

// TestMainWithClosesOnFailure: a run that fails (here: no kubeconfig at
// the path given) still closes the sink newSink built, whether its Close
// returns an error or nothing, before MainWith returns.
func TestMainWithClosesOnFailure(t *testing.T) {
	noFile := filepath.Join(t.TempDir(), "no-kubeconfig")
	for _, sink := range []interface {
		Sink
		isClosed() bool
	}{&closingSinkProbe{closingSink: &closingSink{Sink: localsink.NewFullState(func([]*model.ServiceEndpoints) {})}}, &plainCloserProbe{&plainCloser{Sink: localsink.NewFullState(func([]*model.ServiceEndpoints) {})}}} {
		var stderr bytes.Buffer
		code := MainWith([]string{"--kubeconfig=" + noFile, "--service-proxy-name=x", "--node-name=n"}, &stderr, nil,
			func(context.Context, *Flags) (Sink, error) { return sink, nil })
		if code != 2 {
			t.Errorf("%T: exit status %d, want 2, a missing kubeconfig (%s)", sink, code, stderr.String())
		}
		if !sink.isClosed() {
			t.Errorf("%T: not closed after a failed run", sink)
		}
	}
}

// closingSinkProbe and plainCloserProbe tell whether their sink was
// closed, each keeping only its own kind of Close.
type closingSinkProbe struct{ *closingSink }

func (p *closingSinkProbe) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

type plainCloserProbe struct{ *plainCloser }

func (p *plainCloserProbe) isClosed() bool { return p.closed }
