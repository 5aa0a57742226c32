package iptables

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/kpng/model"
)

// manyServices returns n dual-stack services, each with a TCP and a UDP
// port, their cluster IPs spread over a /16 and a /112 (as an API
// server allocates them), every other one without endpoints (rejected in
// the filter table).
func manyServices(n int) []*model.ServiceEndpoints {
	var out []*model.ServiceEndpoints
	for i := range n {
		v4 := fmt.Sprintf("10.96.%d.%d", (i*7919)%256, 1+i%250)
		v6 := fmt.Sprintf("fd00:10:96::%x", (i*7919)%65536)
		s := svc(fmt.Sprintf("s%05d", i), ipset(v4, v6), port(model.TCP, 80, 8080), port(model.UDP, 53, 53))
		if i%3 == 0 {
			s.Type = "NodePort"
			for _, p := range s.Ports {
				p.NodePort = int32(20000 + i)
			}
		}
		se := &model.ServiceEndpoints{Service: s}
		if i%2 == 0 {
			se.Endpoints = []*model.Endpoint{ep("10.1.0.2", false), ep("fd00:1::2", false)}
		}
		out = append(out, se)
	}
	return out
}

// walk follows a TCP packet to dst:port from the chain start through the
// dispatch as iptables would: the rules matching a destination prefix
// ("-d P/len -j chain") are entered, a rule matching the address itself
// ("-d A ... --dport N") is the packet's entry. It returns that rule
// (empty when none matched) and the number of rules evaluated.
func walk(t *tablePlan, start string, dst netip.Addr, port int) (string, int) {
	evaluated := 0
	var visit func(name string) string
	visit = func(name string) string {
		c := t.byName[name]
		if c == nil {
			return ""
		}
		for _, r := range c.Rules {
			evaluated++
			fields := strings.Fields(r)
			i := slices.Index(fields, "-d")
			if i < 0 {
				continue // the node ports' jump
			}
			if p, err := netip.ParsePrefix(fields[i+1]); err == nil {
				if p.Contains(dst) {
					if found := visit(fields[slices.Index(fields, "-j")+1]); found != "" {
						return found
					}
				}
				continue
			}
			if fields[i+1] == dst.String() && slices.Contains(fields, "tcp") && slices.Contains(fields, fmt.Sprint(port)) {
				return r
			}
		}
		return ""
	}
	return visit(start), evaluated
}

// walkPort follows a packet of protocol proto to a node port from the
// chain start as iptables would: rules matching a port range
// ("--dport A:B -j chain") are entered, a rule matching the port itself
// is the packet's entry. It returns that rule and the number of rules
// evaluated.
func walkPort(t *tablePlan, start, proto string, port int) (string, int) {
	evaluated := 0
	var visit func(name string) string
	visit = func(name string) string {
		for _, r := range t.byName[name].Rules {
			evaluated++
			fields := strings.Fields(r)
			i := slices.Index(fields, "--dport")
			if i < 0 || !slices.Contains(fields, proto) {
				continue
			}
			if lo, hi, ok := strings.Cut(fields[i+1], ":"); ok {
				var l, h int
				fmt.Sscan(lo, &l)
				fmt.Sscan(hi, &h)
				if l <= port && port <= h {
					if found := visit(fields[slices.Index(fields, "-j")+1]); found != "" {
						return found
					}
				}
				continue
			}
			if fields[i+1] == fmt.Sprint(port) {
				return r
			}
		}
		return ""
	}
	return visit(start), evaluated
}

// TestDispatchTree checks the dispatch at 10, 1,000 and 10,000 services
// (a third of them with node ports): every service address and node port
// reaches its own rule, through no more rules than
// the bound (kube-proxy's flat chain evaluates up to one per address and
// port: 40,000 at 10,000 services), every chain of the tree holds at
// most 16 rules, and an address of no service reaches none.
func TestDispatchTree(t *testing.T) {
	for _, tc := range []struct {
		n        int
		maxRules int
	}{
		{10, 2*2*10 + 1},
		{1000, 60},
		{10000, 80},
	} {
		t.Run(fmt.Sprint(tc.n), func(t *testing.T) {
			services := manyServices(tc.n)
			pl := planner{prefix: ChainPrefix("tree"), opts: testOptions}
			p, problems := pl.build(services)
			if len(problems) > 0 {
				t.Fatalf("problems: %v", problems)
			}
			checkPlan(t, p)
			worst := 0
			for i, se := range services {
				if i%97 != 0 && tc.n > 10 {
					continue // a sample
				}
				for _, f := range families {
					table := &p.Families[f].NAT
					if len(se.Endpoints) == 0 {
						table = &p.Families[f].Filter
					}
					addr := netip.MustParseAddr(familyTexts(se.Service.IPs.ClusterIPs, f)[0])
					rule, n := walk(table, pl.fixed(chainServices), addr, 80)
					if !strings.Contains(rule, `"default/`+se.Service.Name+`:80/tcp`) {
						t.Errorf("%s %s:80: reached rule %q, want %s's", f, addr, rule, se.Service.Name)
					}
					worst = max(worst, n)
					if se.Service.Type != "NodePort" {
						continue
					}
					for _, proto := range []string{"tcp", "udp"} {
						np := int(se.Service.Ports[0].NodePort)
						rule, n := walkPort(table, pl.fixed(chainNodePorts), proto, np)
						if !strings.Contains(rule, `"default/`+se.Service.Name+`:`) || !strings.Contains(rule, "-p "+proto) {
							t.Errorf("%s %s node port %d: reached rule %q, want %s's", f, proto, np, rule, se.Service.Name)
						}
						worst = max(worst, n)
					}
				}
			}
			if worst > tc.maxRules {
				t.Errorf("a packet went through %d rules, want at most %d", worst, tc.maxRules)
			}
			t.Logf("%d services: at most %d rules evaluated", tc.n, worst)
			for _, f := range families {
				for _, c := range p.Families[f].NAT.Chains {
					if strings.Contains(c.Name, "-"+kindDispatch+"-") && len(c.Rules) > leafDispatch {
						t.Errorf("%s: dispatch chain %s has %d rules", f, c.Name, len(c.Rules))
					}
				}
				if tc.n > flatDispatch {
					if n := len(p.Families[f].NAT.byName[pl.fixed(chainServices)].Rules); n > 1<<stride+1 {
						t.Errorf("%s: SERVICES has %d rules", f, n)
					}
					// Two protocols, a tree each.
					if n := len(p.Families[f].NAT.byName[pl.fixed(chainNodePorts)].Rules); n > 2<<stride {
						t.Errorf("%s: NODEPORTS has %d rules", f, n)
					}
				}
			}
			if rule, _ := walk(&p.Families[ipv4].NAT, pl.fixed(chainServices), netip.MustParseAddr("10.96.255.255"), 80); rule != "" {
				t.Errorf("an address of no service reached %q", rule)
			}
			if rule, _ := walkPort(&p.Families[ipv4].NAT, pl.fixed(chainNodePorts), "tcp", 20001); rule != "" {
				t.Errorf("a port of no service reached %q", rule)
			}
		})
	}
}

// TestCommonBits checks the shared leading bits of two addresses.
func TestCommonBits(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"10.96.0.1", "10.96.0.1", 32},
		{"10.96.0.0", "10.96.0.1", 31},
		{"10.96.0.1", "10.97.0.1", 15},
		{"0.0.0.0", "128.0.0.0", 0},
		{"fd00::1", "fd00::1", 128},
		{"fd00::1", "fd00::2", 126},
	} {
		if got := commonBits(netip.MustParseAddr(tc.a), netip.MustParseAddr(tc.b)); got != tc.want {
			t.Errorf("commonBits(%s, %s) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}
