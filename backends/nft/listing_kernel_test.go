//go:build linux

package nft

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"sigs.k8s.io/kpng/internal/netns"
)

// TestKernelListingMatchesText programs the ruleset of each golden case
// (build_test.go: together they hold every rule kind in both families,
// which the test checks first) into a table of its own in a network
// namespace, and compares what `nft list table` prints with ruleset.Text,
// object by object: the rules the kernel holds (sent as each rule's exprs)
// must read as the rules' String, so the two renderings cannot drift.
//
// Compared: the same chains, sets and maps on both sides; for each chain
// its declaration (type, hook, priority, policy) and its rules, in order;
// for each set and map its declaration (type, size, flags, timeout) and
// its elements, as a sorted list. Lines are compared as they are, but for
// whitespace. The order of the objects in the listing and the layout of
// elements (nft puts several on a line, in its own order) are not
// compared: nft chooses them.
//
// Not compared, because the kernel does not hold them: the elements of the
// dynamic affinity sets (packets add them, Text has none) and the
// "# problem:" lines of the golden files.
func TestKernelListingMatchesText(t *testing.T) {
	netns.RequirePrivileged(t)
	netns.RequireCommands(t, "nft")
	checkCoverage(t)
	ns := netns.New(t, "listing")
	cases := goldenCases()
	for _, name := range slices.Sorted(maps.Keys(cases)) {
		t.Run(name, func(t *testing.T) {
			rs, _ := buildRulesetCluster("kpng-"+name, goldenOptions[name], goldenClusters[name], cases[name])
			a := newApplier(connIn(t, ns), rs.Table)
			defer a.Close()
			if _, err := a.Full(rs); err != nil {
				t.Fatalf("program table %s: %v", rs.Table, err)
			}
			want, err := parseListing(rs.Text())
			if err != nil {
				t.Fatalf("Text: %v", err)
			}
			listing := nftList(t, ns, rs.Table)
			got, err := parseListing(listing)
			if err != nil {
				t.Fatalf("nft list table: %v\n%s", err, listing)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("table %s: the kernel's listing differs from Text (-Text +kernel):\n%s", rs.Table, diff)
			}
		})
	}
}

// listedObject is one chain, set or map of a listing.
type listedObject struct {
	// Decl are the declaration lines: type, hook, priority, flags, size,
	// timeout.
	Decl []string
	// Rules are the rules of a chain, in order.
	Rules []string
	// Elements are the elements of a set or map, sorted.
	Elements []string
}

var spaces = regexp.MustCompile(`\s+`)

// parseListing parses tables in nft syntax (Text, or nft list table)
// into their objects by table family, kind and name ("ip chain services",
// "ip map service-ips-v4").
func parseListing(text string) (map[string]*listedObject, error) {
	objs := map[string]*listedObject{}
	var name, family string
	var cur *listedObject
	var elements *strings.Builder // while inside "elements = { ... }"
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(spaces.ReplaceAllString(line, " "))
		switch {
		case line == "" || strings.HasPrefix(line, "# problem:"):
		case elements != nil:
			elements.WriteString(" " + line)
			if strings.HasSuffix(line, "}") {
				cur.Elements = splitElements(elements.String())
				elements = nil
			}
		case strings.HasPrefix(line, "table "):
			family = strings.Fields(line)[1]
		case line == "}" && cur == nil:
		case line == "}":
			cur = nil
		case cur == nil:
			kind, rest, _ := strings.Cut(line, " ")
			if (kind != "chain" && kind != "set" && kind != "map") || !strings.HasSuffix(rest, " {") {
				return nil, fmt.Errorf("line %d: %q: not a chain, set or map", i+1, line)
			}
			name = family + " " + kind + " " + strings.TrimSuffix(rest, " {")
			if objs[name] != nil {
				return nil, fmt.Errorf("line %d: %s twice", i+1, name)
			}
			cur = &listedObject{}
			objs[name] = cur
		case strings.HasPrefix(line, "elements = {"):
			elements = &strings.Builder{}
			elements.WriteString(line)
			if strings.HasSuffix(line, "}") {
				cur.Elements = splitElements(elements.String())
				elements = nil
			}
		case strings.Contains(name, " chain ") && !strings.HasPrefix(line, "type "):
			cur.Rules = append(cur.Rules, line)
		default:
			cur.Decl = append(cur.Decl, line)
		}
	}
	if cur != nil || elements != nil {
		return nil, fmt.Errorf("unterminated %s", name)
	}
	for _, o := range objs {
		sort.Strings(o.Elements)
	}
	return objs, nil
}

// splitElements returns the elements of "elements = { a, b }".
func splitElements(s string) []string {
	s = strings.TrimSuffix(strings.TrimPrefix(s, "elements = {"), "}")
	var out []string
	for _, e := range strings.Split(s, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// checkCoverage fails the test unless the golden cases hold, in each
// family, every rule kind (every type of the package with an exprs
// method), every kind of named set (endpoint map, balance map, affinity
// set), the three kinds of verdicts of the lookup maps (a chain, reject,
// drop), hairpin and cluster IP elements, and service CIDR rules.
func checkCoverage(t *testing.T) {
	t.Helper()
	kinds, err := ruleKinds(".")
	if err != nil {
		t.Fatal(err)
	}
	if len(kinds) == 0 {
		t.Fatal("no rule kinds found")
	}
	var want []string
	for _, f := range []string{"4", "6"} {
		for _, k := range kinds {
			want = append(want, k+" in family "+f)
		}
		for _, k := range []string{"endpoint map", "balance map", "affinity set", "verdict goto chain", "verdict goto reject", "verdict drop", "hairpin element", "cluster IP element", "service CIDR rule"} {
			want = append(want, k+" in family "+f)
		}
	}
	have := map[string]bool{}
	for name, items := range goldenCases() {
		rs, _ := buildRuleset("t", goldenOptions[name], items)
		for _, c := range rs.Chains {
			f := chainFamily(c.Name)
			for _, r := range c.Rules {
				have[reflect.TypeOf(r).Name()+" in family "+f] = true
			}
		}
		for _, s := range rs.Sets {
			kind := "affinity set"
			switch {
			case s.EndpointMap:
				kind = "endpoint map"
			case len(s.Targets) > 0:
				kind = "balance map"
			}
			have[kind+" in family "+familySuffix(s.Family)] = true
		}
		for _, e := range rs.Elements {
			kind := "verdict goto chain"
			switch e.Verdict.Goto {
			case "":
				kind = "verdict drop"
			case chainReject:
				kind = "verdict goto reject"
			}
			have[kind+" in family "+familySuffix(e.Family)] = true
		}
		for _, a := range rs.Hairpin {
			have["hairpin element in family "+familySuffix(familyOf(a))] = true
		}
		rs, _ = buildRulesetCluster("t", goldenOptions[name], goldenClusters[name], items)
		for _, a := range rs.ClusterIPs {
			have["cluster IP element in family "+familySuffix(familyOf(a))] = true
		}
		for _, r := range rs.ServiceCIDRs {
			have["service CIDR rule in family "+familySuffix(r.family())] = true
		}
	}
	for _, w := range want {
		if !have[w] {
			t.Errorf("no golden case has a %s: add one (build_test.go), so that its text is checked against the kernel", w)
		}
	}
}

// chainFamily returns "4" or "6", the family of a service or endpoint
// chain, from its name ("svc4-…", "ep6-…").
func chainFamily(name string) string {
	prefix, _, _ := strings.Cut(name, "-")
	return prefix[len(prefix)-1:]
}

// ruleKinds returns the names of the types of the package in dir (test
// files aside) that have an exprs method: the kinds of rule.
func ruleKinds(dir string) ([]string, error) {
	fset := token.NewFileSet()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var kinds []string
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, e.Name(), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv == nil || fn.Name.Name != "exprs" {
				continue
			}
			typ := fn.Recv.List[0].Type
			if star, ok := typ.(*ast.StarExpr); ok {
				typ = star.X
			}
			if id, ok := typ.(*ast.Ident); ok {
				kinds = append(kinds, id.Name)
			}
		}
	}
	slices.Sort(kinds)
	return kinds, nil
}
