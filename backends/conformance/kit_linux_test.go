//go:build linux

package conformance_test

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/kpng/backends/conformance"
	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

// childEnv names, in the environment of a child test process, the backend
// TestKitChild runs the kit against.
const childEnv = "KPNG_CONFORMANCE_KIT_BACKEND"

// kitPrefix names the namespaces of the kit's own test.
const kitPrefix = "kpngt-kit-"

// nothing is a backend that programs nothing.
type nothing struct{}

func (nothing) Reset()                                                                    {}
func (nothing) Update(model.ServiceKey, *model.ServiceEndpoints, *model.ServiceEndpoints) {}
func (nothing) Sync() error                                                               { return nil }

// tinyLacks are the kit's features tiny does not have.
var tinyLacks = map[conformance.Feature]string{
	conformance.SessionAffinity: "tiny has no affinity",
	conformance.TopologyHints:   "tiny ignores hints",
}

// kitBackends are the backends of the kit's own test, by name.
var kitBackends = map[string]conformance.Backend{
	"nothing":           {Start: func(testing.TB, conformance.Node) (localsink.Sink, error) { return nothing{}, nil }},
	"ignores-readiness": {Start: startTiny(tiny{ignoreReadiness: true}), Unsupported: tinyLacks},
	"keeps-flows":       {Start: startTiny(tiny{keepFlows: true}), Unsupported: tinyLacks},
	"tiny":              {Start: startTiny(tiny{}), Unsupported: tinyLacks},
}

// TestKitChild runs the kit against the backend named by
// KPNG_CONFORMANCE_KIT_BACKEND: TestKitCanFail runs it in a child process,
// whose failures it reads without failing itself.
func TestKitChild(t *testing.T) {
	name := os.Getenv(childEnv)
	if name == "" {
		t.Skip("run by TestKitCanFail, in a child process")
	}
	b, ok := kitBackends[name]
	if !ok {
		t.Fatalf("no backend %q", name)
	}
	b.Name, b.NetNSPrefix = name, kitPrefix
	conformance.Run(t, b)
}

// TestKitCanFail runs the kit, in a child process, against backends that
// each break a duty, and checks that exactly the scenarios covering it
// fail, that the others pass, that a scenario needing an unsupported
// feature is skipped with the reason, and that a failed check is reported
// once, with the state it was checked in. Only the scenarios that tell are
// run, to keep it short.
func TestKitCanFail(t *testing.T) {
	netns.RequirePrivileged(t)
	for _, tc := range []struct {
		backend string
		// want are the scenarios run, with their expected results.
		want map[string]string
		// reports are, for failing scenarios, how many checks fail.
		reports map[string]int
	}{
		{
			// Programs nothing: no service answers, nothing is refused.
			backend: "nothing",
			want:    map[string]string{"cluster-ip": "FAIL", "reject-without-endpoints": "FAIL"},
			reports: map[string]int{"cluster-ip": 8, "reject-without-endpoints": 4},
		},
		{
			// Sends to terminating endpoints while a ready one exists.
			backend: "ignores-readiness",
			want:    map[string]string{"cluster-ip": "PASS", "endpoint-change": "PASS", "terminating-fallback": "FAIL"},
			reports: map[string]int{"terminating-fallback": 1},
		},
		{
			// Never deletes the conntrack entries of removed endpoints.
			backend: "keeps-flows",
			want:    map[string]string{"udp-stale-flow": "FAIL", "terminating-fallback": "PASS", "endpoint-change": "PASS"},
			reports: map[string]int{"udp-stale-flow": 2},
		},
		{
			// The same with backends/conntrack.DeleteFlows; and an
			// unsupported feature.
			backend: "tiny",
			want:    map[string]string{"udp-stale-flow": "PASS", "session-affinity": "SKIP"},
		},
	} {
		t.Run(tc.backend, func(t *testing.T) {
			start := time.Now()
			got, out := runKit(t, tc.backend, tc.want)
			t.Logf("%s: %v in %v", tc.backend, got, time.Since(start).Round(time.Millisecond))
			for sc, want := range tc.want {
				if got[sc] != want {
					t.Errorf("scenario %s against %s: %s, want %s", sc, tc.backend, cmpOr(got[sc], "not run"), want)
				}
			}
			for sc, n := range tc.reports {
				text := out[sc]
				if c := strings.Count(text, "state given to backend"); c != 1 {
					t.Errorf("scenario %s against %s: the state printed %d times, want once (after one change of state)", sc, tc.backend, c)
				}
				if c := strings.Count(text, ": checking "); c != n {
					t.Errorf("scenario %s against %s: %d failures reported, want %d (one per failed check)", sc, tc.backend, c, n)
				}
			}
			if tc.want["session-affinity"] == "SKIP" && !strings.Contains(out["session-affinity"], tinyLacks[conformance.SessionAffinity]) {
				t.Errorf("the skipped scenario does not give the backend's reason %q", tinyLacks[conformance.SessionAffinity])
			}
			if t.Failed() {
				for sc, text := range out {
					t.Logf("output of %s:\n%s", sc, text)
				}
			}
		})
	}
}

// cmpOr returns s, or def when s is empty.
func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// result is a line of `go test -v` ending a subtest of TestKitChild.
var result = regexp.MustCompile(`^\s*--- (PASS|FAIL|SKIP): TestKitChild/(\S+) \(`)

// runKit runs the scenarios named in want against backend, in a child
// process (this test binary, -test.run selecting TestKitChild and those
// scenarios, -test.v), and returns each scenario's result and output.
func runKit(t *testing.T, backend string, want map[string]string) (results, output map[string]string) {
	t.Helper()
	var names []string
	for sc := range want {
		names = append(names, regexp.QuoteMeta(sc))
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestKitChild$/^("+strings.Join(names, "|")+")$", "-test.v", "-test.count=1", "-test.timeout=5m")
	cmd.Env = append(os.Environ(), childEnv+"="+backend)
	out, err := cmd.CombinedOutput()
	if _, exited := err.(*exec.ExitError); err != nil && !exited {
		t.Fatalf("run the kit in a child process: %v", err)
	}
	results, output = map[string]string{}, map[string]string{}
	current := ""
	for _, line := range strings.Split(string(out), "\n") {
		if sc, ok := strings.CutPrefix(line, "=== RUN   TestKitChild/"); ok {
			current = sc
		}
		if m := result.FindStringSubmatch(line); m != nil {
			results[m[2]] = m[1]
		}
		if current != "" {
			output[current] += line + "\n"
		}
	}
	if len(results) == 0 {
		t.Fatalf("the child process reported no scenario (%v):\n%s", err, out)
	}
	return results, output
}
