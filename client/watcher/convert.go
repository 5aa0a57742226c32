package watcher

import (
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/model"
)

// proxied reports whether a proxier has anything to do for svc. ExternalName
// services are DNS aliases with nothing to load-balance, as in kube-proxy.
func proxied(svc *v1.Service) bool {
	return svc.Spec.Type != v1.ServiceTypeExternalName
}

// convertService turns a Kubernetes Service into the model. Malformed values
// (which the API server's validation normally rules out) are logged with the
// object and field they come from, and skipped.
func convertService(svc *v1.Service) *model.Service {
	ref := klog.KObj(svc)
	out := &model.Service{
		Namespace: svc.Namespace,
		Name:      svc.Name,
		Type:      string(svc.Spec.Type),
	}
	if out.Type == "" {
		out.Type = string(v1.ServiceTypeClusterIP)
	}
	if len(svc.Labels) != 0 {
		out.Labels = make(map[string]string, len(svc.Labels))
		for k, v := range svc.Labels {
			out.Labels[k] = v
		}
	}

	clusterIPs := svc.Spec.ClusterIPs
	if len(clusterIPs) == 0 && svc.Spec.ClusterIP != "" {
		clusterIPs = []string{svc.Spec.ClusterIP}
	}
	if len(clusterIPs) > 0 && clusterIPs[0] == v1.ClusterIPNone {
		out.IPs.Headless = true
		clusterIPs = nil
	}
	out.IPs.ClusterIPs = ipSet(ref, "spec.clusterIPs", clusterIPs)
	out.IPs.ExternalIPs = ipSet(ref, "spec.externalIPs", svc.Spec.ExternalIPs)
	if svc.Spec.Type == v1.ServiceTypeLoadBalancer {
		var lbIPs []string
		for _, ing := range svc.Status.LoadBalancer.Ingress {
			// Ingress points in Proxy mode are reached through the load
			// balancer's own proxy, not by their IP: kube-proxy skips them.
			if ing.IP == "" || (ing.IPMode != nil && *ing.IPMode == v1.LoadBalancerIPModeProxy) {
				continue
			}
			lbIPs = append(lbIPs, ing.IP)
		}
		out.IPs.LoadBalancerIPs = ipSet(ref, "status.loadBalancer.ingress", lbIPs)
		out.LoadBalancerSourceRanges = cidrs(ref, svc.Spec.LoadBalancerSourceRanges)
	}

	for i := range svc.Spec.Ports {
		p := &svc.Spec.Ports[i]
		pm := &model.PortMapping{
			Name:     p.Name,
			Protocol: protocol(p.Protocol),
			Port:     p.Port,
			NodePort: p.NodePort,
		}
		switch {
		case p.TargetPort.StrVal != "" && p.TargetPort.IntVal == 0:
			pm.TargetPortName = p.TargetPort.StrVal
		case p.TargetPort.IntVal != 0:
			pm.TargetPort = p.TargetPort.IntVal
		default:
			pm.TargetPort = p.Port
		}
		if pm.Protocol == model.ProtocolUnknown {
			klog.ErrorS(nil, "Skipping service port with unknown protocol", "service", ref,
				"field", "spec.ports["+p.Name+"].protocol", "protocol", p.Protocol)
			continue
		}
		out.Ports = append(out.Ports, pm)
	}

	if svc.Spec.SessionAffinity == v1.ServiceAffinityClientIP {
		timeout := int32(model.DefaultAffinityTimeoutSeconds)
		if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			timeout = *c.ClientIP.TimeoutSeconds
		}
		out.ClientIPAffinity = &model.ClientIPAffinity{TimeoutSeconds: timeout}
	}
	out.ExternalTrafficToLocal = externallyAccessible(svc) &&
		svc.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal
	out.InternalTrafficToLocal = svc.Spec.InternalTrafficPolicy != nil &&
		*svc.Spec.InternalTrafficPolicy == v1.ServiceInternalTrafficPolicyLocal
	out.HealthCheckNodePort = svc.Spec.HealthCheckNodePort
	if svc.Spec.TrafficDistribution != nil {
		out.TrafficDistribution = *svc.Spec.TrafficDistribution
	}
	return out
}

// externallyAccessible mirrors Kubernetes' rule for when
// externalTrafficPolicy applies.
func externallyAccessible(svc *v1.Service) bool {
	switch svc.Spec.Type {
	case v1.ServiceTypeLoadBalancer, v1.ServiceTypeNodePort:
		return true
	}
	return len(svc.Spec.ExternalIPs) > 0
}

func protocol(p v1.Protocol) model.Protocol {
	switch p {
	case v1.ProtocolTCP, "":
		return model.TCP
	case v1.ProtocolUDP:
		return model.UDP
	case v1.ProtocolSCTP:
		return model.SCTP
	}
	return model.ProtocolUnknown
}

func ipSet(ref klog.ObjectRef, field string, addrs []string) model.IPSet {
	set, bad := model.NewIPSet(addrs...)
	for _, b := range bad {
		klog.ErrorS(nil, "Skipping invalid IP address", "object", ref, "field", field, "value", b)
	}
	return set
}

// cidrs parses spec.loadBalancerSourceRanges (model.ParseCIDRs: masked,
// sorted, each once), logging and skipping those that are not CIDRs.
func cidrs(ref klog.ObjectRef, ranges []string) []netip.Prefix {
	out, bad := model.ParseCIDRs(ranges...)
	for _, r := range bad {
		klog.ErrorS(nil, "Skipping invalid CIDR", "service", ref, "field", "spec.loadBalancerSourceRanges", "value", r)
	}
	return out
}

// endpointBuilder gathers one service's endpoints from its slices.
type endpointBuilder struct {
	node model.Node
	// copies are the copies of each address, one per slice endpoint
	// listing it, in slice name order.
	copies map[netip.Addr][]endpointCopy
}

// endpointCopy is one slice's copy of an address: the endpoint it makes
// and the ports the slice gives it (port name → number).
type endpointCopy struct {
	ep    *model.Endpoint
	ports []discovery.EndpointPort
}

// buildEndpoints merges the endpoints of a service's slices. Each address
// appears once. When it is in several slices (a pod IP reused while the
// old pod terminates, a slice transition), the copy that is not
// terminating is kept, as kube-proxy (v1.36) does, then the first in
// slice name order. The ports are the kept copy's, and for the port
// names its slice does not list, those of the other copies in slice name
// order.
//
// What the model cannot say: kube-proxy keys endpoints by address and
// port per service port, so when two copies give one port name
// different numbers it load-balances over both pairs (each with its own
// conditions); here the address serves each port on one number, the
// kept copy's.
func buildEndpoints(svc *model.Service, sliceList []*discovery.EndpointSlice, n model.Node) []*model.Endpoint {
	b := endpointBuilder{node: n, copies: map[netip.Addr][]endpointCopy{}}
	slices.SortFunc(sliceList, func(a, b *discovery.EndpointSlice) int { return strings.Compare(a.Name, b.Name) })
	for _, s := range sliceList {
		if _, marked := s.Labels[HeadlessLabel]; marked && !svc.IPs.Headless {
			continue // kube-proxy leaves such a slice out (HeadlessLabel)
		}
		b.addSlice(s)
	}
	out := make([]*model.Endpoint, 0, len(b.copies))
	for _, copies := range b.copies {
		kept := 0
		for i, c := range copies {
			if !c.ep.Terminating {
				kept = i
				break
			}
		}
		resolved := map[string]int32{}
		resolvePorts(resolved, copies[kept].ports)
		for i, c := range copies {
			if i != kept {
				resolvePorts(resolved, c.ports)
			}
		}
		ep := copies[kept].ep
		ep.PortOverrides = overrides(svc, resolved)
		out = append(out, ep)
	}
	slices.SortFunc(out, model.CompareEndpoints)
	return out
}

// resolvePorts adds to resolved the ports of a slice whose names it does
// not hold yet.
func resolvePorts(resolved map[string]int32, ports []discovery.EndpointPort) {
	for _, p := range ports {
		if p.Port == nil {
			continue
		}
		name := ""
		if p.Name != nil {
			name = *p.Name
		}
		if _, done := resolved[name]; !done {
			resolved[name] = *p.Port
		}
	}
}

func (b *endpointBuilder) addSlice(s *discovery.EndpointSlice) {
	if s.AddressType != discovery.AddressTypeIPv4 && s.AddressType != discovery.AddressTypeIPv6 {
		return
	}
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		if len(e.Addresses) == 0 {
			continue
		}
		// Like kube-proxy, only the first address of an endpoint is used.
		ip, err := netip.ParseAddr(e.Addresses[0])
		if err != nil {
			klog.ErrorS(err, "Skipping endpoint with invalid address", "endpointSlice", klog.KObj(s),
				"field", "endpoints[].addresses", "value", e.Addresses[0])
			continue
		}
		ip = ip.Unmap()
		b.copies[ip] = append(b.copies[ip], endpointCopy{ep: b.endpoint(ip, e), ports: s.Ports})
	}
}

func (b *endpointBuilder) endpoint(ip netip.Addr, e *discovery.Endpoint) *model.Endpoint {
	ep := &model.Endpoint{
		Ready:       e.Conditions.Ready == nil || *e.Conditions.Ready,
		Serving:     e.Conditions.Serving == nil || *e.Conditions.Serving,
		Terminating: e.Conditions.Terminating != nil && *e.Conditions.Terminating,
	}
	if ip.Is4() {
		ep.IPs.V4 = []string{ip.String()}
	} else {
		ep.IPs.V6 = []string{ip.String()}
	}
	if e.NodeName != nil {
		ep.NodeName = *e.NodeName
	}
	if e.Zone != nil {
		ep.Zone = *e.Zone
	}
	if h := e.Hints; h != nil && (len(h.ForZones) > 0 || len(h.ForNodes) > 0) {
		hints := &model.Hints{}
		for _, z := range h.ForZones {
			hints.Zones = append(hints.Zones, z.Name)
		}
		for _, n := range h.ForNodes {
			hints.Nodes = append(hints.Nodes, n.Name)
		}
		ep.Hints = hints
	}
	return b.node.View(ep)
}

// overrides lists the service ports this endpoint serves on another port
// than the service's target port (0: not served at all).
func overrides(svc *model.Service, resolved map[string]int32) map[string]int32 {
	var out map[string]int32
	for _, p := range svc.Ports {
		port := resolved[p.Name] // 0 when the endpoint's slices lack the port
		if port == p.TargetPort {
			continue
		}
		if out == nil {
			out = map[string]int32{}
		}
		out[p.Name] = port
	}
	return out
}
