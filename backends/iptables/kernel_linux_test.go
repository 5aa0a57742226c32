//go:build linux

package iptables

import (
	"context"
	"strings"
	"testing"

	"sigs.k8s.io/kpng/internal/netns"
)

// TestKernelGoldenAccepted restores the golden cases' input (the text
// the golden files show and the sink sends) into a fresh namespace with
// both variants, and checks that iptables-save lists every chain with
// the number of rules planned: every rule kind is accepted by the kernel
// and the binaries of both variants.
func TestKernelGoldenAccepted(t *testing.T) {
	netns.RequirePrivileged(t)
	netns.RequireCommands(t, "nsenter", "iptables-legacy-restore", "iptables-nft-restore")
	for _, variant := range []string{VariantLegacy, VariantNFT} {
		for name, tc := range goldenCases() {
			t.Run(variant+"/"+name, func(t *testing.T) {
				ns := netns.New(t, "ipt")
				r := ExecRunner{NetNS: ns.Path()}
				pl := planner{prefix: ChainPrefix("golden"), opts: tc.opts, randomFully: tc.randomFully}
				p, _ := pl.build(tc.services)
				for _, f := range families {
					for _, table := range tables {
						tp := p.Families[f].table(table)
						ctx := context.Background()
						if _, err := r.Run(ctx, binary(variant, f, "-restore"), []string{"--noflush", "--wait"}, restoreInput(table, tp, nil)); err != nil {
							t.Fatalf("%s %s: %v", f, table, err)
						}
						out, err := r.Run(ctx, binary(variant, f, "-save"), []string{"-t", table}, nil)
						if err != nil {
							t.Fatalf("%s %s: save: %v", f, table, err)
						}
						for _, c := range tp.Chains {
							if got := strings.Count(string(out), "\n-A "+c.Name+" "); got != len(c.Rules) {
								t.Errorf("%s %s: chain %s: %d rules listed, %d planned", f, table, c.Name, got, len(c.Rules))
							}
						}
						if got := chainsWithPrefix(out, pl.prefix); len(got) != len(tp.Chains) {
							t.Errorf("%s %s: %d chains listed, %d planned", f, table, len(got), len(tp.Chains))
						}
					}
				}
			})
		}
	}
}
