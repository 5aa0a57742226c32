package nft

import (
	"encoding/json"
	"net/netip"
	"testing"

	"sigs.k8s.io/kpng/model"
)

// FuzzBuild: any state builds a ruleset without a panic (problems are
// reported, not fatal), with and without the masquerading options, and
// its text renders.
func FuzzBuild(f *testing.F) {
	for _, s := range []string{
		`[{"Service":{"Namespace":"default","Name":"web","Type":"LoadBalancer","IPs":{"ClusterIPs":{"V4":["10.96.0.10"],"V6":["fd00::10"]},"ExternalIPs":{"V4":["10.0.0.55"]},"LoadBalancerIPs":{"V4":["192.0.2.1"]}},"Ports":[{"Name":"http","Protocol":1,"Port":80,"NodePort":30080,"TargetPort":8080},{"Name":"dns","Protocol":2,"Port":53,"TargetPortName":"dns"}],"ClientIPAffinity":{"TimeoutSeconds":-1},"ExternalTrafficToLocal":true,"LoadBalancerSourceRanges":["10.0.0.0/8"]},"Endpoints":[{"IPs":{"V4":["10.1.0.2"]},"Local":true,"Ready":true,"Serving":true,"PortOverrides":{"dns":5353}},{"IPs":{"V6":["1100::2"]},"Serving":true,"Terminating":true,"Hints":{"SameZone":true}}]}]`,
		`[{"Service":{"Namespace":"a","Name":"b","IPs":{"ClusterIPs":{"V4":["bogus","10.96.0.1"]},"Headless":true},"Ports":[{"Protocol":3,"Port":70000,"NodePort":-1,"TargetPort":-4}]},"Endpoints":[{"IPs":{}}]}]`,
		`[{"Service":{"Namespace":"a","Name":"b","Ports":[{"Protocol":1,"Port":80},{"Protocol":1,"Port":80}]}},{"Service":{"Namespace":"a","Name":"b"}}]`,
	} {
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, data []byte, masquerade bool) {
		var items []*model.ServiceEndpoints
		if json.Unmarshal(data, &items) != nil {
			return
		}
		kept := items[:0]
		for _, se := range items {
			if se != nil && se.Service != nil {
				var eps []*model.Endpoint
				for _, e := range se.Endpoints {
					if e != nil {
						eps = append(eps, e)
					}
				}
				se.Endpoints = eps
				kept = append(kept, se) // the model never holds nil ones
			}
		}
		var opts Options
		if masquerade {
			opts.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("1100::/64")}
			opts.NodeIPs = []netip.Addr{netip.MustParseAddr("10.0.0.2")}
		}
		rs, _ := buildRuleset(TableName("fuzz"), opts, kept)
		if rs != nil {
			_ = rs.Text()
		}
	})
}
