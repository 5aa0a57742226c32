package userspace

import (
	"encoding/json"
	"testing"

	"sigs.k8s.io/kpng/model"
)

// fuzzSeeds are states (kpng-json's form) to start the backends' fuzzing
// from: ordinary services, and the odd values a model may still hold.
var fuzzSeeds = []string{
	`[{"Service":{"Namespace":"default","Name":"web","Type":"LoadBalancer","IPs":{"ClusterIPs":{"V4":["10.96.0.10"],"V6":["fd00::10"]},"ExternalIPs":{"V4":["10.0.0.55"]},"LoadBalancerIPs":{"V4":["192.0.2.1"]}},"Ports":[{"Name":"http","Protocol":1,"Port":80,"NodePort":30080,"TargetPort":8080},{"Name":"dns","Protocol":2,"Port":53,"TargetPortName":"dns"}],"ClientIPAffinity":{"TimeoutSeconds":-1},"ExternalTrafficToLocal":true,"LoadBalancerSourceRanges":["10.0.0.0/8"]},"Endpoints":[{"IPs":{"V4":["10.1.0.2"]},"Local":true,"Ready":true,"Serving":true,"PortOverrides":{"dns":5353}},{"IPs":{"V6":["1100::2"]},"Serving":true,"Terminating":true,"Hints":{"SameZone":true}}]}]`,
	`[{"Service":{"Namespace":"a","Name":"b","IPs":{"ClusterIPs":{"V4":["bogus","10.96.0.1"]},"Headless":true},"Ports":[null,{"Protocol":3,"Port":70000,"NodePort":-1,"TargetPort":-4}]},"Endpoints":[null,{"IPs":{}}]}]`,
	`[{"Service":null},{"Service":{"Ports":[{"Protocol":1,"Port":80},{"Protocol":1,"Port":80}]}}]`,
}

// FuzzPlan: any state is planned without a panic, and every frontend it
// plans has a valid address and port and targets of its own family.
func FuzzPlan(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var items []*model.ServiceEndpoints
		if json.Unmarshal(data, &items) != nil {
			return
		}
		for _, se := range items {
			if se == nil || se.Service == nil {
				continue // the model never holds these
			}
			frontends, _ := plan(se, testNode)
			for k, r := range frontends {
				if !k.addr.IsValid() || k.addr.Port() == 0 {
					t.Fatalf("frontend %v of %s", k, r.service)
				}
				for _, tg := range append(r.targets, r.clusterTargets...) {
					if tg.Addr().Is4() != k.addr.Addr().Is4() || tg.Port() == 0 {
						t.Fatalf("frontend %v targets %v", k, tg)
					}
				}
			}
		}
	})
}
