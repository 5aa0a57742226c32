//go:build linux

package iptables

import (
	"context"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"sigs.k8s.io/kpng/backends/nft"
	"sigs.k8s.io/kpng/internal/netns"
)

// TestKernelForwardAcceptNFT is TestKernelForwardDrop for the nft
// backend: on a node whose FORWARD policy is DROP in both families, set
// with iptables-legacy or iptables-nft, an nft sink serves a service's
// external IPs (TCP and UDP, both families) from a pod behind the node.
// Without a ForwardAccept the traffic is dropped (the control: an accept
// in the sink's nftables table cannot override another table's drop);
// with one (VariantAuto: it finds the variant whose policy is DROP) it is
// served, and only that variant holds the chain; a jump deleted by hand
// is inserted again by the check; after Cleanup the chain and the jump
// are gone, and the traffic is dropped again.
func TestKernelForwardAcceptNFT(t *testing.T) {
	netns.RequirePrivileged(t)
	netns.RequireCommands(t, "nsenter", "iptables-legacy-restore", "ip6tables-legacy-restore", "iptables-nft-restore", "ip6tables-nft-restore")
	for _, variant := range []string{VariantLegacy, VariantNFT} {
		t.Run(variant, func(t *testing.T) {
			b := netns.Blog(t)
			for _, f := range families {
				b.Node.MustExec(binary(variant, f, ""), "-P", "FORWARD", "DROP")
			}
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			nsFile, err := os.Open(b.Node.Path())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { nsFile.Close() })
			fd := int(nsFile.Fd())
			opts := nft.Options{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("11.0.0.0/8"), netip.MustParsePrefix("1100::/16")}}
			s, err := nft.New(ctx, nft.Config{ServiceProxyName: "fwd", Options: opts, Conn: nft.ConnInNetNS(fd),
				Conntrack: func() (*netlink.Handle, error) {
					return netlink.NewHandleAt(vnetns.NsHandle(fd), unix.NETLINK_NETFILTER)
				}})
			if err != nil {
				t.Fatal(err)
			}
			syncForwardWeb(t, s)
			ask := func() (served, dropped []string) {
				return b.ServedByPod([]netip.Addr{netns.ServiceV4, netns.ServiceV6}, 80)
			}
			if served, _ := ask(); len(served) > 0 {
				t.Fatalf("FORWARD policy DROP, no ForwardAccept: %v served, want the traffic dropped (the control)", served)
			}

			fa, err := NewForwardAccept(ForwardAcceptConfig{ServiceProxyName: "fwd", NetNS: b.Node.Path(), CheckPeriod: 100 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			chainName := fa.Chain()
			filter := func(v string, f family) filterState {
				return parseFilter([]byte(b.Node.MustExec(binary(v, f, "-save"), "-t", "filter")), chainName)
			}
			// waitJumps waits until both families hold the chain and
			// its jump, the check's period being 100 ms.
			waitJumps := func(what string) {
				t.Helper()
				for _, f := range families {
					var st filterState
					for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
						if st = filter(variant, f); len(st.Jumps) == 1 && st.Chain {
							break
						}
					}
					if len(st.Jumps) != 1 || !st.Chain {
						t.Fatalf("%s: %s %s: chain %s (declared: %v) and one jump from FORWARD, want both within 10 s; jumps %q", what, variant, f, chainName, st.Chain, st.Jumps)
					}
					if want := forwardAcceptRules(0); strings.Join(st.Rules, "\n") != strings.Join(want, "\n") {
						t.Fatalf("%s: %s %s: chain %s holds\n%s\nwant\n%s", what, variant, f, chainName, strings.Join(st.Rules, "\n"), strings.Join(want, "\n"))
					}
				}
			}
			runCtx, stopRun := context.WithCancel(ctx)
			runDone, err := fa.Start(runCtx)
			if err != nil {
				t.Fatalf("Start: %v", err)
			}
			t.Cleanup(func() { stopRun(); <-runDone })
			waitJumps("ForwardAccept running")
			if _, dropped := ask(); len(dropped) > 0 {
				t.Errorf("FORWARD policy DROP, ForwardAccept running: %v not served", dropped)
			}
			other := VariantNFT
			if variant == VariantNFT {
				other = VariantLegacy
			}
			for _, f := range families {
				if st := filter(other, f); st.Chain || len(st.Jumps) > 0 {
					t.Errorf("%s %s, whose FORWARD policy is ACCEPT: holds chain %s or a jump to it (%q), want neither", other, f, chainName, st.Jumps)
				}
			}

			// A jump deleted by hand: the check inserts it again.
			for _, f := range families {
				b.Node.MustExec(binary(variant, f, ""), append([]string{"-t", "filter", "-D", "FORWARD"}, forwardAcceptJump(chainName).rule("fwd")...)...)
			}
			waitJumps("the jumps deleted")
			if _, dropped := ask(); len(dropped) > 0 {
				t.Errorf("the jumps deleted and inserted again: %v not served", dropped)
			}

			stopRun()
			<-runDone
			if err := fa.Cleanup(context.Background()); err != nil {
				t.Fatalf("Cleanup: %v", err)
			}
			for _, v := range []string{VariantLegacy, VariantNFT} {
				for _, f := range families {
					if st := filter(v, f); st.Chain || len(st.Jumps) > 0 {
						t.Errorf("after Cleanup, %s %s: chain %s declared %v, jumps %q; want neither", v, f, chainName, st.Chain, st.Jumps)
					}
				}
			}
			if served, _ := ask(); len(served) > 0 {
				t.Errorf("after Cleanup: %v served, want the traffic dropped again", served)
			}
		})
	}
}
