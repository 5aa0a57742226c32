//go:build linux

package nft

import (
	"fmt"
	"net/netip"
	"testing"

	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/model"
)

// TestKernelForwardDrop sends traffic from the client of netns.Blog to a
// service's cluster IPs, whose endpoint is a pod behind the node, on a
// node whose FORWARD policy is DROP in both families (iptables-nft's
// filter tables, as Docker sets them). An accept in kpng's table cannot
// override another table's drop (a packet dropped by any base chain of a
// hook is dropped), so the sink writes nothing for it: the traffic is
// dropped until the node's firewall accepts what kpng marks for
// masquerading and the replies (two rules, the equivalent of kube-proxy's
// KUBE-FORWARD, added here by hand), and then flows. `to-nft
// --forward-accept` keeps those rules in a chain of its own
// (backends/iptables' ForwardAccept, tested with an nft sink by its
// TestKernelForwardAcceptNFT): this package writes nftables only.
func TestKernelForwardDrop(t *testing.T) {
	netns.RequirePrivileged(t)
	netns.RequireCommands(t, "iptables-nft", "ip6tables-nft")
	b := kernelTopology(t)
	for _, bin := range []string{"iptables-nft", "ip6tables-nft"} {
		b.Node.MustExec(bin, "-P", "FORWARD", "DROP")
	}
	cidrs := []netip.Prefix{netip.MustParsePrefix("11.0.0.0/16"), netip.MustParsePrefix("1100::/64")}
	s := newOptionsSink(t, b, "fwd", Options{ClusterCIDRs: cidrs})
	web := svc("default", "web", ipset(webV4.String(), webV6.String()), tcp(80, 6000), udp(80, 6000))
	s.setAll(&model.ServiceEndpoints{Service: web, Endpoints: localEndpoints(netns.PodID)})
	s.sync()
	ask := func() (served, dropped []string) {
		return b.ServedByPod([]netip.Addr{webV4, webV6}, 80)
	}
	if served, _ := ask(); len(served) > 0 {
		t.Errorf("FORWARD policy DROP, nothing accepting: %v served; want the traffic dropped (if kpng's table could override the drop, the backend should)", served)
	}
	mark := Options{}.mark()
	for _, bin := range []string{"iptables-nft", "ip6tables-nft"} {
		b.Node.MustExec(bin, "-A", "FORWARD", "-m", "mark", "--mark", markArg(mark), "-j", "ACCEPT")
		b.Node.MustExec(bin, "-A", "FORWARD", "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT")
	}
	if _, dropped := ask(); len(dropped) > 0 {
		t.Errorf("FORWARD policy DROP, kpng's mark and the replies accepted: %v not served", dropped)
	}
}

// markArg returns the iptables --mark argument matching the bit of mark.
func markArg(mark uint32) string {
	return fmt.Sprintf("%#x/%#x", mark, mark)
}
