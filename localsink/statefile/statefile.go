// Package statefile reads and writes the state of a proxier as a file: a
// YAML (or JSON) list of services with their endpoints, with the same field
// names as kpng-json's output. It lets `kpng kube ... to-file` record a
// state and `kpng file ... to-api` replay it, so that backends can be
// developed without a cluster.
//
// The cluster-level facts (model.Cluster: the service CIDRs, which only
// the default proxier gets) are one more item of the list, with the key
// Cluster instead of Service:
//
//   - Cluster:
//     ServiceCIDRs: [10.96.0.0/16, "fd00:10:96::/108"]
//   - Service: {Namespace: default, Name: web, ...}
//     Endpoints: [...]
package statefile

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

// clusterItem is the item of a state file holding the cluster-level
// facts.
type clusterItem struct {
	Cluster *model.Cluster
}

// Marshal encodes a state as YAML.
func Marshal(items []*model.ServiceEndpoints) ([]byte, error) {
	return MarshalState(nil, items)
}

// MarshalState encodes a state with its cluster-level facts (nil: none,
// no Cluster item) as YAML.
func MarshalState(cluster *model.Cluster, items []*model.ServiceEndpoints) ([]byte, error) {
	if cluster.IsZero() {
		if items == nil {
			items = []*model.ServiceEndpoints{}
		}
		return yaml.Marshal(items)
	}
	all := make([]any, 0, 1+len(items))
	all = append(all, clusterItem{Cluster: cluster})
	for _, it := range items {
		all = append(all, it)
	}
	return yaml.Marshal(all)
}

// Write writes a state to path atomically: a temporary file in the same
// directory, flushed to the disk, renamed over it. A reader never sees half
// a file, and when the write fails (a full disk, say) path keeps its
// previous content whole and the temporary file is removed. The file is
// mode 0600: readable by its owner only.
func Write(path string, items []*model.ServiceEndpoints) error {
	return WriteState(path, nil, items)
}

// WriteState is Write with the cluster-level facts (nil: none).
func WriteState(path string, cluster *model.Cluster, items []*model.ServiceEndpoints) error {
	data, err := MarshalState(cluster, items)
	if err != nil {
		return fmt.Errorf("encode state: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write state %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write state %s (%d bytes): %w", path, len(data), err)
	}
	// The whole state of the proxier (every service and endpoint): for
	// its owner only, whatever the umask and the mode of the file
	// replaced.
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("write state %s: %w", path, err)
	}
	// Without it, a crash soon after the rename can leave an empty file
	// (the rename reaches the disk before the data).
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("write state %s (%d bytes): %w", path, len(data), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write state %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write state %s: %w", path, err)
	}
	return nil
}

// fileSink is the Sink of NewSink.
type fileSink struct {
	*localsink.FullState
	path string
}

// NewSink returns a localsink.Sink (a localsink.ClusterSink too) that
// writes the whole state, with its cluster-level facts, to path
// (WriteState) on each Sync and returns the write's error: the source's
// Feeder then calls Sync again after a backoff, so that the file catches
// up once the write can succeed (space freed on a full disk), whether or
// not the state changes meanwhile; until then path keeps the last state
// written, whole.
func NewSink(path string) localsink.Sink {
	return fileSink{FullState: localsink.NewFullState(func([]*model.ServiceEndpoints) {}), path: path}
}

// Sync implements localsink.Sink.
func (f fileSink) Sync() error {
	items := f.State()
	if err := WriteState(f.path, f.Cluster(), items); err != nil {
		return err
	}
	klog.V(2).InfoS("Wrote state file", "path", f.path, "services", len(items))
	return nil
}

// DefaultMaxSize is the largest state file Read and Watch read unless told
// otherwise: 64 MiB, some five times a state of 10,000 services of 10
// endpoints (13 MB of YAML, whose decoding allocates about 70 times its
// size in all).
const DefaultMaxSize = 64 << 20

// readFile reads the regular file path, refusing one larger than maxSize
// bytes: on its size before reading it, and while reading it (a file
// that grows meanwhile), so that reading never holds more than maxSize+1
// bytes.
func readFile(path string, maxSize int64) ([]byte, os.FileInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	switch {
	case !fi.Mode().IsRegular():
		return nil, nil, fmt.Errorf("%s is not a regular file (%v)", path, fi.Mode().Type())
	case fi.Size() > maxSize:
		return nil, nil, fmt.Errorf("%s is %d bytes, more than the limit of %d", path, fi.Size(), maxSize)
	}
	// Read into a buffer of the size the file has (one byte more, to see
	// it grow): io.ReadAll's doubling copied a 49 MB file about twice
	// over.
	maxSize = min(maxSize, math.MaxInt64-1) // maxSize+1 below
	data := make([]byte, 0, min(fi.Size(), maxSize)+1)
	for int64(len(data)) <= maxSize {
		if len(data) == cap(data) {
			data = append(data, 0)[:len(data)]
		}
		n, err := f.Read(data[len(data):min(int64(cap(data)), maxSize+1)])
		data = data[:len(data)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, nil, err
		}
	}
	if int64(len(data)) > maxSize {
		return nil, nil, fmt.Errorf("%s grew past the limit of %d bytes while read", path, maxSize)
	}
	return data, fi, nil
}

// sameVersion reports whether a and b (of one path) describe the same
// version of a file: the same file (device and inode), size, modification
// time and, where the system has one, change time (which a write or a
// copy keeping the times, cp -p, changes too).
func sameVersion(a, b os.FileInfo) bool {
	return a != nil && b != nil && os.SameFile(a, b) && a.Size() == b.Size() &&
		a.ModTime().Equal(b.ModTime()) && changeTime(a) == changeTime(b)
}

// Read reads and checks a state file of at most DefaultMaxSize bytes (its
// services: ParseState has the cluster-level facts too).
func Read(path string) ([]*model.ServiceEndpoints, error) {
	data, _, err := readFile(path, DefaultMaxSize)
	if err != nil {
		return nil, fmt.Errorf("read state: %w", err)
	}
	items, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("state file %s: %w", path, err)
	}
	return items, nil
}

// Parse decodes a state: a YAML or JSON list of services, or a stream of
// YAML documents or JSON objects, one per service (kpng-json's output).
// Addresses and source ranges are put in canonical form; a malformed item
// is an error naming it and its field. A Cluster item is checked and left
// out (ParseState returns it).
func Parse(data []byte) ([]*model.ServiceEndpoints, error) {
	_, items, err := ParseState(data)
	return items, err
}

// ParseState is Parse with the cluster-level facts of the Cluster item
// (nil without one; at most one item may hold them).
//
// A YAML file whose top level is a block sequence written from the first
// column (what Marshal and `kpng kube … to-file` write) is decoded one
// item at a time (splitItems): the YAML decoder holds a whole document as
// a tree of nodes and then of generic values, about 30 times the size of
// the text (a state of 50,000 services × 10 endpoints, 49 MB of YAML, took
// 1.5 GiB to decode at once), its items on every CPU (parseItems). A
// JSON array of objects is split by its brackets (arrayItems), another
// JSON array by the JSON decoder (jsonItems), and its items decoded as
// JSON. Any other shape, or an item that does not decode alone, is decoded
// as a whole, as before: the result and the errors are the same either
// way.
func ParseState(data []byte) (*model.Cluster, []*model.ServiceEndpoints, error) {
	if raws, ok := arrayItems(data); ok {
		c, items, err := parseItems(len(raws), func(i int) (json.RawMessage, error) { return raws[i], nil })
		if err == nil || json.Valid(data) {
			// Valid JSON: jsonItems would split the same items.
			return c, items, err
		}
		// Not JSON: read again as below, for the same message.
	}
	if raws, ok := jsonItems(data); ok {
		return parseItems(len(raws), func(i int) (json.RawMessage, error) { return raws[i], nil })
	}
	if parts, ok := splitItems(data); ok {
		c, items, err := parseItems(len(parts), func(i int) (json.RawMessage, error) { return yaml.YAMLToJSON(parts[i]) })
		if errors.Is(err, errNotAlone) {
			return parseWhole(data)
		}
		return c, items, err
	}
	return parseWhole(data)
}

// errNotAlone is parseItems' error when an item does not convert alone
// (a YAML item referring to another's anchor, a syntax error): ParseState
// then decodes the file as a whole, for its answer and error.
var errNotAlone = errors.New("an item does not decode alone")

// parseItems decodes the n items of one document that raw gives as JSON,
// each apart and on every CPU (a YAML item's conversion to JSON is most
// of a large file's decoding: 50,000 services × 10 endpoints, 49 MB,
// took 7.4 s on one), then puts them together in order, so that the
// result and the first error are those of decoding them one after the
// other. An error of raw is errNotAlone.
func parseItems(n int, raw func(i int) (json.RawMessage, error)) (*model.Cluster, []*model.ServiceEndpoints, error) {
	decoded := make([]decodedItem, n)
	var next atomic.Int64
	var notAlone atomic.Bool
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), n) {
		wg.Go(func() {
			for !notAlone.Load() {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				r, err := raw(i)
				if err != nil {
					notAlone.Store(true)
					return
				}
				d := decodeItem(i, 0, r)
				if d.err == nil && !d.isCluster {
					d.check = checkItem(i, d.se)
				}
				decoded[i] = d
			}
		})
	}
	wg.Wait()
	if notAlone.Load() {
		return nil, nil, errNotAlone
	}
	st := state{clusterAt: -1}
	for _, d := range decoded {
		if err := st.put(d); err != nil {
			return nil, nil, err
		}
	}
	// Each service was checked where it was decoded; st.pos[n] is the
	// place of service n among the items.
	return st.cluster, st.items, checkKeys(st.items, st.pos, func(n int) itemCheck { return decoded[st.pos[n]].check })
}

// arrayItems returns the items of data when it is a JSON array of
// objects (or arrays), as slices of data, and ok; ok is false for
// anything else, which jsonItems reads. It only finds where each item
// begins and ends, by its brackets outside strings, without copying it:
// decoding an item checks it (strictJSON), and an item that is not JSON
// fails there. At 50,000 services (49 MB), jsonItems' decoder took 0.35
// s of a cold start to split them.
func arrayItems(data []byte) (raws []json.RawMessage, ok bool) {
	i := skipSpace(data, 0)
	if i == len(data) || data[i] != '[' {
		return nil, false
	}
	raws = []json.RawMessage{}
	// closed returns raws when the array's "]" at data[at] ends data but
	// for white space.
	closed := func(at int) ([]json.RawMessage, bool) {
		if skipSpace(data, at+1) != len(data) {
			return nil, false
		}
		return raws, true
	}
	if i = skipSpace(data, i+1); i < len(data) && data[i] == ']' {
		return closed(i)
	}
	for i < len(data) {
		end, ok := valueEnd(data, i)
		if !ok {
			return nil, false
		}
		raws = append(raws, json.RawMessage(data[i:end:end]))
		switch i = skipSpace(data, end); {
		case i < len(data) && data[i] == ',':
			i = skipSpace(data, i+1)
		case i < len(data) && data[i] == ']':
			return closed(i)
		default:
			return nil, false
		}
	}
	return nil, false
}

// skipSpace returns the offset of the first byte of data from i on that
// is not JSON white space (len(data): none).
func skipSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\n' || data[i] == '\r' || data[i] == '\t') {
		i++
	}
	return i
}

// valueEnd returns the offset after the object or array starting at
// data[i], found by counting brackets outside strings, and ok; ok is false
// when data[i] opens neither or the brackets do not close.
func valueEnd(data []byte, i int) (end int, ok bool) {
	if data[i] != '{' && data[i] != '[' {
		return 0, false
	}
	depth := 0
	for ; i < len(data); i++ {
		switch data[i] {
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return i + 1, true
			}
		case '"':
			// To the closing quote: the first one not escaped.
			for i++; i < len(data) && data[i] != '"'; i++ {
				if data[i] == '\\' {
					i++
				}
			}
		}
	}
	return 0, false
}

// jsonItems returns the items of data when it is one JSON array (what
// kpng-json and other programs write), each as it is in data, and ok.
// ok is false for anything else (YAML, or JSON that does not decode),
// which ParseState decodes as a whole: the YAML decoder would read JSON
// too, but about ten times as slowly (9.1 s for 50,000 services × 10
// endpoints, 41 MB). A key given twice in an item takes its last value,
// as encoding/json decodes it.
func jsonItems(data []byte) (raws []json.RawMessage, ok bool) {
	trimmed := bytes.TrimLeft(data, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '[' {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('[') {
		return nil, false
	}
	for dec.More() {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, false
		}
		raws = append(raws, raw)
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim(']') {
		return nil, false
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, false
	}
	return raws, true
}

// parseWhole is ParseState decoding each document as a whole.
func parseWhole(data []byte) (*model.Cluster, []*model.ServiceEndpoints, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	st := state{clusterAt: -1}
	for doc := 0; ; doc++ {
		var raw json.RawMessage
		err := dec.Decode(&raw)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, fmt.Errorf("document %d: %w", doc, err)
		}
		raw = bytes.TrimSpace(raw)
		if len(raw) == 0 || string(raw) == "null" {
			continue
		}
		raws := []json.RawMessage{raw}
		if raw[0] == '[' {
			raws = nil
			if err := json.Unmarshal(raw, &raws); err != nil {
				return nil, nil, fmt.Errorf("document %d: %w", doc, err)
			}
		}
		for _, r := range raws {
			if err := st.add(doc, r); err != nil {
				return nil, nil, err
			}
		}
	}
	return st.cluster, st.items, check(st.items, st.pos)
}

// state is what ParseState has read so far: the services, each one's
// position in the list (for messages), the cluster-level facts and the
// position of their item (-1: none yet), the position of the next item.
type state struct {
	items     []*model.ServiceEndpoints
	pos       []int
	cluster   *model.Cluster
	clusterAt int
	item      int
}

// add decodes item r of document doc.
func (st *state) add(doc int, r json.RawMessage) error {
	return st.put(decodeItem(st.item, doc, r))
}

// decodedItem is an item decoded: the cluster-level facts (isCluster) or
// a service, or the error of either.
type decodedItem struct {
	isCluster bool
	cluster   *model.Cluster
	se        *model.ServiceEndpoints
	err       error
	// check is what checkItem found in the service (parseItems).
	check itemCheck
}

// decodeItem decodes item i (r) of document doc.
func decodeItem(i, doc int, r json.RawMessage) decodedItem {
	if c, ok, err := parseCluster(i, r); ok {
		return decodedItem{isCluster: true, cluster: c, err: err}
	}
	var one *model.ServiceEndpoints
	if err := strictJSON(r, &one); err != nil {
		if rangeErr := badSourceRange(i, r); rangeErr != nil {
			return decodedItem{err: rangeErr}
		}
		return decodedItem{err: fmt.Errorf("document %d: %w", doc, err)}
	}
	return decodedItem{se: one}
}

// put adds the next item, decoded.
func (st *state) put(d decodedItem) error {
	if d.err != nil {
		return d.err
	}
	if d.isCluster {
		if st.clusterAt >= 0 {
			return fmt.Errorf("item %d: a second Cluster item (the first is item %d)", st.item, st.clusterAt)
		}
		st.cluster, st.clusterAt = d.cluster, st.item
		st.item++
		return nil
	}
	st.items = append(st.items, d.se)
	st.pos = append(st.pos, st.item)
	st.item++
	return nil
}

// splitItems returns the items of data when it is one YAML document whose
// top level is a block sequence starting in the first column, each item
// as a YAML document of its own (its "-" turned into a space, so that its
// content keeps its indentation), and ok. ok is false for anything else
// (JSON, several documents, a directive, a mapping or a scalar at the top,
// an indented sequence, tabs in the first column), which ParseState
// decodes as a whole. Comments and blank lines in the first column are
// kept with the item before them.
func splitItems(data []byte) (items [][]byte, ok bool) {
	start := -1 // the current item's first byte
	for off := 0; off < len(data); {
		end := bytes.IndexByte(data[off:], '\n')
		if end < 0 {
			end = len(data)
		} else {
			end += off + 1
		}
		line := data[off:end]
		switch {
		case line[0] == '-' && (len(line) == 1 || line[1] == ' ' || line[1] == '\n' || line[1] == '\r'):
			if start >= 0 {
				items = append(items, item(data[start:off]))
			}
			start = off
		case line[0] == ' ' && start >= 0, line[0] == '#', len(bytes.TrimSpace(line)) == 0 && line[0] != '\t':
		default:
			return nil, false
		}
		off = end
	}
	if start < 0 {
		return nil, false
	}
	return append(items, item(data[start:])), true
}

// item returns a copy of the text of a sequence item with its leading
// "-" turned into a space.
func item(text []byte) []byte {
	out := bytes.Clone(text)
	out[0] = ' '
	return out
}

// parseCluster decodes item i (raw) when it is the Cluster item (ok),
// naming the item and the field of what is wrong in it.
func parseCluster(i int, raw []byte) (cluster *model.Cluster, ok bool, err error) {
	if !bytes.Contains(raw, []byte(`"Cluster"`)) {
		// No such key (a value "Cluster", a traffic policy, goes on).
		return nil, false, nil
	}
	var keys map[string]json.RawMessage
	if json.Unmarshal(raw, &keys) != nil {
		return nil, false, nil
	}
	if _, ok := keys["Cluster"]; !ok {
		return nil, false, nil
	}
	var c struct {
		Cluster *struct {
			ServiceCIDRs []string
		}
	}
	if err := strictJSON(raw, &c); err != nil {
		return nil, true, fmt.Errorf("item %d: Cluster: %w (a Cluster item holds only the key Cluster)", i, err)
	}
	if c.Cluster == nil {
		return nil, true, nil
	}
	cidrs, bad := model.ParseCIDRs(c.Cluster.ServiceCIDRs...)
	if len(bad) > 0 {
		return nil, true, fmt.Errorf("item %d: Cluster.ServiceCIDRs: %q is not a usable CIDR", i, bad[0])
	}
	if len(cidrs) == 0 {
		return nil, true, nil
	}
	return &model.Cluster{ServiceCIDRs: cidrs}, true, nil
}

func strictJSON(raw []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.DisallowUnknownFields()
	return d.Decode(v)
}

// badSourceRange returns the error of the first source range of item i
// (raw) that is not a CIDR, naming the item, its service and the field;
// nil if there is none. The JSON decoder's own error for it names neither
// (netip.Prefix decodes itself from text).
func badSourceRange(i int, raw []byte) error {
	var head struct {
		Service *struct {
			Namespace, Name          string
			LoadBalancerSourceRanges []string
		}
	}
	if json.Unmarshal(raw, &head) != nil || head.Service == nil {
		return nil
	}
	svc := head.Service
	for j, r := range svc.LoadBalancerSourceRanges {
		if _, err := netip.ParsePrefix(r); err != nil {
			return fmt.Errorf("item %d (service %s/%s): Service.LoadBalancerSourceRanges[%d]: %q is not a usable CIDR: %w", i, svc.Namespace, svc.Name, j, r, err)
		}
	}
	return nil
}

// check validates items and canonicalizes their addresses in place; pos
// are their positions in the file's list, for messages.
func check(items []*model.ServiceEndpoints, pos []int) error {
	return checkKeys(items, pos, func(n int) itemCheck { return checkItem(pos[n], items[n]) })
}

// checkKeys returns the first problem of items in their order: those
// checkItem found (checked(n) for items[n], which it may have found
// before, in parallel), and a service listed twice, which only the whole
// list shows: an item's problems found before comparing its key come
// first, then its key, then the others.
func checkKeys(items []*model.ServiceEndpoints, pos []int, checked func(n int) itemCheck) error {
	seen := make(map[model.ServiceKey]int, len(items))
	for n, se := range items {
		c := checked(n)
		if c.before != nil {
			return c.before
		}
		i, key := pos[n], se.Service.Key()
		if j, dup := seen[key]; dup {
			return fmt.Errorf("item %d (service %s): same service as item %d", i, key, j)
		}
		seen[key] = i
		if c.after != nil {
			return c.after
		}
	}
	return nil
}

// itemCheck is what checkItem found wrong in an item: before is a
// problem found before its key may be compared with the other items'
// (no service, no name), after one found after.
type itemCheck struct {
	before, after error
}

// checkItem validates item i (se) alone and canonicalizes its addresses
// in place.
func checkItem(i int, se *model.ServiceEndpoints) itemCheck {
	if se == nil || se.Service == nil {
		return itemCheck{before: fmt.Errorf("item %d: no Service", i)}
	}
	svc := se.Service
	if svc.Namespace == "" || svc.Name == "" {
		return itemCheck{before: fmt.Errorf("item %d: Service.Namespace and Service.Name are required", i)}
	}
	// Kubernetes refuses such names; a file is not checked by it, and
	// names reach rule text, comments and logs.
	if err := se.CheckNames(); err != nil {
		return itemCheck{before: fmt.Errorf("item %d: %w", i, err)}
	}
	return itemCheck{after: checkFields(i, se)}
}

// checkFields validates the addresses, source ranges, ports and
// endpoints of item i (se), which has a service with a name, and
// canonicalizes its addresses in place.
func checkFields(i int, se *model.ServiceEndpoints) error {
	svc := se.Service
	key := svc.Key()
	var err error
	for _, f := range []struct {
		name string
		set  *model.IPSet
	}{
		{"Service.IPs.ClusterIPs", &svc.IPs.ClusterIPs}, {"Service.IPs.ExternalIPs", &svc.IPs.ExternalIPs},
		{"Service.IPs.LoadBalancerIPs", &svc.IPs.LoadBalancerIPs},
	} {
		if *f.set, err = canonical(*f.set); err != nil {
			return fmt.Errorf("item %d (service %s): %s: %w", i, key, f.name, err)
		}
	}
	for j, r := range svc.LoadBalancerSourceRanges {
		switch _, bad := model.CanonicalCIDRs([]netip.Prefix{r}); {
		case !r.IsValid(): // "" decodes as the zero Prefix
			return fmt.Errorf("item %d (service %s): Service.LoadBalancerSourceRanges[%d]: empty, not a CIDR", i, key, j)
		case len(bad) > 0:
			return fmt.Errorf("item %d (service %s): Service.LoadBalancerSourceRanges[%d]: %q is not a usable CIDR (an IPv4-mapped prefix shorter than /96)", i, key, j, r)
		}
	}
	svc.LoadBalancerSourceRanges, _ = model.CanonicalCIDRs(svc.LoadBalancerSourceRanges)
	for j, p := range svc.Ports {
		if p == nil || p.Protocol < model.TCP || p.Protocol > model.SCTP {
			return fmt.Errorf("item %d (service %s): Service.Ports[%d].Protocol: want 1 (TCP), 2 (UDP) or 3 (SCTP)", i, key, j)
		}
	}
	eps := make(map[string]bool, len(se.Endpoints))
	for j, ep := range se.Endpoints {
		if ep == nil {
			return fmt.Errorf("item %d (service %s): Endpoints[%d] is null", i, key, j)
		}
		if ep.IPs, err = canonical(ep.IPs); err != nil {
			return fmt.Errorf("item %d (service %s): Endpoints[%d].IPs: %w", i, key, j, err)
		}
		k := ep.Key()
		if k == "" {
			return fmt.Errorf("item %d (service %s): Endpoints[%d].IPs: no address", i, key, j)
		}
		if eps[k] {
			return fmt.Errorf("item %d (service %s): Endpoints[%d]: address %s listed twice", i, key, j, k)
		}
		eps[k] = true
	}
	return nil
}

func canonical(s model.IPSet) (model.IPSet, error) {
	out, bad := model.NewIPSet(s.All()...)
	if len(bad) > 0 {
		return s, fmt.Errorf("invalid address %q", bad[0])
	}
	return out, nil
}

// Watch feeds sink the state in path (with its cluster-level facts, for a
// localsink.ClusterSink), then every change to it, checking the file every
// interval, until ctx ends. A file that cannot be read, is larger than
// maxSize bytes (0: DefaultMaxSize; it is not read then), is empty (an
// empty state is "[]") or is malformed is logged and ignored: the sink
// keeps the last good state. A new content is taken once it reads the
// same twice, settleDelay (100 ms) apart, or at once when it had not
// changed for settleDelay + quietMargin when read (settled): a file written in place,
// truncated and then filled, is seen half-written in between, and half a
// list of services can be a valid shorter list. The first state is only
// delivered once the file has been read successfully. A round the sink
// fails to apply is delivered again (localsink.Feeder).
func Watch(ctx context.Context, path string, interval time.Duration, maxSize int64, sink localsink.Sink) error {
	return WatchWithOptions(ctx, path, interval, maxSize, sink, localsink.FeederOptions{})
}

// WatchWithOptions is Watch with the options of its Feeder: Observe and
// Queued give the rounds to metrics (client.Flags.StartMetrics).
func WatchWithOptions(ctx context.Context, path string, interval time.Duration, maxSize int64, sink localsink.Sink, opts localsink.FeederOptions) error {
	if maxSize <= 0 {
		maxSize = DefaultMaxSize
	}
	feeder := localsink.NewFeeder(sink, opts)
	defer feeder.Close()
	// last is the version of the file last read whole and found equal
	// to the state fed, whose content's hash is lastSum (have: there is
	// one): a check finding the same version does not read the file
	// again, a check finding another reads it and feeds it only if its
	// content differs (at 50,000 services, reading and comparing the
	// 49 MB of the file every second, and holding a copy, cost more
	// than the rest of an idle proxier).
	var last os.FileInfo
	var lastSum [sha256.Size]byte
	have := false
	// bad is the version of the file last found malformed, and badSum
	// its content's hash (haveBad: there is one), remembered as the good
	// one is: a malformed file is parsed once, not at every check (a
	// 30 MB file with one bad address at its end took 27 CPU-seconds to
	// parse), and its error logged once.
	var bad os.FileInfo
	var badSum [sha256.Size]byte
	haveBad := false
	logged := ""
	for {
		var err error
		fi, statErr := os.Stat(path)
		known := statErr == nil && (have && sameVersion(fi, last) || haveBad && sameVersion(fi, bad))
		if !known {
			var data []byte
			var read os.FileInfo
			readAt := time.Now()
			data, read, err = readFile(path, maxSize)
			sum := sha256.Sum256(data)
			switch {
			case err != nil:
			case have && sum == lastSum:
				last = read // the same content (touched, rewritten)
			case haveBad && sum == badSum:
				bad = read // the malformed content again (touched, copied)
			default:
				err = settled(ctx, path, maxSize, data, read, readAt, settleDelay)
				var items []*model.ServiceEndpoints
				var cluster *model.Cluster
				if err == nil {
					cluster, items, err = parseWatched(data)
					if err != nil {
						bad, badSum, haveBad = read, sum, true
					}
				}
				if err == nil {
					klog.V(2).InfoS("Loaded state file", "path", path, "services", len(items))
					feeder.SetCluster(cluster)
					feeder.SetAll(items)
					_ = feeder.Sync() // logged by the Feeder, retried
					last, lastSum, have = read, sum, true
					haveBad = false
					logged = ""
				} else {
					err = fmt.Errorf("state file %s: %w", path, err)
				}
			}
		}
		if err != nil && err.Error() != logged && ctx.Err() == nil {
			klog.ErrorS(err, "Keeping the last good state")
			logged = err.Error()
		}
		watchChecked(path, err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(interval):
		}
	}
}

// parseWatched is ParseState, for Watch (tests count its calls).
var parseWatched = ParseState

// watchChecked is called by Watch after each check of the file at path,
// with the check's error (nil: the state fed, or the file unchanged):
// tests wait for checks with it instead of sleeping.
var watchChecked = func(path string, err error) {}

// settleDelay is how long a new content of a watched file must stay the
// same before it is taken.
const settleDelay = 100 * time.Millisecond

// quietMargin is added to the settle delay for how long before its read
// a file must have last changed for settled to take it without reading it
// again: a margin for filesystems that keep times to the second or two
// (ext4 with small inodes, FAT) and for a clock that differs a little from
// the one that stamped the file (NFS).
const quietMargin = 3 * time.Second

// settled says whether path, read at readAt as data (which must not be
// empty) in the version read, has settled: it had not changed for delay
// + quietMargin (3 s) when read and is still that version (where the
// system gives a file's change time, which no call sets), or else it
// still holds data when read again after delay. At 50,000 services, the
// wait and the second read of the 49 MB were about 0.3 s of a cold start,
// for a file written long before.
func settled(ctx context.Context, path string, maxSize int64, data []byte, read os.FileInfo, readAt time.Time, delay time.Duration) error {
	if len(bytes.TrimSpace(data)) == 0 {
		return errors.New("the file is empty (being written? an empty state is written [])")
	}
	if ct := changeTime(read); ct != 0 && readAt.Sub(time.Unix(0, ct)) >= delay+quietMargin {
		if now, err := os.Stat(path); err == nil && sameVersion(now, read) {
			return nil
		}
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(delay):
	}
	again, _, err := readFile(path, maxSize)
	if err != nil {
		return err
	}
	if !bytes.Equal(again, data) {
		return errors.New("the file changed while read (being written?): read again at the next check")
	}
	return nil
}
