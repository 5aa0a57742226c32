package model

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestServedExternalIPs(t *testing.T) {
	set := func(addrs ...string) IPSet { s, _ := NewIPSet(addrs...); return s }
	tests := []struct {
		name         string
		ips          ServiceIPs
		wantExternal IPSet
		wantLB       IPSet
		wantProblems []string
	}{
		{
			name:         "dual-stack: everything served",
			ips:          ServiceIPs{ClusterIPs: set("10.96.0.1", "fd00::1"), ExternalIPs: set("192.0.2.1", "2001:db8::1"), LoadBalancerIPs: set("192.0.2.2", "2001:db8::2")},
			wantExternal: set("192.0.2.1", "2001:db8::1"),
			wantLB:       set("192.0.2.2", "2001:db8::2"),
		},
		{
			name:         "IPv4 only: the IPv6 addresses are ignored",
			ips:          ServiceIPs{ClusterIPs: set("10.96.0.1"), ExternalIPs: set("192.0.2.1", "2001:db8::1"), LoadBalancerIPs: set("2001:db8::2")},
			wantExternal: set("192.0.2.1"),
			wantProblems: []string{
				"spec.externalIPs BadField: service ns/web: externalIPs: 2001:db8::1 ignored: the service has no IPv6 cluster IP (as kube-proxy)",
				"status.loadBalancer.ingress BadField: service ns/web: loadBalancer ingress IPs: 2001:db8::2 ignored: the service has no IPv6 cluster IP (as kube-proxy)",
			},
		},
		{
			name:         "IPv6 only: the IPv4 addresses are ignored",
			ips:          ServiceIPs{ClusterIPs: set("fd00::1"), ExternalIPs: set("192.0.2.1", "2001:db8::1")},
			wantExternal: set("2001:db8::1"),
			wantProblems: []string{"spec.externalIPs BadField: service ns/web: externalIPs: 192.0.2.1 ignored: the service has no IPv4 cluster IP (as kube-proxy)"},
		},
		{
			name:         "headless: everything served (the blog's all-IP case)",
			ips:          ServiceIPs{Headless: true, ExternalIPs: set("10.0.0.55", "1000::55"), LoadBalancerIPs: set("192.0.2.2")},
			wantExternal: set("10.0.0.55", "1000::55"),
			wantLB:       set("192.0.2.2"),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := &Service{Namespace: "ns", Name: "web", IPs: tc.ips}
			ext, lb, problems := s.ServedExternalIPs()
			var got []string
			for _, err := range problems {
				p := ProblemOf(s.Key(), err) // a *Problem: its field and reason
				got = append(got, fmt.Sprintf("%s %s: %s", p.Field, p.Reason, p.Message))
			}
			if diff := cmp.Diff(tc.wantExternal, ext); diff != "" {
				t.Errorf("external IPs (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantLB, lb); diff != "" {
				t.Errorf("load-balancer IPs (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantProblems, got); diff != "" {
				t.Errorf("problems (-want +got):\n%s", diff)
			}
		})
	}
}
