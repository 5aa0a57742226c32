package nftlisting

import "testing"

// TestServicePortsV4 counts the ports of the layouts in a listing as nft
// prints it (several elements a line, the typeof line, IPv6 maps left
// out, whether in the table ip6 listed after the table ip or in the one
// table inet of kpng before the table per family), each port once however
// many intervals it has: chains of their own, shards by cluster IP
// (interval maps, no element in service-ips), shards by endpoint count
// (hash maps and a goto element to the shard, then the keys in the
// shards' sets).
func TestServicePortsV4(t *testing.T) {
	listing := `table ip kpng-x {
	map service-ips-v4 {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 10.96.0.20 . tcp . 80 comment "default/lb" : goto svc4-AAAA-default/lb/tcp/80,
			     10.96.0.21 . udp . 53 comment "default/dns" : goto svc4-BBBB-default/dns/udp/53 }
	}

	map shard-endpoints-v4-10 {
		typeof ip daddr . meta l4proto . th dport . numgen random mod 4096 : ip daddr . th dport
		flags interval
		elements = { 10.96.0.10 . tcp . 80 . 0-2047 comment "svc4 default/web/tcp/80" : 10.1.0.2 . 8080,
			     10.96.0.10 . tcp . 80 . 2048-4095 comment "svc4 default/web/tcp/80" : 10.1.0.3 . 8080,
			     10.96.0.10 . udp . 80 . 0-4095 comment "svc4 default/web/udp/80" : 10.1.0.2 . 8080 }
	}
}
table ip6 kpng-x {
	map service-ips-v6 {
		type ipv6_addr . inet_proto . inet_service : verdict
		elements = { fd00::20 . tcp . 80 comment "default/lb" : goto svc6-CCCC-default/lb/tcp/80 }
	}

	map shard-endpoints-v6-16 {
		typeof ip6 daddr . meta l4proto . th dport . numgen random mod 4096 : ip6 daddr . th dport
		flags interval
		elements = { fd00::10 . tcp . 80 . 0-4095 comment "svc6 default/web/tcp/80" : fd00:1::2 . 8080 }
	}
}
`
	if got := ServicePortsV4(listing); got != 4 {
		t.Errorf("ServicePortsV4 = %d, want 4 (2 with chains, 2 in a shard map)", got)
	}
	byCount := `table inet kpng-x {
	map service-ips-v4 {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 10.96.0.20 . tcp . 80 comment "default/lb" : goto svc4-AAAA-default/lb/tcp/80,
			     10.96.0.10 . tcp . 80 comment "default/web" : goto shard4-2,
			     10.96.0.10 . udp . 80 comment "default/web" : goto shard4-1 }
	}

	map shard-endpoints-v4-1 {
		typeof ip daddr . meta l4proto . th dport . numgen random mod 1 : ip daddr . th dport
		elements = { 10.96.0.10 . udp . 80 . 0 comment "svc4 default/web/udp/80" : 10.1.0.2 . 8080 }
	}

	map shard-endpoints-v4-2 {
		typeof ip daddr . meta l4proto . th dport . numgen random mod 2 : ip daddr . th dport
		elements = { 10.96.0.10 . tcp . 80 . 0 comment "svc4 default/web/tcp/80" : 10.1.0.2 . 8080,
			     10.96.0.10 . tcp . 80 . 1 comment "svc4 default/web/tcp/80" : 10.1.0.3 . 8080 }
	}
}
`
	if got := ServicePortsV4(byCount); got != 3 {
		t.Errorf("ServicePortsV4 = %d, want 3 (1 with a chain, 2 in shard maps)", got)
	}
	bySet := `table ip kpng-x {
	map service-ips-v4 {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 10.96.0.20 . tcp . 80 comment "default/lb" : goto svc4-AAAA-default/lb/tcp/80 }
	}

	map shard-endpoints-v4-2 {
		typeof ip daddr . meta l4proto . th dport . numgen random mod 2 : ip daddr . th dport
		elements = { 10.96.0.10 . tcp . 80 . 0 comment "svc4 default/web/tcp/80" : 10.1.0.2 . 8080,
			     10.96.0.10 . tcp . 80 . 1 comment "svc4 default/web/tcp/80" : 10.1.0.3 . 8080,
			     10.96.0.11 . tcp . 80 . 0 comment "svc4 default/api/tcp/80" : 10.1.0.4 . 8080,
			     10.96.0.11 . tcp . 80 . 1 comment "svc4 default/api/tcp/80" : 10.1.0.5 . 8080 }
	}

	set shard-ips-v4-2 {
		type ipv4_addr . inet_proto . inet_service
		elements = { 10.96.0.10 . tcp . 80 comment "default/web",
			     10.96.0.11 . tcp . 80 comment "default/api" }
	}

	chain services {
		ip daddr . meta l4proto . th dport @shard-ips-v4-2 goto shard4-2
		ip daddr . meta l4proto . th dport vmap @service-ips-v4
	}
}
`
	if got := ServicePortsV4(bySet); got != 3 {
		t.Errorf("ServicePortsV4 = %d, want 3 (1 with a chain, 2 in a shard's set and map)", got)
	}
}
