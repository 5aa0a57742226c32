package statefile

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/localsink/sinktest"
	"sigs.k8s.io/kpng/model"
)

// equatePrefixes lets cmp compare the model's netip.Prefix values.
var equatePrefixes = cmpopts.EquateComparable(netip.Prefix{})

func sample() []*model.ServiceEndpoints {
	return []*model.ServiceEndpoints{{
		Service: &model.Service{
			Namespace: "default", Name: "kpng-example", Type: "ClusterIP",
			Labels:                   map[string]string{"service.kubernetes.io/service-proxy-name": "kpng-example"},
			IPs:                      model.ServiceIPs{ExternalIPs: model.IPSet{V4: []string{"10.0.0.55"}, V6: []string{"1000::55"}}, Headless: true},
			Ports:                    []*model.PortMapping{{Protocol: model.TCP, Port: 6000, TargetPort: 6000}},
			LoadBalancerSourceRanges: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("2001:db8::/32")},
		},
		Endpoints: []*model.Endpoint{
			{IPs: model.IPSet{V4: []string{"11.0.2.2"}}, Local: true, Ready: true, Serving: true, NodeName: "node-a"},
			{IPs: model.IPSet{V6: []string{"1100::202"}}, Local: true, Ready: true, Serving: true, NodeName: "node-a",
				Hints: &model.Hints{Zones: []string{"z"}, SameZone: true}, PortOverrides: map[string]int32{"": 6001}},
		},
	}}
}

func TestWriteReadRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.yaml")
	if err := Write(path, sample()); err != nil {
		t.Fatal(err)
	}
	got, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(sample(), got, equatePrefixes); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	data, _ := os.ReadFile(path)
	for _, want := range []string{"Service:", "ExternalIPs:", "- 1000::55", "Local: true", "LoadBalancerSourceRanges:\n    - 198.51.100.0/24\n    - 2001:db8::/32"} {
		if !strings.Contains(string(data), want) {
			t.Errorf("state file lacks %q:\n%s", want, data)
		}
	}
	if err := Write(path, nil); err != nil {
		t.Fatal(err)
	}
	if got, err := Read(path); err != nil || len(got) != 0 {
		t.Errorf("empty state read back as %v, %v", got, err)
	}
}

// TestStateWithCluster: the cluster-level facts are the Cluster item of
// the list, written first, read back canonical, and given to a
// ClusterSink by Watch.
func TestStateWithCluster(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.yaml")
	cluster := &model.Cluster{ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("fd00:10:96::/108")}}
	if err := WriteState(path, cluster, sample()); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	if !strings.HasPrefix(string(data), "- Cluster:\n    ServiceCIDRs:\n    - 10.96.0.0/16\n    - fd00:10:96::/108\n- Endpoints:") {
		t.Errorf("state file:\n%s", data)
	}
	gotCluster, got, err := ParseState(data)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(cluster, gotCluster, equatePrefixes); diff != "" {
		t.Errorf("cluster (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(sample(), got, equatePrefixes); diff != "" {
		t.Errorf("services (-want +got):\n%s", diff)
	}
	if c, _, err := ParseState([]byte("- Cluster: {ServiceCIDRs: ['fd00:10:96::1/108', 10.96.0.0/16, 10.96.0.0/16]}")); err != nil || !c.Equal(cluster) {
		t.Errorf("canonical CIDRs: %+v, %v; want %+v", c, err, cluster)
	}

	sink := sinktest.NewChecker(nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Watch(ctx, path, 20*time.Millisecond, 0, sink) }()
	sink.WaitSyncs(t, 1, 10*time.Second)
	if err := WriteState(path, nil, sample()); err != nil {
		t.Fatal(err)
	}
	sink.WaitSyncs(t, 2, 10*time.Second)
	cancel()
	<-done
	if err := sink.Err(); err != nil {
		t.Errorf("the file input broke the Sink contract:\n%v", err)
	}
	want := []string{"Reset", "SetCluster service CIDRs 10.96.0.0/16,fd00:10:96::/108", "Update default/kpng-example service +11.0.2.2 +1100::202", "Sync", "SetCluster none", "Sync"}
	if diff := cmp.Diff(want, sink.TakeCalls()); diff != "" {
		t.Errorf("calls (-want +got):\n%s", diff)
	}
}

func TestParseFormats(t *testing.T) {
	jsonLines := `{"Service":{"Namespace":"a","Name":"x","Type":"ClusterIP","IPs":{"ClusterIPs":{"V4":["10.96.0.10"]},"ExternalIPs":{}},"Ports":null},"Endpoints":[{"IPs":{"V6":["1100:0::0202"]}}]}
{"Service":{"Namespace":"a","Name":"y","Type":"ClusterIP","IPs":{"ClusterIPs":{},"ExternalIPs":{}},"Ports":null},"Endpoints":null}
`
	got, err := Parse([]byte(jsonLines))
	if err != nil {
		t.Fatalf("kpng-json output: %v", err)
	}
	if len(got) != 2 || got[1].Service.Name != "y" {
		t.Fatalf("kpng-json output parsed as %d items", len(got))
	}
	// Addresses come out canonical.
	if diff := cmp.Diff(model.IPSet{V6: []string{"1100::202"}}, got[0].Endpoints[0].IPs); diff != "" {
		t.Errorf("endpoint IPs (-want +got):\n%s", diff)
	}
	// Source ranges too: masked (as kube-proxy), IPv4-mapped ones as
	// IPv4, sorted, each once.
	ranges, err := Parse([]byte("- Service: {Namespace: a, Name: lb, LoadBalancerSourceRanges: [2001:db8::1/32, 10.0.0.1/8, '::ffff:192.0.2.0/120', 10.0.0.0/8]}"))
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("2001:db8::/32")}
	if diff := cmp.Diff(want, ranges[0].Service.LoadBalancerSourceRanges, equatePrefixes); diff != "" {
		t.Errorf("source ranges (-want +got):\n%s", diff)
	}
	multiDoc := "Service: {Namespace: a, Name: svc-x}\n---\nService: {Namespace: a, Name: svc-y}\n"
	if got, err := Parse([]byte(multiDoc)); err != nil || len(got) != 2 {
		t.Errorf("multi-document YAML: %d items, %v", len(got), err)
	}
}

func TestParseErrorsNameTheProblem(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"- Service: {Namespace: a}", "item 0: Service.Namespace and Service.Name are required"},
		{"- Endpoints: []", "item 0: no Service"},
		{"- Service: {Namespace: a, Name: x}\n- Service: {Namespace: a, Name: x}", "item 1 (service a/x): same service as item 0"},
		{"- Service: {Namespace: a, Name: x, IPs: {ExternalIPs: {V4: [not-an-ip]}}}", `Service.IPs.ExternalIPs: invalid address "not-an-ip"`},
		{"- Service: {Namespace: a, Name: x, Ports: [{Protocol: 7, Port: 1}]}", "Service.Ports[0].Protocol"},
		{"- Service: {Namespace: a, Name: x}\n  Endpoints: [{IPs: {}}]", "Endpoints[0].IPs: no address"},
		{"- Service: {Namespace: a, Name: x}\n  Endpoints: [{IPs: {V4: [1.2.3.4]}}, {IPs: {V4: [1.2.3.4]}}]", "address 1.2.3.4 listed twice"},
		{"- Service: {Namespace: a, Name: x, Bogus: 1}", `unknown field "Bogus"`},
		{"- [", "document 0"},
		// Source ranges are parsed here, once: a bad one names its item,
		// service and field.
		{"- Service: {Namespace: a, Name: x, LoadBalancerSourceRanges: [10.0.0.0/8, bogus]}",
			`item 0 (service a/x): Service.LoadBalancerSourceRanges[1]: "bogus" is not a usable CIDR`},
		{"- Service: {Namespace: a, Name: x}\n- Service: {Namespace: a, Name: lb, LoadBalancerSourceRanges: ['']}",
			`item 1 (service a/lb): Service.LoadBalancerSourceRanges[0]: empty, not a CIDR`},
		{`{"Service":{"Namespace":"a","Name":"x","LoadBalancerSourceRanges":["10.0.0.0/33"]}}`,
			`item 0 (service a/x): Service.LoadBalancerSourceRanges[0]: "10.0.0.0/33" is not a usable CIDR`},
		// The Cluster item: items are numbered in the list, with it.
		{"- Cluster: {ServiceCIDRs: [10.96.0.0/16, bogus]}", `item 0: Cluster.ServiceCIDRs: "bogus" is not a usable CIDR`},
		{"- Cluster: {}\n- Cluster: {}", "item 1: a second Cluster item (the first is item 0)"},
		{"- Cluster: {ServiceCIDRs: []}\n  Service: {Namespace: a, Name: x}", "item 0: Cluster: "},
		{"- Cluster: {ServiceCIDRs: [10.96.0.0/16]}\n- Service: {Namespace: a}", "item 1: Service.Namespace and Service.Name are required"},
		// Names are checked as the API server checks them (they reach
		// rule text, comments and logs), quoted in the message.
		{`- Service: {Namespace: a, Name: "x\"\n}"}`, `item 0: service "a"/"x\"\n}": metadata.name: "x\"\n}" is not a DNS-1035 label`},
		{"- Service: {Namespace: A, Name: x}", `item 0: service "A"/"x": metadata.namespace: "A" is not a DNS-1123 label`},
		{"- Service: {Namespace: a, Name: x, Ports: [{Name: 'a;b', Protocol: 1, Port: 1}]}", `spec.ports[0].name: "a;b" is not a DNS-1123 label`},
		{"- Service: {Namespace: a, Name: x}\n  Endpoints: [{IPs: {V4: [1.2.3.4]}}, {IPs: {V4: [1.2.3.5]}, NodeName: \"n\\0\"}]", `endpoints[1].nodeName: "n\x00" is not a DNS-1123 subdomain`},
		{"- Service: {Namespace: a, Name: x, LoadBalancerSourceRanges: ['::ffff:0.0.0.0/90']}",
			`item 0 (service a/x): Service.LoadBalancerSourceRanges[0]: "::ffff:0.0.0.0/90" is not a usable CIDR (an IPv4-mapped prefix shorter than /96)`},
	} {
		_, err := Parse([]byte(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q): error %v, want one containing %q", tc.in, err, tc.want)
		}
	}
}

// stateSink records the full states a Watch delivers.
type stateSink struct {
	mu     sync.Mutex
	states [][]*model.ServiceEndpoints
}

func (s *stateSink) last(t *testing.T, n int) []*model.ServiceEndpoints {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		k := len(s.states)
		var st []*model.ServiceEndpoints
		if k > 0 {
			st = s.states[k-1]
		}
		s.mu.Unlock()
		if k >= n {
			return st
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for state %d", n)
	return nil
}

func (s *stateSink) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.states)
}

// watchFile runs Watch on path, polled every interval, until the test
// ends, into a full-state sink that records each state, behind a checker
// of the Sink contract; at the end Watch must have returned no error and
// the contract must have held.
func watchFile(t *testing.T, path string, interval time.Duration) *stateSink {
	t.Helper()
	rec := &stateSink{}
	sink := sinktest.NewChecker(localsink.NewFullState(func(items []*model.ServiceEndpoints) {
		rec.mu.Lock()
		rec.states = append(rec.states, items)
		rec.mu.Unlock()
	}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Watch(ctx, path, interval, 0, sink) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Watch: %v", err)
		}
		if err := sink.Err(); err != nil {
			t.Errorf("the file input broke the Sink contract:\n%v", err)
		}
	})
	return rec
}

// checks counts the checks Watch makes of path, and their errors, for
// the test: wait for some instead of sleeping.
type checks struct {
	mu   sync.Mutex
	n    int
	errs []error
}

// countChecks counts Watch's checks of path until the test ends.
func countChecks(t *testing.T, path string) *checks {
	c := &checks{}
	saved := watchChecked
	watchChecked = func(p string, err error) {
		if p == path {
			c.mu.Lock()
			c.n++
			if err != nil {
				c.errs = append(c.errs, err)
			}
			c.mu.Unlock()
		}
		saved(p, err)
	}
	t.Cleanup(func() { watchChecked = saved })
	return c
}

// count returns the number of checks so far.
func (c *checks) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// wait waits until cond holds of the checks (n, errors), failing the test
// after 10 s.
func (c *checks) wait(t *testing.T, what string, cond func(n int, errs []error) bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		c.mu.Lock()
		ok := cond(c.n, c.errs)
		c.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s (%d checks)", what, c.count())
		}
	}
}

// after waits for n checks begun after now: n+1 ended (the one in
// progress may have begun before).
func (c *checks) after(t *testing.T, n int) {
	t.Helper()
	from := c.count()
	c.wait(t, fmt.Sprintf("%d checks", n), func(got int, _ []error) bool { return got >= from+n+1 })
}

func TestWatchFollowsTheFileAndKeepsTheLastGoodState(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.yaml")
	if err := Write(path, sample()); err != nil {
		t.Fatal(err)
	}
	checks := countChecks(t, path)
	rec := watchFile(t, path, 20*time.Millisecond)
	if diff := cmp.Diff(sample(), rec.last(t, 1), equatePrefixes); diff != "" {
		t.Errorf("first state (-want +got):\n%s", diff)
	}
	// A broken edit is ignored...
	if err := os.WriteFile(path, []byte("- Service: {Namespace: a}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	checks.wait(t, "the check that rejects the broken file", func(_ int, errs []error) bool {
		return len(errs) > 0 && strings.Contains(errs[len(errs)-1].Error(), "state file")
	})
	if n := rec.count(); n != 1 {
		t.Errorf("a malformed file produced %d states, want the first one only", n)
	}
	// ...and a good one applied.
	changed := sample()
	changed[0].Endpoints = changed[0].Endpoints[:1]
	if err := Write(path, changed); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(changed, rec.last(t, 2), equatePrefixes); diff != "" {
		t.Errorf("state after the edit (-want +got):\n%s", diff)
	}
}

// TestWatchReadsOnlyNewVersions: a file touched (same content) gives no
// new state; a same-size edit in place whose modification time is put
// back, as cp -p does, is a new version all the same (its change time
// moved) and is applied.
func TestWatchReadsOnlyNewVersions(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.yaml")
	if err := Write(path, sample()); err != nil {
		t.Fatal(err)
	}
	before, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	checks := countChecks(t, path)
	rec := watchFile(t, path, 10*time.Millisecond)
	rec.last(t, 1)
	later := before.ModTime().Add(time.Hour)
	if err := os.Chtimes(path, later, later); err != nil {
		t.Fatal(err)
	}
	checks.after(t, 2)
	if n := rec.count(); n != 1 {
		t.Fatalf("a touched file produced %d states, want the first one only", n)
	}

	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	edited := bytes.Replace(data, []byte("11.0.2.2"), []byte("11.0.2.9"), 1)
	if len(edited) != len(data) || bytes.Equal(edited, data) {
		t.Fatal("the edit does not keep the size")
	}
	if err := os.WriteFile(path, edited, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, later, later); err != nil {
		t.Fatal(err)
	}
	if after, err := os.Stat(path); err != nil || !after.ModTime().Equal(later) || after.Size() != before.Size() {
		t.Fatalf("the edited file: %v, %v; want the size and modification time of the touched one", after, err)
	}
	want := sample()
	want[0].Endpoints[0].IPs.V4 = []string{"11.0.2.9"}
	if diff := cmp.Diff(want, rec.last(t, 2), equatePrefixes); diff != "" {
		t.Errorf("state after the same-size edit (-want +got):\n%s", diff)
	}
}

// TestReadRefusesWhatIsTooLarge: a sparse file of 1 GiB is refused on its
// size, without being read (a few KiB allocated); a file larger than its
// size says (a /proc file says 0) is cut at the limit while read; what is
// not a regular file is refused.
func TestReadRefusesWhatIsTooLarge(t *testing.T) {
	huge := filepath.Join(t.TempDir(), "huge.yaml")
	f, err := os.Create(huge)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err = Read(huge)
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "1073741824 bytes, more than the limit of 67108864") {
		t.Errorf("Read of a 1 GiB file: %v, want an error naming its size and the limit", err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 1<<20 {
		t.Errorf("Read of a 1 GiB file allocated %d bytes, want it refused before reading", alloc)
	}
	if _, _, err := readFile("/proc/self/maps", 100); err == nil || !strings.Contains(err.Error(), "grew past the limit of 100 bytes") {
		t.Errorf("a file longer than its size: %v, want it cut at the limit", err)
	}
	if _, err := Read("/dev/zero"); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("Read(/dev/zero): %v, want it refused", err)
	}
	// The largest limit there is: the file read whole (its limit + 1,
	// to see it grow, does not overflow).
	small := filepath.Join(t.TempDir(), "small.json")
	if err := os.WriteFile(small, []byte("[]"), 0o600); err != nil {
		t.Fatal(err)
	}
	if data, _, err := readFile(small, math.MaxInt64); err != nil || string(data) != "[]" {
		t.Errorf("a file of 2 bytes with a limit of MaxInt64: %q, %v", data, err)
	}
}

// TestWatchKeepsServingPastAHugeFile replaces a watched state file with a
// sparse file of 1 GiB for a few intervals: nothing is delivered, next to
// nothing allocated, and the next good file is delivered.
func TestWatchKeepsServingPastAHugeFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.yaml")
	if err := Write(path, sample()); err != nil {
		t.Fatal(err)
	}
	checks := countChecks(t, path)
	rec := watchFile(t, path, 20*time.Millisecond)
	rec.last(t, 1)

	huge := filepath.Join(dir, "huge")
	f, err := os.Create(huge)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if err := os.Rename(huge, path); err != nil {
		t.Fatal(err)
	}
	checks.after(t, 15)
	runtime.ReadMemStats(&after)
	if n := rec.count(); n != 1 {
		t.Errorf("the 1 GiB file produced %d states, want the first one only", n)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 4<<20 {
		t.Errorf("%d bytes allocated while the file was 1 GiB, want it not read", alloc)
	}
	changed := sample()
	changed[0].Endpoints = changed[0].Endpoints[:1]
	if err := Write(path, changed); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(changed, rec.last(t, 2), equatePrefixes); diff != "" {
		t.Errorf("state after the huge file (-want +got):\n%s", diff)
	}
}

// TestWatchWaitsForAFileBeingWritten rewrites a watched file in place, as
// an editor may: truncated, then written one service at a time with 5 ms
// pauses, five times over, the file checked every 10 ms. No state with fewer services than the file
// holds whole may be delivered (half a list of services is a valid
// shorter list); the last one is.
func TestWatchWaitsForAFileBeingWritten(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.yaml")
	state := func(gen int) []*model.ServiceEndpoints {
		var items []*model.ServiceEndpoints
		for i := range 5 {
			se := sample()[0]
			se.Service.Name = fmt.Sprintf("svc-%d", i)
			se.Endpoints[0].IPs = model.IPSet{V4: []string{fmt.Sprintf("10.1.%d.%d", gen, i+1)}}
			items = append(items, se)
		}
		return items
	}
	if err := Write(path, state(0)); err != nil {
		t.Fatal(err)
	}
	rec := watchFile(t, path, 10*time.Millisecond)
	rec.last(t, 1)
	for gen := 1; gen <= 5; gen++ {
		// Encoded first: the pauses between the writes are the test's,
		// well under settleDelay even on a loaded machine.
		var chunks [][]byte
		for _, se := range state(gen) {
			b, err := Marshal([]*model.ServiceEndpoints{se})
			if err != nil {
				t.Fatal(err)
			}
			chunks = append(chunks, b)
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range chunks {
			time.Sleep(5 * time.Millisecond)
			if _, err := f.Write(b); err != nil {
				t.Fatal(err)
			}
		}
		f.Close()
		time.Sleep(20 * time.Millisecond)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		rec.mu.Lock()
		states := slices.Clone(rec.states)
		rec.mu.Unlock()
		if last := states[len(states)-1]; cmp.Equal(state(5), last, equatePrefixes) {
			for i, st := range states {
				if len(st) != 5 {
					t.Errorf("state %d of %d holds %d services: half a file was taken", i, len(states), len(st))
				}
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the last state was not delivered (%d states)", len(states))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSettled: a file read when it had not changed for the delay and the
// margin (quietMargin), and still that version, is taken without reading
// it again (where the system gives a file's change time: the data given is
// not compared); one changed within them before the read, or since, is
// read again after the delay, and is taken only if it still holds what
// was read.
func TestSettled(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state.json")
	const delay = 50 * time.Millisecond
	write := func(content string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	read := func() ([]byte, os.FileInfo, time.Time) {
		t.Helper()
		at := time.Now()
		data, fi, err := readFile(path, DefaultMaxSize)
		if err != nil {
			t.Fatal(err)
		}
		return data, fi, at
	}
	write("[]")
	data, fi, at := read()
	if err := settled(ctx, path, DefaultMaxSize, []byte("[1]"), fi, at, delay); err == nil {
		t.Error("written just before the read: taken without reading it again")
	}
	if err := settled(ctx, path, DefaultMaxSize, data, fi, at, delay); err != nil {
		t.Errorf("written just before the read, the same when read again: %v", err)
	}

	time.Sleep(2 * delay)
	_, fi, at = read()
	if err := settled(ctx, path, DefaultMaxSize, []byte("[1]"), fi, at, delay); err == nil {
		t.Error("unchanged for twice the delay, within the margin, before the read: taken without reading it again")
	}
	time.Sleep(delay + quietMargin)
	data, fi, at = read()
	err := settled(ctx, path, DefaultMaxSize, []byte("[1]"), fi, at, delay)
	if changeTime(fi) != 0 && err != nil {
		t.Errorf("unchanged for the delay and the margin before the read: %v, want it taken as read", err)
	}
	if changeTime(fi) == 0 && err == nil {
		t.Error("no change time: taken without reading it again")
	}

	write("[{}]") // since the read
	if err := settled(ctx, path, DefaultMaxSize, data, fi, at, delay); err == nil {
		t.Error("changed since the read: taken")
	}
}

// TestParseByItemMatchesWhole: a YAML list decoded one item at a time
// (ParseState's splitItems) gives what decoding it as a whole gives, the
// errors included, and the shapes splitItems does not take are decoded
// as a whole.
func TestParseByItemMatchesWhole(t *testing.T) {
	written, err := MarshalState(&model.Cluster{ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}}, sample())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		data  string
		split bool
	}{
		{"as written", string(written), true},
		{"comments and blank lines", "# a state\n\n" + string(written) + "\n# the end\n", true},
		{"flow items", "- {Service: {Namespace: a, Name: b, Ports: [{Protocol: 1, Port: 80}]}}\n-   Service: {Namespace: a, Name: c}\n", true},
		{"a null item", "- Service: {Namespace: a, Name: b}\n-\n", true},
		{"a bad field", "- Service: {Namespace: a, Name: b}\n- Service: {Namespace: a, Name: c, Colour: red}\n", true},
		{"a bad source range", "- Service: {Namespace: a, Name: b, LoadBalancerSourceRanges: [nope]}\n", true},
		{"two Cluster items", "- Cluster: {ServiceCIDRs: [10.96.0.0/16]}\n- Cluster: {ServiceCIDRs: [10.97.0.0/16]}\n", true},
		{"a service twice", "- Service: {Namespace: a, Name: b}\n- Service: {Namespace: a, Name: b}\n", true},
		{"an alias to another item", "- Service: &s {Namespace: a, Name: b}\n- Endpoints: []\n  Service: *s\n", true},
		{"a syntax error in one item", "- Service: {Namespace: a, Name: b}\n- Service: {Namespace: a\n", true},
		{"JSON", `[{"Service":{"Namespace":"a","Name":"b"}}]`, false},
		{"JSON with a Cluster item", ` [{"Cluster":{"ServiceCIDRs":["10.96.0.0/16"]}}, {"Service":{"Namespace":"a","Name":"Cluster"}}]` + "\n", false},
		{"JSON with two Cluster items", `[{"Cluster":{"ServiceCIDRs":["10.96.0.0/16"]}},{"Cluster":{}}]`, false},
		{"JSON with a bad field", `[{"Service":{"Namespace":"a","Name":"b"}},{"Service":{"Namespace":"a","Name":"c","Colour":"red"}}]`, false},
		{"JSON with a bad source range", `[{"Service":{"Namespace":"a","Name":"b","LoadBalancerSourceRanges":["nope"]}}]`, false},
		{"JSON with a service twice", `[{"Service":{"Namespace":"a","Name":"b"}},{"Service":{"Namespace":"a","Name":"b"}}]`, false},
		{"JSON, then more", `[{"Service":{"Namespace":"a","Name":"b"}}] [{"Service":{"Namespace":"a","Name":"c"}}]`, false},
		{"JSON cut short", `[{"Service":{"Namespace":"a","Name":"b"}}`, false},
		{"JSON with a syntax error in an item", `[{"Service":{"Namespace":"a","Name":"b"}},{"Service":{"Namespace":"a",}}]`, false},
		{"empty JSON", "[]", false},
		{"two documents", "- Service: {Namespace: a, Name: b}\n---\n- Service: {Namespace: a, Name: c}\n", false},
		{"an indented list", "  - Service: {Namespace: a, Name: b}\n", false},
		{"a mapping", "Service: {Namespace: a, Name: b}\n", false},
		{"empty", "", false},
		{"kpng-json's stream", "{\"Service\":{\"Namespace\":\"a\",\"Name\":\"b\"}}\n{\"Service\":{\"Namespace\":\"a\",\"Name\":\"c\"}}\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, ok := splitItems([]byte(tc.data)); ok != tc.split {
				t.Errorf("splitItems took it: %v, want %v", ok, tc.split)
			}
			c1, items1, err1 := ParseState([]byte(tc.data))
			c2, items2, err2 := parseWhole([]byte(tc.data))
			if fmt.Sprint(err1) != fmt.Sprint(err2) {
				t.Fatalf("error by item %v, whole %v", err1, err2)
			}
			if tc.name == "as written" && (err1 != nil || len(items1) != len(sample()) || c1 == nil) {
				t.Fatalf("the written state parsed to %d services, cluster %v, error %v", len(items1), c1, err1)
			}
			opts := []cmp.Option{cmpopts.EquateComparable(netip.Prefix{}), cmpopts.EquateEmpty()}
			if diff := cmp.Diff(c2, c1, opts...); diff != "" {
				t.Errorf("cluster (-whole +by item):\n%s", diff)
			}
			if diff := cmp.Diff(items2, items1, opts...); diff != "" {
				t.Errorf("services (-whole +by item):\n%s", diff)
			}
		})
	}
}

// TestJSONItems checks which files take the JSON decoder (one JSON array,
// nothing after it) and that each item comes whole.
func TestJSONItems(t *testing.T) {
	for _, tc := range []struct {
		data  string
		items int
		ok    bool
	}{
		{`[]`, 0, true},
		{" \n[{\"Service\":{\"Name\":\"b\"}}, {\"Service\":{\"Name\":\"[c]\"}}]\n", 2, true},
		{`[{"Service":{}}] []`, 0, false},
		{`[{"Service":{}}`, 0, false},
		{`{"Service":{}}`, 0, false},
		{"- Service: {Name: b}\n", 0, false},
		{`[{"Service":{}},]`, 0, false},
	} {
		raws, ok := jsonItems([]byte(tc.data))
		if ok != tc.ok || len(raws) != tc.items {
			t.Errorf("%q: %d items, %v; want %d, %v", tc.data, len(raws), ok, tc.items, tc.ok)
		}
		for _, r := range raws {
			if !json.Valid(r) || r[0] != '{' {
				t.Errorf("%q: item %q", tc.data, r)
			}
		}
	}
}

// TestArrayItems checks which files the fast split takes (one JSON array
// of objects or arrays, nothing after it), that each item comes whole
// (brackets and escaped quotes in strings are not counted), and that the
// items are those of jsonItems.
func TestArrayItems(t *testing.T) {
	for _, tc := range []struct {
		data  string
		items int
		ok    bool
	}{
		{`[]`, 0, true},
		{" [ ] \n", 0, true},
		{" \n[{\"Service\":{\"Name\":\"b\"}}, {\"Service\":{\"Name\":\"[c]\"}}]\n", 2, true},
		{`[{"Name":"a\"]}"},{"Name":"\\"},[[1],{"x":"}"}]]`, 3, true},
		{"[\t{}\r\n,\n{}]", 2, true},
		{`[{"Service":{}}] []`, 0, false},
		{`[{"Service":{}}`, 0, false},
		{`[{"Service":"}]`, 0, false},
		{`{"Service":{}}`, 0, false},
		{"- Service: {Name: b}\n", 0, false},
		{`[{"Service":{}},]`, 0, false},
		{`[{"Service":{}} {"Service":{}}]`, 0, false},
		{`[1, {}]`, 0, false},
		{`[null]`, 0, false},
	} {
		raws, ok := arrayItems([]byte(tc.data))
		if ok != tc.ok || len(raws) != tc.items {
			t.Errorf("%q: %d items, %v; want %d, %v", tc.data, len(raws), ok, tc.items, tc.ok)
		}
		if !ok {
			continue
		}
		want, ok := jsonItems([]byte(tc.data))
		if !ok || len(want) != len(raws) {
			t.Errorf("%q: jsonItems: %d items, %v", tc.data, len(want), ok)
			continue
		}
		for i := range raws {
			if !bytes.Equal(raws[i], want[i]) {
				t.Errorf("%q: item %d %q, jsonItems' %q", tc.data, i, raws[i], want[i])
			}
		}
	}
}

// TestWatchParsesAMalformedVersionOnce replaces a watched file with a
// malformed one (a bad address in its last item), checked every 10 ms:
// it is parsed once, not at every check, nor again when touched or
// copied over itself (same content); the next good file is parsed and
// delivered.
func TestWatchParsesAMalformedVersionOnce(t *testing.T) {
	var parses atomic.Int64
	saved := parseWatched
	parseWatched = func(data []byte) (*model.Cluster, []*model.ServiceEndpoints, error) {
		parses.Add(1)
		return ParseState(data)
	}
	t.Cleanup(func() { parseWatched = saved })

	dir := t.TempDir()
	path := filepath.Join(dir, "state.yaml")
	if err := Write(path, sample()); err != nil {
		t.Fatal(err)
	}
	checks := countChecks(t, path)
	rec := watchFile(t, path, 10*time.Millisecond)
	rec.last(t, 1)
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	malformed := bytes.Replace(good, []byte("1100::202"), []byte("1100::zzz"), 1)
	replace := func(data []byte) {
		t.Helper()
		tmp := filepath.Join(dir, "new")
		if err := os.WriteFile(tmp, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	replace(malformed)
	for deadline := time.Now().Add(10 * time.Second); parses.Load() < 2 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	if n := parses.Load(); n != 2 {
		t.Fatalf("%d parses, want 2: the good file, then the malformed one", n)
	}
	checks.after(t, 30)
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(path, later, later); err != nil {
		t.Fatal(err)
	}
	checks.after(t, 2)
	replace(malformed)
	checks.after(t, 2)
	if n := parses.Load(); n != 2 {
		t.Errorf("%d parses, want 2: the malformed file was parsed again (at every check, or touched, or copied)", n)
	}
	if n := rec.count(); n != 1 {
		t.Errorf("%d states, want the first one only", n)
	}
	changed := sample()
	changed[0].Endpoints = changed[0].Endpoints[:1]
	if err := Write(path, changed); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(changed, rec.last(t, 2), equatePrefixes); diff != "" {
		t.Errorf("state after the malformed file (-want +got):\n%s", diff)
	}
}

// TestWriteIsPrivate: the state file is written mode 0600, also over a
// file that was 0644, and whatever the umask.
func TestWriteIsPrivate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.yaml")
	if err := os.WriteFile(path, []byte("[]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := Write(path, sample()); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if m := fi.Mode().Perm(); m != 0o600 {
			t.Errorf("write %d: mode %v, want -rw------- (the whole state, for its owner only)", i, m)
		}
	}
}
