package model

import (
	"errors"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

// hostileNames are names Kubernetes refuses, some of which would break or
// write rule text, listings or log lines.
var hostileNames = []string{
	"", "-", "a-", "-a", "A", "a_b", "a b", "a.b", "a..b", ".a", "a.", "é", "a\"b", "a\nb", "a\x00b", "a;b", "a}b",
	"a/b", "a:b", "1", "123", "1a", "a--b", strings.Repeat("a", 63), strings.Repeat("a", 64), strings.Repeat("a.", 126) + "a",
	strings.Repeat("a", 254), strings.Repeat("ab.", 84) + "a", "abcdefghijklmno", "abcdefghijklmnop", "web", "kube-dns", "http",
	"node-1.example.com", "x--1", "1-2",
}

// TestNameRulesAgreeWithTheAPIServer compares each of the model's name
// checks with the API server's (k8s.io/apimachinery's validation) on
// good and hostile names: they must accept the same ones.
func TestNameRulesAgreeWithTheAPIServer(t *testing.T) {
	rules := []struct {
		name   string
		ours   func(string) string
		theirs func(string) []string
	}{
		{"DNS-1123 label", dns1123Label, validation.IsDNS1123Label},
		{"DNS-1035 label", dns1035Label, validation.IsDNS1035Label},
		{"DNS-1123 subdomain", dns1123Subdomain, validation.IsDNS1123Subdomain},
		{"IANA service name", ianaServiceName, validation.IsValidPortName},
	}
	for _, r := range rules {
		for _, s := range hostileNames {
			why, errs := r.ours(s), r.theirs(s)
			if (why == "") != (len(errs) == 0) {
				t.Errorf("%s %q: ours says %q, the API server's %q", r.name, s, why, errs)
			}
		}
	}
}

// TestCheckNames: a bad name anywhere in a service or its endpoints is a
// BadField Problem naming the service and the field, its value quoted
// (one line, whatever the value holds).
func TestCheckNames(t *testing.T) {
	good := func() *ServiceEndpoints {
		return &ServiceEndpoints{
			Service: &Service{Namespace: "default", Name: "web", Ports: []*PortMapping{
				{Name: "http", Protocol: TCP, Port: 80, TargetPortName: "http"}, nil, {Protocol: UDP, Port: 53}}},
			Endpoints: []*Endpoint{{NodeName: "node-1.example.com", PortOverrides: map[string]int32{"http": 8080, "": 80},
				Hints: &Hints{Nodes: []string{"node-1"}}}, {}},
		}
	}
	if err := good().CheckNames(); err != nil {
		t.Fatalf("good service: %v", err)
	}
	cases := []struct {
		field string
		edit  func(*ServiceEndpoints)
	}{
		{"metadata.namespace", func(se *ServiceEndpoints) { se.Service.Namespace = "a\nb" }},
		{"metadata.namespace", func(se *ServiceEndpoints) { se.Service.Namespace = strings.Repeat("é", 40) }},
		{"metadata.name", func(se *ServiceEndpoints) { se.Service.Name = `x"; flush ruleset; "` }},
		{"metadata.name", func(se *ServiceEndpoints) { se.Service.Name = "1web" }},
		{"spec.ports[0].name", func(se *ServiceEndpoints) { se.Service.Ports[0].Name = "a}b" }},
		{"spec.ports[0].targetPort", func(se *ServiceEndpoints) { se.Service.Ports[0].TargetPortName = "a\x00" }},
		{"endpoints[0].nodeName", func(se *ServiceEndpoints) { se.Endpoints[0].NodeName = strings.Repeat("n\n", 32<<10) }},
		{"endpoints[0].hints.forNodes[0]", func(se *ServiceEndpoints) { se.Endpoints[0].Hints.Nodes[0] = "a;b" }},
		{"endpoints[1].ports[].name", func(se *ServiceEndpoints) { se.Endpoints[1].PortOverrides = map[string]int32{"A": 1} }},
	}
	for _, c := range cases {
		se := good()
		c.edit(se)
		err := se.CheckNames()
		p, ok := errors.AsType[*Problem](err)
		if !ok {
			t.Errorf("%s: got %v, want a *Problem", c.field, err)
			continue
		}
		if p.Field != c.field || p.Reason != ReasonBadField || p.Service != se.Service.Key() {
			t.Errorf("%s: got field %q, reason %s, service %q", c.field, p.Field, p.Reason, p.Service)
		}
		if !strings.Contains(p.Message, c.field) || strings.ContainsAny(p.Message, "\n\x00") || len(p.Message) > 3*MaxQuoted+200 {
			t.Errorf("%s: message not one bounded line naming the field: %q", c.field, p.Message)
		}
	}
}

// TestQuote: a value is quoted on one line, cut on a character boundary
// past MaxQuoted bytes with its whole length.
func TestQuote(t *testing.T) {
	cases := []struct{ in, want string }{
		{"web", `"web"`},
		{"a\nb\x00\"", `"a\nb\x00\""`},
		{strings.Repeat("a", MaxQuoted), `"` + strings.Repeat("a", MaxQuoted) + `"`},
		{strings.Repeat("a", 70000), `"` + strings.Repeat("a", MaxQuoted) + `"…(70000 bytes)`},
		// 2-byte characters: byte 253 is inside the 127th, cut before it.
		{strings.Repeat("é", 200), `"` + strings.Repeat("é", 126) + `"…(400 bytes)`},
	}
	for _, c := range cases {
		if got := Quote(c.in); got != c.want {
			t.Errorf("Quote(%.20q…) = %.60q…, want %.60q…", c.in, got, c.want)
		}
	}
}

// TestLogValue: a short printable one-line value is logged as it is (klog
// quotes it); anything else is quoted and bounded (klog writes a string
// holding a newline as several lines).
func TestLogValue(t *testing.T) {
	for in, want := range map[string]string{
		"node-1":                 "node-1",
		"nœud 1":                 "nœud 1",
		"a\nb":                   `"a\nb"`,
		"a\x00":                  `"a\x00"`,
		"\xff":                   `"\xff"`,
		strings.Repeat("x", 300): `"` + strings.Repeat("x", MaxQuoted) + `"…(300 bytes)`,
	} {
		if got := LogValue(in); got != want {
			t.Errorf("LogValue(%.20q) = %.40q, want %.40q", in, got, want)
		}
	}
}
