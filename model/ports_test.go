package model

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestUsablePorts(t *testing.T) {
	s := &Service{Namespace: "ns", Name: "web", Ports: []*PortMapping{
		{Name: "a", Protocol: TCP, Port: 80, NodePort: 30080},
		nil,
		{Name: "dup", Protocol: TCP, Port: 80},
		{Name: "udp", Protocol: UDP, Port: 80, NodePort: 70000},
		{Name: "sctp", Protocol: SCTP, Port: 81},
		{Name: "big", Protocol: TCP, Port: 65536},
		{Name: "zero", Protocol: TCP, Port: 0},
	}}
	ports, nodePorts, problems := s.UsablePorts(func(p Protocol) bool { return p != SCTP })
	var names []string
	for _, p := range ports {
		names = append(names, p.Name)
	}
	if strings.Join(names, ",") != "a,udp" || len(nodePorts) != 2 || nodePorts[0] != 30080 || nodePorts[1] != 0 {
		t.Errorf("ports %v, node ports %v; want a (30080) and udp (none: its node port is out of range)", names, nodePorts)
	}
	want := []string{`port "dup": protocol and port TCP/80 already used by port "a"`, `port "udp": node port 70000 out of range`,
		`port "sctp": protocol 3 (SCTP) not supported`, `port "big": port 65536 out of range`, `port "zero": port 0 out of range`}
	if len(problems) != len(want) {
		t.Fatalf("problems %v, want %d", problems, len(want))
	}
	for i, w := range want {
		if !strings.Contains(problems[i].Error(), "service ns/web "+w) {
			t.Errorf("problem %d = %q, want %q", i, problems[i], w)
		}
	}
	if s.Ports[3].NodePort != 70000 {
		t.Error("the service was modified")
	}
}

func TestUsableSourceRanges(t *testing.T) {
	s := &Service{Namespace: "ns", Name: "lb", LoadBalancerSourceRanges: []netip.Prefix{netip.MustParsePrefix("10.0.0.1/8"), {}, netip.MustParsePrefix("fd00::/64")}}
	ranges, problems := s.UsableSourceRanges()
	if len(ranges) != 2 || ranges[0] != netip.MustParsePrefix("10.0.0.0/8") || len(problems) != 1 || !strings.Contains(problems[0].Error(), "service ns/lb: loadBalancerSourceRanges") {
		t.Errorf("ranges %v, problems %v", ranges, problems)
	}
}

// TestUsablePortsProblems: the problems are Problems naming the field and
// the reason, whose text is the message.
func TestUsablePortsProblems(t *testing.T) {
	s := &Service{Namespace: "ns", Name: "web", Ports: []*PortMapping{
		{Name: "a", Protocol: TCP, Port: 80},
		{Name: "dup", Protocol: TCP, Port: 80},
		{Name: "sctp", Protocol: SCTP, Port: 81},
		{Name: "np", Protocol: UDP, Port: 82, NodePort: -1},
	}, LoadBalancerSourceRanges: []netip.Prefix{{}}}
	_, _, problems := s.UsablePorts(func(p Protocol) bool { return p != SCTP })
	_, rangeProblems := s.UsableSourceRanges()
	problems = append(problems, rangeProblems...)
	key := ServiceKey{Namespace: "ns", Name: "web"}
	want := []Problem{
		{key, "spec.ports[1]", ReasonBadField, `service ns/web port "dup": protocol and port TCP/80 already used by port "a": ignored`},
		{key, "spec.ports[2].protocol", ReasonUnsupportedProtocol, `service ns/web port "sctp": protocol 3 (SCTP) not supported`},
		{key, "spec.ports[3].nodePort", ReasonBadField, `service ns/web port "np": node port -1 out of range: ignored`},
		{key, "spec.loadBalancerSourceRanges", ReasonBadField, `service ns/web: loadBalancerSourceRanges: an invalid (zero) prefix: ignored`},
	}
	if len(problems) != len(want) {
		t.Fatalf("problems %v, want %d", problems, len(want))
	}
	for i, err := range problems {
		if got := ProblemOf(key, err); got != want[i] || err.Error() != want[i].Message {
			t.Errorf("problem %d = %+v (%q), want %+v", i, got, err, want[i])
		}
	}
	if got := ProblemOf(key, errors.New("plain")); got != (Problem{Service: key, Reason: ReasonOther, Message: "plain"}) {
		t.Errorf("ProblemOf(a plain error) = %+v", got)
	}
}
