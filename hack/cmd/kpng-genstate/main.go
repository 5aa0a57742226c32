// Command kpng-genstate writes a state file (localsink/statefile) of
// synthetic ClusterIP services, for measuring `kpng file … to-local
// to-<backend>` at scale (hack/bench-file-nft.sh): services
// bench/svc-NNNNN with one cluster IP from 10.96.1.1 up and TCP 80 → 8080,
// each with its endpoints in 10.128.0.0/9 (ready, not local: endpoint k
// of a service runs on node-(k mod --nodes), none on the node the proxier
// runs as; --nodes=0 leaves node names out, so that every endpoint may be
// local, the state of backends/nft's benchmarks and of this tool before
// 2026-12-02).
//
//	kpng-genstate --services=50000 --endpoints=10 --out=state.yaml
//
// --without-first-endpoint=I leaves out the first endpoint of service I
// (one endpoint change against the same state without it), --format=json
// writes the list as JSON (which kpng file reads too, faster).
package main

import (
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"os"

	"sigs.k8s.io/kpng/localsink/statefile"
	"sigs.k8s.io/kpng/model"
)

func main() {
	services := flag.Int("services", 10000, "number of services")
	endpoints := flag.Int("endpoints", 10, "endpoints per service")
	without := flag.Int("without-first-endpoint", -1, "leave out the first endpoint of this service (-1: none)")
	nodes := flag.Int("nodes", 10, "the nodes the endpoints run on (node-0 …; 0: no node names)")
	format := flag.String("format", "yaml", "yaml (as kpng kube … to-file writes it) or json")
	out := flag.String("out", "", "the file to write (required)")
	flag.Parse()
	if *out == "" || *services < 0 || *services > 250*256*16 || *endpoints < 1 || *nodes < 0 || *services**endpoints >= 1<<23 {
		fmt.Fprintln(os.Stderr, "usage: kpng-genstate --services=N (at most 1,024,000) --endpoints=E (N×E under 2^23) [--nodes=K] --out=FILE [--format=yaml|json] [--without-first-endpoint=I]")
		os.Exit(2)
	}
	items := make([]*model.ServiceEndpoints, *services)
	for i := range items {
		items[i] = service(i, *endpoints, *nodes, i == *without)
	}
	var err error
	switch *format {
	case "yaml":
		err = statefile.Write(*out, items)
	case "json":
		var data []byte
		if data, err = json.Marshal(items); err == nil {
			err = os.WriteFile(*out, data, 0o644)
		}
	default:
		err = fmt.Errorf("--format=%s: want yaml or json", *format)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kpng-genstate:", err)
		os.Exit(1)
	}
}

// service returns service i with its endpoints (without the first one
// when dropFirst), endpoint k on node-(k mod nodes) (no node name when
// nodes is 0).
func service(i, endpoints, nodes int, dropFirst bool) *model.ServiceEndpoints {
	cluster := netip.AddrFrom4([4]byte{10, byte(96 + i/(250*256)), byte(1 + i/250%256), byte(1 + i%250)})
	se := &model.ServiceEndpoints{Service: &model.Service{
		Namespace: "bench", Name: fmt.Sprintf("svc-%05d", i), Type: "ClusterIP",
		IPs:   model.ServiceIPs{ClusterIPs: set(cluster)},
		Ports: []*model.PortMapping{{Protocol: model.TCP, Port: 80, TargetPort: 8080}},
	}}
	for k := range endpoints {
		if k == 0 && dropFirst {
			continue
		}
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], 10<<24|128<<16+uint32(i*endpoints+k))
		ep := &model.Endpoint{IPs: set(netip.AddrFrom4(b)), Ready: true, Serving: true}
		if nodes > 0 {
			ep.NodeName = fmt.Sprintf("node-%d", k%nodes)
		}
		se.Endpoints = append(se.Endpoints, ep)
	}
	return se
}

func set(a netip.Addr) model.IPSet {
	s, _ := model.NewIPSet(a.String())
	return s
}
