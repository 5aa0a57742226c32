package watcher

import (
	"encoding/json"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"

	"sigs.k8s.io/kpng/model"
)

// FuzzConvert: any Service and EndpointSlice the API server could hand
// the watcher (as JSON) are converted without a panic, and the endpoints
// keep the model's promise: sorted by address, each address once, one
// address of one family each.
func FuzzConvert(f *testing.F) {
	f.Add([]byte(`{"metadata":{"namespace":"default","name":"web"},"spec":{"type":"LoadBalancer","clusterIPs":["10.96.0.10","fd00::10"],"externalIPs":["10.0.0.55","bogus"],"loadBalancerSourceRanges":["10.0.0.0/8","nope"],"externalTrafficPolicy":"Local","healthCheckNodePort":30000,"sessionAffinity":"ClientIP","ports":[{"name":"http","protocol":"TCP","port":80,"targetPort":"web","nodePort":30080},{"protocol":"SCTP","port":-5,"targetPort":70000}]},"status":{"loadBalancer":{"ingress":[{"ip":"192.0.2.1"},{"hostname":"x"}]}}}`),
		[]byte(`{"metadata":{"name":"web-1","labels":{"kubernetes.io/service-name":"web"}},"addressType":"IPv4","endpoints":[{"addresses":["10.1.0.2","10.1.0.3"],"conditions":{"ready":false,"terminating":true},"nodeName":"node-a","hints":{"forZones":[{"name":"z"}]}},{"addresses":["::1"]},{"addresses":[]}],"ports":[{"name":"http","port":8080},{"port":-1},{"name":"other"}]}`))
	f.Add([]byte(`{"spec":{"clusterIP":"None","ports":[{"port":0}]}}`), []byte(`{"addressType":"FQDN","endpoints":[{"addresses":["a.example"]}]}`))
	f.Fuzz(func(t *testing.T, svcJSON, sliceJSON []byte) {
		var svc v1.Service
		if json.Unmarshal(svcJSON, &svc) != nil || !proxied(&svc) {
			return
		}
		m := convertService(&svc)
		var slice discovery.EndpointSlice
		if json.Unmarshal(sliceJSON, &slice) != nil {
			return
		}
		eps := buildEndpoints(m, []*discovery.EndpointSlice{&slice}, model.Node{Name: "node-a", Zone: "z"})
		for i, e := range eps {
			if n := len(e.IPs.V4) + len(e.IPs.V6); n != 1 {
				t.Fatalf("endpoint %d has %d addresses: %+v", i, n, e.IPs)
			}
			if i > 0 && model.CompareEndpoints(eps[i-1], e) >= 0 {
				t.Fatalf("endpoints %d and %d out of order or repeated: %s, %s", i-1, i, eps[i-1].Key(), e.Key())
			}
		}
	})
}
