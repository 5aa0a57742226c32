package model

// ServedExternalIPs returns the external IPs and load-balancer IPs of s
// that a proxier serves, and a problem (a *Problem, ReasonBadField)
// naming the service, the field and the address for each one it must
// leave alone. The rule is kube-proxy's:
// an address of a family in which the service has no cluster IP is
// ignored (kube-proxy runs one proxier per family, and the proxier of a
// family where the service has no cluster IP does not handle it at all).
// Such an address is often a real host elsewhere, which must stay
// reachable: a proxier that claimed it would reject or black-hole its
// traffic.
//
// A headless service has no cluster IP at all, and its addresses are all
// served (the blog's all-IP case; kube-proxy ignores headless services
// entirely, and a backend may choose to do the same).
func (s *Service) ServedExternalIPs() (external, loadBalancer IPSet, problems []error) {
	if s.IPs.Headless {
		return s.IPs.ExternalIPs, s.IPs.LoadBalancerIPs, nil
	}
	keep := func(name, field string, set IPSet) IPSet {
		out := set
		if len(s.IPs.ClusterIPs.V4) == 0 && len(set.V4) > 0 {
			out.V4 = nil
			for _, a := range set.V4 {
				problems = append(problems, NewProblem(s.Key(), field, ReasonBadField,
					"service %s: %s: %s ignored: the service has no IPv4 cluster IP (as kube-proxy)", s.Key(), name, a))
			}
		}
		if len(s.IPs.ClusterIPs.V6) == 0 && len(set.V6) > 0 {
			out.V6 = nil
			for _, a := range set.V6 {
				problems = append(problems, NewProblem(s.Key(), field, ReasonBadField,
					"service %s: %s: %s ignored: the service has no IPv6 cluster IP (as kube-proxy)", s.Key(), name, a))
			}
		}
		return out
	}
	external = keep("externalIPs", "spec.externalIPs", s.IPs.ExternalIPs)
	loadBalancer = keep("loadBalancer ingress IPs", "status.loadBalancer.ingress", s.IPs.LoadBalancerIPs)
	return external, loadBalancer, problems
}
