package model

import (
	"fmt"
	"net/netip"
)

// UsablePorts returns the ports of s a backend can program, in order,
// with the node port each is served on (0: none), and the problems found,
// each naming the service and the port. Left out: a nil port, a protocol
// the backend does not proxy (supported returns false), a port outside
// 1–65535, and a protocol and port an earlier port already uses (the API
// server refuses that; a state file or another controller may not: the
// first is kept). A node port out of range is reported and the port kept
// without it. Every backend reads a service's ports through it, so that
// they all keep and refuse the same ones. Each problem is a *Problem
// naming the field (spec.ports[i].…).
func (s *Service) UsablePorts(supported func(Protocol) bool) (ports []*PortMapping, nodePorts []int32, problems []error) {
	key := s.Key()
	seen := map[[2]int32]string{}
	for i, p := range s.Ports {
		if p == nil {
			continue
		}
		field := func(name string) string { return fmt.Sprintf("spec.ports[%d]%s", i, name) }
		id := [2]int32{int32(p.Protocol), p.Port}
		if first, ok := seen[id]; ok {
			problems = append(problems, NewProblem(key, field(""), ReasonBadField,
				"service %s port %q: protocol and port %s/%d already used by port %q: ignored", key, p.Name, p.Protocol, p.Port, first))
			continue
		}
		seen[id] = p.Name
		if !supported(p.Protocol) {
			problems = append(problems, NewProblem(key, field(".protocol"), ReasonUnsupportedProtocol,
				"service %s port %q: protocol %d (%s) not supported", key, p.Name, p.Protocol, p.Protocol))
			continue
		}
		if p.Port <= 0 || p.Port > 65535 {
			problems = append(problems, NewProblem(key, field(".port"), ReasonBadField,
				"service %s port %q: port %d out of range", key, p.Name, p.Port))
			continue
		}
		nodePort := p.NodePort
		if nodePort < 0 || nodePort > 65535 {
			problems = append(problems, NewProblem(key, field(".nodePort"), ReasonBadField,
				"service %s port %q: node port %d out of range: ignored", key, p.Name, nodePort))
			nodePort = 0
		}
		ports = append(ports, p)
		nodePorts = append(nodePorts, nodePort)
	}
	return ports, nodePorts, problems
}

// UsableSourceRanges returns the service's loadBalancerSourceRanges a
// backend can program, masked: all but a zero Prefix (which kpng's
// inputs never produce, but a program building services itself could
// leave), reported as a *Problem naming the service.
func (s *Service) UsableSourceRanges() (ranges []netip.Prefix, problems []error) {
	for _, r := range s.LoadBalancerSourceRanges {
		if !r.IsValid() {
			problems = append(problems, NewProblem(s.Key(), "spec.loadBalancerSourceRanges", ReasonBadField,
				"service %s: loadBalancerSourceRanges: an invalid (zero) prefix: ignored", s.Key()))
			continue
		}
		ranges = append(ranges, r.Masked())
	}
	return ranges, problems
}
