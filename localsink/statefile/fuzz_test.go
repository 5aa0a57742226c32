package statefile

import (
	"bytes"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"net/netip"
)

// FuzzParse: a state file of any content is parsed without a panic, and
// what parses writes back to a file that parses to the same state.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		"",
		"[]",
		"- Service: {Namespace: default, Name: web, Type: ClusterIP, IPs: {ClusterIPs: {V4: [10.96.0.10]}}, Ports: [{Protocol: 1, Port: 80, TargetPort: 8080}]}\n  Endpoints: [{IPs: {V4: [10.1.0.2]}, Local: true, Ready: true}]\n",
		`[{"Service":{"Namespace":"a","Name":"b","IPs":{"ExternalIPs":{"V6":["1000::55"]},"Headless":true},"LoadBalancerSourceRanges":["10.0.0.0/8"],"Ports":[{"Name":"p","Protocol":2,"Port":53,"NodePort":30053,"TargetPortName":"dns"}]},"Endpoints":[{"IPs":{"V6":["1100::202"]},"PortOverrides":{"p":5353}}]}]`,
		"- Service: {Namespace: a, Name: b, LoadBalancerSourceRanges: ['::ffff:0.0.0.0/90']}\n",
		"- Service: null\n",
		"- {Service: {Namespace: a, Name: b}, Endpoints: [null]}\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		items, err := Parse(data)
		if err != nil {
			return
		}
		out, err := Marshal(items)
		if err != nil {
			t.Fatalf("Marshal of a parsed state: %v", err)
		}
		again, err := Parse(out)
		if err != nil {
			t.Fatalf("a written state does not parse: %v\n%s", err, out)
		}
		if diff := cmp.Diff(items, again, cmpopts.EquateComparable(netip.Prefix{}), cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("written and parsed again (-first +second):\n%s", diff)
		}
	})
}

// FuzzArrayItems: whatever the content, the fast split of a JSON array
// agrees with the decoder's (jsonItems) when both take it, and takes every
// array of objects or arrays that the decoder takes.
func FuzzArrayItems(f *testing.F) {
	for _, seed := range []string{"[]", `[{"a":"]"},[1,{"b":"\\\""}]]`, `[{}, 1]`, `[{"a":1}`, `[{} {}]`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fast, fastOK := arrayItems(data)
		slow, slowOK := jsonItems(data)
		if !slowOK {
			return
		}
		containers := true
		for _, r := range slow {
			containers = containers && (r[0] == '{' || r[0] == '[')
		}
		if containers && !fastOK {
			t.Fatalf("%q: the decoder splits it in %d items, the fast split not", data, len(slow))
		}
		if !fastOK {
			return
		}
		if len(fast) != len(slow) {
			t.Fatalf("%q: %d items, the decoder's %d", data, len(fast), len(slow))
		}
		for i := range fast {
			if !bytes.Equal(fast[i], slow[i]) {
				t.Fatalf("%q: item %d %q, the decoder's %q", data, i, fast[i], slow[i])
			}
		}
	})
}
