package kpngv1

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"time"

	"sigs.k8s.io/kpng/model"
)

// FromServiceKey converts a model service key.
func FromServiceKey(k model.ServiceKey) *ServiceKey {
	return &ServiceKey{Namespace: k.Namespace, Name: k.Name}
}

// Model returns the model service key.
func (k *ServiceKey) Model() model.ServiceKey {
	return model.ServiceKey{Namespace: k.GetNamespace(), Name: k.GetName()}
}

// FromIPSet converts a model IP set.
func FromIPSet(s model.IPSet) *IPSet {
	if s.IsEmpty() {
		return nil
	}
	return &IPSet{V4: s.V4, V6: s.V6}
}

// Model returns the model IP set (nil lists when empty).
func (s *IPSet) Model() model.IPSet {
	return model.IPSet{V4: nonEmpty(s.GetV4()), V6: nonEmpty(s.GetV6())}
}

// FromService converts a model service.
func FromService(s *model.Service) *Service {
	out := &Service{
		Namespace: s.Namespace,
		Name:      s.Name,
		Type:      s.Type,
		Labels:    s.Labels,
		Ips: &ServiceIPs{
			ClusterIps:      FromIPSet(s.IPs.ClusterIPs),
			ExternalIps:     FromIPSet(s.IPs.ExternalIPs),
			LoadBalancerIps: FromIPSet(s.IPs.LoadBalancerIPs),
			Headless:        s.IPs.Headless,
		},
		ExternalTrafficToLocal:   s.ExternalTrafficToLocal,
		InternalTrafficToLocal:   s.InternalTrafficToLocal,
		HealthCheckNodePort:      s.HealthCheckNodePort,
		LoadBalancerSourceRanges: cidrStrings(s.LoadBalancerSourceRanges),
		TrafficDistribution:      s.TrafficDistribution,
	}
	for _, p := range s.Ports {
		out.Ports = append(out.Ports, &PortMapping{
			Name:           p.Name,
			Protocol:       Protocol(p.Protocol),
			Port:           p.Port,
			NodePort:       p.NodePort,
			TargetPort:     p.TargetPort,
			TargetPortName: p.TargetPortName,
		})
	}
	if a := s.ClientIPAffinity; a != nil {
		out.ClientIpAffinity = &ClientIPAffinity{TimeoutSeconds: a.TimeoutSeconds}
	}
	return out
}

// Model returns the model service. The wire carries source ranges as
// strings: one that is not a CIDR is an error naming the service and the
// field (a kpng controller never sends one: it parsed them).
func (s *Service) Model() (*model.Service, error) {
	ranges, bad := model.ParseCIDRs(s.GetLoadBalancerSourceRanges()...)
	if len(bad) > 0 {
		return nil, fmt.Errorf("service %s/%s: load_balancer_source_ranges: %q is not a usable CIDR", s.GetNamespace(), s.GetName(), bad[0])
	}
	out := &model.Service{
		Namespace: s.GetNamespace(),
		Name:      s.GetName(),
		Type:      s.GetType(),
		Labels:    nonEmptyMap(s.GetLabels()),
		IPs: model.ServiceIPs{
			ClusterIPs:      s.GetIps().GetClusterIps().Model(),
			ExternalIPs:     s.GetIps().GetExternalIps().Model(),
			LoadBalancerIPs: s.GetIps().GetLoadBalancerIps().Model(),
			Headless:        s.GetIps().GetHeadless(),
		},
		ExternalTrafficToLocal:   s.GetExternalTrafficToLocal(),
		InternalTrafficToLocal:   s.GetInternalTrafficToLocal(),
		HealthCheckNodePort:      s.GetHealthCheckNodePort(),
		LoadBalancerSourceRanges: ranges,
		TrafficDistribution:      s.GetTrafficDistribution(),
	}
	for _, p := range s.GetPorts() {
		out.Ports = append(out.Ports, &model.PortMapping{
			Name:           p.GetName(),
			Protocol:       model.Protocol(p.GetProtocol()),
			Port:           p.GetPort(),
			NodePort:       p.GetNodePort(),
			TargetPort:     p.GetTargetPort(),
			TargetPortName: p.GetTargetPortName(),
		})
	}
	if a := s.GetClientIpAffinity(); a != nil {
		out.ClientIPAffinity = &model.ClientIPAffinity{TimeoutSeconds: a.GetTimeoutSeconds()}
	}
	return out, nil
}

// cidrStrings returns the prefixes as text (nil when empty).
func cidrStrings(ps []netip.Prefix) []string {
	if len(ps) == 0 {
		return nil
	}
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}

// FromEndpoint converts a model endpoint.
func FromEndpoint(e *model.Endpoint) *Endpoint {
	out := &Endpoint{
		Ips:           FromIPSet(e.IPs),
		Local:         e.Local,
		Ready:         e.Ready,
		Serving:       e.Serving,
		Terminating:   e.Terminating,
		NodeName:      e.NodeName,
		Zone:          e.Zone,
		PortOverrides: e.PortOverrides,
	}
	if h := e.Hints; h != nil {
		out.Hints = &Hints{Zones: h.Zones, Nodes: h.Nodes, SameZone: h.SameZone, SameNode: h.SameNode}
	}
	return out
}

// Model returns the model endpoint.
func (e *Endpoint) Model() *model.Endpoint {
	out := &model.Endpoint{
		IPs:           e.GetIps().Model(),
		Local:         e.GetLocal(),
		Ready:         e.GetReady(),
		Serving:       e.GetServing(),
		Terminating:   e.GetTerminating(),
		NodeName:      e.GetNodeName(),
		Zone:          e.GetZone(),
		PortOverrides: nonEmptyMap(e.GetPortOverrides()),
	}
	if h := e.GetHints(); h != nil {
		out.Hints = &model.Hints{
			Zones: nonEmpty(h.GetZones()), Nodes: nonEmpty(h.GetNodes()),
			SameZone: h.GetSameZone(), SameNode: h.GetSameNode(),
		}
	}
	return out
}

func nonEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return slices.Clone(s)
}

func nonEmptyMap[V any](m map[string]V) map[string]V {
	if len(m) == 0 {
		return nil
	}
	return maps.Clone(m)
}

// FromCluster converts model cluster facts: an empty Cluster for none
// (nil or zero), which on a Sync says that there are none.
func FromCluster(c *model.Cluster) *Cluster {
	if c.IsZero() {
		return &Cluster{}
	}
	return &Cluster{ServiceCidrs: cidrStrings(c.ServiceCIDRs)}
}

// Model returns the model cluster facts (nil for none). The wire carries
// CIDRs as strings: one that is not a CIDR is an error naming the field.
func (c *Cluster) Model() (*model.Cluster, error) {
	cidrs, bad := model.ParseCIDRs(c.GetServiceCidrs()...)
	if len(bad) > 0 {
		return nil, fmt.Errorf("cluster: service_cidrs: %q is not a usable CIDR", bad[0])
	}
	if len(cidrs) == 0 {
		return nil, nil
	}
	return &model.Cluster{ServiceCIDRs: cidrs}, nil
}

// FromTriggers converts the trigger times of service key.
func FromTriggers(key model.ServiceKey, times []time.Time) *Triggers {
	t := &Triggers{Service: FromServiceKey(key), UnixNanos: make([]int64, len(times))}
	for i, tm := range times {
		t.UnixNanos[i] = tm.UnixNano()
	}
	return t
}

// Model returns the service and its trigger times; times that are not
// positive are left out. A Triggers without a service name is an error.
func (t *Triggers) Model() (model.ServiceKey, []time.Time, error) {
	key := t.GetService().Model()
	if key.Name == "" {
		return key, nil, fmt.Errorf("triggers without a service name")
	}
	times := make([]time.Time, 0, len(t.GetUnixNanos()))
	for _, ns := range t.GetUnixNanos() {
		if ns > 0 {
			times = append(times, time.Unix(0, ns))
		}
	}
	return key, times, nil
}
