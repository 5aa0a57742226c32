package allip

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"sigs.k8s.io/kpng/model"
)

var addrCmp = cmp.Comparer(func(a, b netip.Addr) bool { return a == b })

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

func svc(ns, name string, ext ...string) *model.Service {
	set, bad := model.NewIPSet(ext...)
	// Keep bad addresses: the tests feed them on purpose.
	for _, b := range bad {
		if strings.Contains(b, ":") {
			set.V6 = append(set.V6, b)
		} else {
			set.V4 = append(set.V4, b)
		}
	}
	return &model.Service{Namespace: ns, Name: name, IPs: model.ServiceIPs{ExternalIPs: set}}
}

// ep returns an endpoint with one address; flags are any of "local",
// "ready", "serving".
func ep(addr string, flags ...string) *model.Endpoint {
	e := &model.Endpoint{}
	if strings.Contains(addr, ":") {
		e.IPs.V6 = []string{addr}
	} else {
		e.IPs.V4 = []string{addr}
	}
	for _, f := range flags {
		switch f {
		case "local":
			e.Local = true
		case "ready":
			e.Ready = true
		case "serving":
			e.Serving = true
		default:
			panic("unknown flag " + f)
		}
	}
	return e
}

func key(ns, name string) model.ServiceKey { return model.ServiceKey{Namespace: ns, Name: name} }

func TestRules(t *testing.T) {
	blog := key("default", "kpng-example")
	for _, tc := range []struct {
		name     string
		items    []*model.ServiceEndpoints
		want     []Rule
		problems []string // substrings, one per problem, in order
	}{
		{name: "empty state"},
		{
			name: "the blog's state",
			items: []*model.ServiceEndpoints{{
				Service: svc("default", "kpng-example", "10.0.0.55", "1000::55"),
				Endpoints: []*model.Endpoint{
					ep("11.0.1.2", "ready", "serving"),
					ep("11.0.2.2", "local", "ready", "serving"),
					ep("1100::102", "ready", "serving"),
					ep("1100::202", "local", "ready", "serving"),
				},
			}},
			want: []Rule{
				{ip("10.0.0.55"), ip("11.0.2.2"), blog},
				{ip("1000::55"), ip("1100::202"), blog},
			},
		},
		{
			name: "the blog post's JSON: no Ready field",
			items: []*model.ServiceEndpoints{{
				Service: svc("default", "kpng-example", "10.0.0.55", "1000::55"),
				Endpoints: []*model.Endpoint{
					ep("1100::202", "local"), ep("11.0.2.2", "local"), ep("11.0.1.2"), ep("1100::102"),
				},
			}},
			want: []Rule{
				{ip("10.0.0.55"), ip("11.0.2.2"), blog},
				{ip("1000::55"), ip("1100::202"), blog},
			},
		},
		{
			name: "no local endpoint: no rule",
			items: []*model.ServiceEndpoints{{
				Service:   svc("default", "kpng-example", "10.0.0.55", "1000::55"),
				Endpoints: []*model.Endpoint{ep("11.0.1.2", "ready"), ep("1100::102", "ready")},
			}},
		},
		{
			name: "local endpoint of one family only",
			items: []*model.ServiceEndpoints{{
				Service:   svc("default", "kpng-example", "10.0.0.55", "1000::55"),
				Endpoints: []*model.Endpoint{ep("1100::202", "local", "ready")},
			}},
			want: []Rule{{ip("1000::55"), ip("1100::202"), blog}},
		},
		{
			name: "ready preferred over serving over neither, first within a rank",
			items: []*model.ServiceEndpoints{{
				Service: svc("default", "kpng-example", "10.0.0.55", "1000::55"),
				Endpoints: []*model.Endpoint{
					ep("11.0.2.2", "local"),
					ep("11.0.2.3", "local", "serving"),
					ep("11.0.2.4", "local", "ready"),
					ep("11.0.2.5", "local", "ready"),
					ep("1100::202", "local"),
					ep("1100::203", "local", "serving"),
					ep("1100::204", "local", "serving"),
				},
			}},
			want: []Rule{
				{ip("10.0.0.55"), ip("11.0.2.4"), blog},
				{ip("1000::55"), ip("1100::203"), blog},
			},
		},
		{
			name: "several external IPs, several services, sorted output",
			items: []*model.ServiceEndpoints{
				{Service: svc("b", "two", "10.0.0.9", "10.0.0.7"), Endpoints: []*model.Endpoint{ep("11.0.2.9", "local", "ready")}},
				{Service: svc("a", "one", "10.0.0.8", "1000::1"), Endpoints: []*model.Endpoint{ep("11.0.2.8", "local", "ready"), ep("1100::8", "local", "ready")}},
			},
			want: []Rule{
				{ip("10.0.0.7"), ip("11.0.2.9"), key("b", "two")},
				{ip("10.0.0.8"), ip("11.0.2.8"), key("a", "one")},
				{ip("10.0.0.9"), ip("11.0.2.9"), key("b", "two")},
				{ip("1000::1"), ip("1100::8"), key("a", "one")},
			},
		},
		{
			name: "an external IP claimed twice: the first service by key wins",
			items: []*model.ServiceEndpoints{
				{Service: svc("ns", "zz", "10.0.0.55"), Endpoints: []*model.Endpoint{ep("11.0.2.3", "local", "ready")}},
				{Service: svc("ns", "aa", "10.0.0.55"), Endpoints: []*model.Endpoint{ep("11.0.2.2", "local", "ready")}},
			},
			want:     []Rule{{ip("10.0.0.55"), ip("11.0.2.2"), key("ns", "aa")}},
			problems: []string{"service ns/zz: external IP 10.0.0.55 is already used by service ns/aa"},
		},
		{
			name: "bad addresses are skipped and reported, the rest applies",
			items: []*model.ServiceEndpoints{{
				Service: &model.Service{Namespace: "default", Name: "kpng-example", IPs: model.ServiceIPs{ExternalIPs: model.IPSet{
					V4: []string{"10.0.0.300", "1000::56", "10.0.0.55", "10.0.0.55"},
					V6: []string{"1000::55", "fe80::1%eth0", "::ffff:10.0.0.56", "10.0.0.57"},
				}}},
				Endpoints: []*model.Endpoint{
					{IPs: model.IPSet{V4: []string{"not-an-ip"}}, Local: true, Ready: true},
					{IPs: model.IPSet{V4: []string{"11.0.2.2"}}, Local: true, Ready: true},
					{IPs: model.IPSet{V6: []string{"1100::202"}}, Local: true, Ready: true},
				},
			}},
			want: []Rule{
				{ip("10.0.0.55"), ip("11.0.2.2"), blog},
				{ip("1000::55"), ip("1100::202"), blog},
			},
			problems: []string{
				`external IP "10.0.0.300"`,
				`external IP "1000::56" is not an IPv4 address`,
				`local endpoint "not-an-ip"`,
				`external IP "fe80::1%eth0" has a zone`,
				`external IP "::ffff:10.0.0.56" is not an IPv6 address`,
				`external IP "10.0.0.57" is not an IPv6 address`,
			},
		},
		{
			name: "nil items, services and endpoints",
			items: []*model.ServiceEndpoints{
				nil,
				{},
				{Service: svc("default", "kpng-example", "10.0.0.55"), Endpoints: []*model.Endpoint{nil, ep("11.0.2.2", "local")}},
			},
			want:     []Rule{{ip("10.0.0.55"), ip("11.0.2.2"), blog}},
			problems: []string{"without a service", "without a service"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, problems := Rules(tc.items)
			if diff := cmp.Diff(tc.want, got, addrCmp); diff != "" {
				t.Errorf("rules (-want +got):\n%s", diff)
			}
			var texts []string
			for _, p := range problems {
				texts = append(texts, p.Error())
			}
			if len(texts) != len(tc.problems) {
				t.Fatalf("problems %q, want %d matching %q", texts, len(tc.problems), tc.problems)
			}
			for i, p := range tc.problems {
				if !strings.Contains(texts[i], p) {
					t.Errorf("problem %d = %q, want it to contain %q", i, texts[i], p)
				}
			}
		})
	}
}

// TestRulesDoNotModifyInput guards the read-only contract of the state.
func TestRulesDoNotModifyInput(t *testing.T) {
	items := []*model.ServiceEndpoints{
		{Service: svc("b", "b", "10.0.0.2")},
		{Service: svc("a", "a", "10.0.0.1")},
	}
	first := items[0]
	Rules(items)
	if items[0] != first {
		t.Fatal("Rules reordered its input")
	}
}

func TestChanged(t *testing.T) {
	r := func(ext, target string) Rule { return Rule{External: ip(ext), Target: ip(target)} }
	for _, tc := range []struct {
		name     string
		old, new []Rule
		want     []netip.Addr
	}{
		{name: "nothing"},
		{name: "same", old: []Rule{r("10.0.0.55", "11.0.2.2")}, new: []Rule{r("10.0.0.55", "11.0.2.2")}},
		{name: "added", new: []Rule{r("10.0.0.55", "11.0.2.2")}, want: []netip.Addr{ip("10.0.0.55")}},
		{name: "removed", old: []Rule{r("1000::55", "1100::202")}, want: []netip.Addr{ip("1000::55")}},
		{
			name: "moved and kept",
			old:  []Rule{r("10.0.0.55", "11.0.2.2"), r("1000::55", "1100::202"), r("10.0.0.56", "11.0.2.2")},
			new:  []Rule{r("10.0.0.55", "11.0.2.3"), r("1000::55", "1100::203"), r("10.0.0.56", "11.0.2.2")},
			want: []netip.Addr{ip("10.0.0.55"), ip("1000::55")},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, Changed(tc.old, tc.new), addrCmp); diff != "" {
				t.Errorf("Changed (-want +got):\n%s", diff)
			}
		})
	}
}

func TestReadState(t *testing.T) {
	golden, err := os.ReadFile(filepath.Join("..", "..", "json", "testdata", "kpng-example.golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	items, err := ReadState(strings.NewReader(string(golden)))
	if err != nil {
		t.Fatalf("golden state: %v", err)
	}
	blog := key("default", "kpng-example")
	rules, problems := Rules(items)
	want := []Rule{{ip("10.0.0.55"), ip("11.0.2.2"), blog}, {ip("1000::55"), ip("1100::202"), blog}}
	if diff := cmp.Diff(want, rules, addrCmp); diff != "" || problems != nil {
		t.Errorf("rules of the golden state (-want +got):\n%s\nproblems: %v", diff, problems)
	}

	for _, tc := range []struct {
		name, in string
		n        int
		err      string
	}{
		{name: "empty", in: "", n: 0},
		{name: "blank", in: " \n\t\n", n: 0},
		{name: "two objects", in: string(golden) + string(golden), n: 2},
		{name: "objects without newlines", in: `{"Service":{"Name":"a"}}{"Service":{"Name":"b"}}`, n: 2},
		{name: "an array", in: "[" + strings.TrimSpace(string(golden)) + "]", n: 1},
		{name: "empty array", in: "[]", n: 0},
		{name: "truncated", in: string(golden[:40]), err: "JSON value 1"},
		{name: "garbage after a good object", in: string(golden) + "}", err: "JSON value 2"},
		{name: "a number", in: "42", err: "JSON value 1 is 42, want an object"},
		{name: "null", in: "null", err: "want an object"},
		{name: "wrong field type", in: `{"Service":{"Name":7}}`, err: "JSON value 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			items, err := ReadState(strings.NewReader(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil || len(items) != tc.n {
				t.Fatalf("got %d items, err %v; want %d items", len(items), err, tc.n)
			}
		})
	}
}
