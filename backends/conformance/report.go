//go:build linux

package conformance

import (
	"fmt"
	"net/netip"
	"strings"

	"sigs.k8s.io/kpng/model"
)

// step says what the scenario checks from now on: failures start with it.
func (h *harness) step(format string, args ...any) {
	h.checking = fmt.Sprintf(format, args...)
}

// fail reports one failed check: what was being checked, what went
// wrong, and, the first time since the state last changed, the state the
// backend was given. A check calls it once, whatever the number of
// requests it sent.
func (h *harness) fail(format string, args ...any) {
	h.t.Helper()
	var b strings.Builder
	if h.checking != "" {
		fmt.Fprintf(&b, "checking %s:\n  ", h.checking)
	}
	fmt.Fprintf(&b, format, args...)
	if !h.stateShown {
		h.stateShown = true
		b.WriteString("\n")
		b.WriteString(h.describeState())
	}
	h.t.Error(b.String())
}

// describeState renders the state the backend was last given, for a
// failure message: every service with its addresses, ports and policies,
// every endpoint with its pod, conditions, node and hints.
func (h *harness) describeState() string {
	var b strings.Builder
	fmt.Fprintf(&b, "  state given to backend %s, on node %s (addresses %v; pod CIDRs %v):\n", h.b.Name, h.node.Name, h.node.IPs, h.node.PodCIDRs)
	if h.cluster != nil {
		fmt.Fprintf(&b, "    cluster: service CIDRs %v\n", h.cluster.ServiceCIDRs)
	}
	if len(h.state) == 0 {
		b.WriteString("    no service\n")
	}
	for _, se := range h.state {
		describeService(&b, se)
	}
	return strings.TrimRight(b.String(), "\n")
}

// describeService renders one service and its endpoints.
func describeService(b *strings.Builder, se *model.ServiceEndpoints) {
	svc := se.Service
	fmt.Fprintf(b, "    service %s/%s (%s)", svc.Namespace, svc.Name, svc.Type)
	if svc.IPs.Headless {
		b.WriteString(" headless")
	}
	for _, a := range []struct {
		name string
		set  model.IPSet
	}{{"cluster IPs", svc.IPs.ClusterIPs}, {"external IPs", svc.IPs.ExternalIPs}, {"load-balancer IPs", svc.IPs.LoadBalancerIPs}} {
		if !a.set.IsEmpty() {
			fmt.Fprintf(b, ", %s %s", a.name, strings.Join(a.set.All(), " "))
		}
	}
	var ports []string
	for _, p := range svc.Ports {
		s := fmt.Sprintf("%s %d→%d", strings.ToLower(p.Protocol.String()), p.Port, p.TargetPort)
		if p.NodePort != 0 {
			s += fmt.Sprintf(" (node port %d)", p.NodePort)
		}
		ports = append(ports, s)
	}
	fmt.Fprintf(b, ", ports %s", strings.Join(ports, ", "))
	if svc.ExternalTrafficToLocal {
		b.WriteString(", externalTrafficPolicy Local")
	}
	if svc.InternalTrafficToLocal {
		b.WriteString(", internalTrafficPolicy Local")
	}
	if a := svc.ClientIPAffinity; a != nil {
		fmt.Fprintf(b, ", ClientIP affinity %d s", a.TimeoutSeconds)
	}
	if len(svc.LoadBalancerSourceRanges) > 0 {
		fmt.Fprintf(b, ", source ranges %v", svc.LoadBalancerSourceRanges)
	}
	b.WriteString("\n")
	if len(se.Endpoints) == 0 {
		b.WriteString("      no endpoint\n")
	}
	for _, e := range se.Endpoints {
		b.WriteString("      endpoint " + describeEndpoint(e) + "\n")
	}
}

// describeEndpoint renders an endpoint: its address and pod, its
// conditions, its node and its hints.
func describeEndpoint(e *model.Endpoint) string {
	addr := strings.Join(e.IPs.All(), " ")
	if a, err := netip.ParseAddr(addr); err == nil {
		for id, as := range pods {
			if as[0] == a || as[1] == a {
				addr += " (" + id + ")"
			}
		}
	}
	cond := func(ok bool, yes, no string) string {
		if ok {
			return yes
		}
		return no
	}
	s := fmt.Sprintf("%s: %s, %s, %s", addr, cond(e.Ready, "ready", "not ready"), cond(e.Serving, "serving", "not serving"),
		cond(e.Terminating, "terminating", "not terminating"))
	node := e.NodeName
	if node == "" {
		node = "unknown node"
	}
	s += ", " + cond(e.Local, "local (on "+node+")", "on "+node)
	if e.Zone != "" {
		s += ", zone " + e.Zone
	}
	if hints := e.Hints; hints != nil {
		s += fmt.Sprintf(", hinted for zones %v", hints.Zones)
		if hints.SameZone {
			s += " (this node's zone among them)"
		} else {
			s += " (not this node's zone)"
		}
	}
	return s
}
