//go:build linux

package iptables

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// filterSave returns iptables-save -t filter output with FORWARD's
// policy and the lines given.
func filterSave(policy string, lines ...string) string {
	return "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD " + policy + " [0:0]\n:OUTPUT ACCEPT [0:0]\n" + strings.Join(append(lines, "COMMIT"), "\n") + "\n"
}

// newFakeForwardAccept returns a ForwardAccept of cfg whose commands go to
// r, with the binaries of installed found, and the legacy filter tables
// existing as legacy says (IPv4, IPv6).
func newFakeForwardAccept(t *testing.T, cfg ForwardAcceptConfig, r *fakeRunner, installed []string, legacy [2]bool) *ForwardAccept {
	t.Helper()
	cfg.Runner = r
	fa, err := NewForwardAccept(cfg)
	if err != nil {
		t.Fatal(err)
	}
	fa.lookPath = func(name string) (string, error) {
		for _, v := range installed {
			if strings.HasPrefix(name, "iptables-"+v) || strings.HasPrefix(name, "ip6tables-"+v) {
				return "/usr/sbin/" + name, nil
			}
		}
		return "", exec.ErrNotFound
	}
	fa.legacyFilter = func(f family) (bool, error) { return legacy[f], nil }
	return fa
}

func TestForwardAcceptEnsure(t *testing.T) {
	chainName := ForwardAcceptChain("fwd")
	rules := forwardAcceptRules(0)
	jumpLine := `-A FORWARD -m comment --comment "kpng fwd" -j ` + chainName
	full := []string{":" + chainName + " - [0:0]", jumpLine, "-A " + chainName + " " + rules[0], "-A " + chainName + " " + rules[1]}
	write := func(insert bool) string {
		in := "*filter\n:" + chainName + " - [0:0]\n-A " + chainName + " " + rules[0] + "\n-A " + chainName + " " + rules[1] + "\n"
		if insert {
			in += `-I FORWARD 1 -m comment --comment "kpng fwd" -j ` + chainName + "\n"
		}
		return in + "COMMIT\n"
	}
	save := func(bin string) call { return call{Name: bin, Args: "-t filter"} }
	restore := func(bin, in string) call { return call{Name: bin, Args: "--noflush --wait", Stdin: in} }
	for _, tc := range []struct {
		name      string
		variant   string
		installed []string
		legacy    [2]bool
		save      map[string]string
		fail      map[string]error
		want      []call
		repaired  []string
		err       string
	}{
		{
			name:      "auto: only the nft IPv4 table's policy is DROP; the legacy tables do not exist, and are not listed",
			installed: []string{VariantLegacy, VariantNFT},
			save: map[string]string{
				"iptables-nft-save -t filter":  filterSave("DROP"),
				"ip6tables-nft-save -t filter": filterSave("ACCEPT"),
			},
			want:     []call{save("iptables-nft-save"), restore("iptables-nft-restore", write(true)), save("ip6tables-nft-save")},
			repaired: []string{"nft IPv4: the chain is missing, the jump from FORWARD is missing"},
		},
		{
			name:      "auto: the legacy IPv6 table exists with the policy DROP, nft is not installed",
			installed: []string{VariantLegacy},
			legacy:    [2]bool{false, true},
			save:      map[string]string{"ip6tables-legacy-save -t filter": filterSave("DROP")},
			want:      []call{save("ip6tables-legacy-save"), restore("ip6tables-legacy-restore", write(true))},
			repaired:  []string{"legacy IPv6: the chain is missing, the jump from FORWARD is missing"},
		},
		{
			name:      "auto: all in place, nothing written",
			installed: []string{VariantNFT},
			save: map[string]string{
				"iptables-nft-save -t filter":  filterSave("DROP", full...),
				"ip6tables-nft-save -t filter": filterSave("DROP", full...),
			},
			want: []call{save("iptables-nft-save"), save("ip6tables-nft-save")},
		},
		{
			name:      "auto: the policy ACCEPT now, the chain there without its jump: repaired (once written, kept)",
			installed: []string{VariantNFT},
			save: map[string]string{
				"iptables-nft-save -t filter":  filterSave("ACCEPT", full[0], full[2], full[3]),
				"ip6tables-nft-save -t filter": filterSave("ACCEPT"),
			},
			want:     []call{save("iptables-nft-save"), restore("iptables-nft-restore", write(true)), save("ip6tables-nft-save")},
			repaired: []string{"nft IPv4: the jump from FORWARD is missing"},
		},
		{
			name:      "a rule changed: the chain written again, the jump kept",
			installed: []string{VariantNFT},
			save: map[string]string{
				"iptables-nft-save -t filter":  filterSave("DROP", full[0], full[1], "-A "+chainName+" -j ACCEPT"),
				"ip6tables-nft-save -t filter": filterSave("DROP", full...),
			},
			want:     []call{save("iptables-nft-save"), restore("iptables-nft-restore", write(false)), save("ip6tables-nft-save")},
			repaired: []string{"nft IPv4: the chain's rules differ"},
		},
		{
			name:      "legacy asked for: its tables listed (created) and written whatever the policy",
			variant:   VariantLegacy,
			installed: []string{VariantLegacy, VariantNFT},
			save: map[string]string{
				"iptables-legacy-save -t filter":  filterSave("ACCEPT"),
				"ip6tables-legacy-save -t filter": filterSave("ACCEPT"),
			},
			want: []call{save("iptables-legacy-save"), restore("iptables-legacy-restore", write(true)),
				save("ip6tables-legacy-save"), restore("ip6tables-legacy-restore", write(true))},
			repaired: []string{"legacy IPv4: the chain is missing, the jump from FORWARD is missing", "legacy IPv6: the chain is missing, the jump from FORWARD is missing"},
		},
		{
			name:      "a restore fails: the error names the table, the other family is written",
			installed: []string{VariantNFT},
			save: map[string]string{
				"iptables-nft-save -t filter":  filterSave("DROP"),
				"ip6tables-nft-save -t filter": filterSave("DROP"),
			},
			fail: map[string]error{"iptables-nft-restore": errors.New("exit status 1: line 2 failed")},
			want: []call{save("iptables-nft-save"), restore("iptables-nft-restore", write(true)),
				save("ip6tables-nft-save"), restore("ip6tables-nft-restore", write(true))},
			repaired: []string{"nft IPv6: the chain is missing, the jump from FORWARD is missing"},
			err:      "forward accept (nft IPv4): write chain " + chainName + " and its jump from filter FORWARD (the chain is missing, the jump from FORWARD is missing): exit status 1: line 2 failed",
		},
		{
			name: "auto, no iptables at all",
			err:  "forward accept: no iptables binaries found (iptables-nft-restore, iptables-legacy-restore)",
		},
		{
			name:    "nft asked for, not installed",
			variant: VariantNFT, installed: []string{VariantLegacy},
			err: "forward accept (nft IPv4): iptables-nft-restore not found\nforward accept (nft IPv6): ip6tables-nft-restore not found",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &fakeRunner{save: tc.save, fail: tc.fail}
			fa := newFakeForwardAccept(t, ForwardAcceptConfig{ServiceProxyName: "fwd", Variant: tc.variant}, r, tc.installed, tc.legacy)
			repaired, err := fa.Ensure(context.Background())
			if got := errString(err); got != tc.err {
				t.Errorf("error %q, want %q", got, tc.err)
			}
			if diff := cmp.Diff(tc.repaired, repaired); diff != "" {
				t.Errorf("repaired (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.want, r.take()); diff != "" {
				t.Errorf("commands (-want +got):\n%s", diff)
			}
		})
	}
}

func TestForwardAcceptCleanup(t *testing.T) {
	chainName := ForwardAcceptChain("fwd")
	jumpLine := `-A FORWARD -m comment --comment "kpng fwd" -j ` + chainName
	r := &fakeRunner{save: map[string]string{
		"iptables-nft-save -t filter":     filterSave("DROP", ":"+chainName+" - [0:0]", "-A FORWARD -j DOCKER-USER", jumpLine, jumpLine, "-A "+chainName+" -j ACCEPT"),
		"ip6tables-nft-save -t filter":    filterSave("DROP"),
		"ip6tables-legacy-save -t filter": filterSave("DROP", ":"+chainName+" - [0:0]"),
	}}
	// Asked for nft only, it cleans legacy too; the legacy IPv4 table
	// does not exist: not listed.
	fa := newFakeForwardAccept(t, ForwardAcceptConfig{ServiceProxyName: "fwd", Variant: VariantNFT}, r, []string{VariantLegacy, VariantNFT}, [2]bool{false, true})
	if err := fa.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
	del := `-D FORWARD -m comment --comment "kpng fwd" -j ` + chainName + "\n"
	want := []call{
		{Name: "ip6tables-legacy-save", Args: "-t filter"},
		{Name: "ip6tables-legacy-restore", Args: "--noflush --wait", Stdin: "*filter\n:" + chainName + " - [0:0]\n-X " + chainName + "\nCOMMIT\n"},
		{Name: "iptables-nft-save", Args: "-t filter"},
		{Name: "iptables-nft-restore", Args: "--noflush --wait", Stdin: "*filter\n:" + chainName + " - [0:0]\n" + del + del + "-X " + chainName + "\nCOMMIT\n"},
		{Name: "ip6tables-nft-save", Args: "-t filter"},
	}
	if diff := cmp.Diff(want, r.take()); diff != "" {
		t.Errorf("commands (-want +got):\n%s", diff)
	}
}

func TestForwardAcceptChain(t *testing.T) {
	for _, name := range []string{"", "fwd", strings.Repeat("x", 63)} {
		c := ForwardAcceptChain(name)
		if len(c) > MaxChainName {
			t.Errorf("ForwardAcceptChain(%q) = %q: %d characters, want at most %d", name, c, len(c), MaxChainName)
		}
		// A ChainPrefix is "KPNG-", 6 base32 characters, "-": "FWD-…"
		// cannot be those 6.
		if strings.HasPrefix(c, ChainPrefix(name)) || strings.Contains(ChainPrefix(name)[5:11], "-") {
			t.Errorf("ForwardAcceptChain(%q) = %q starts with the iptables proxier's prefix %q", name, c, ChainPrefix(name))
		}
	}
	if a, b := ForwardAcceptChain("a"), ForwardAcceptChain("b"); a == b {
		t.Errorf("two proxiers share chain %s", a)
	}
}

func TestForwardAcceptConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg ForwardAcceptConfig
		err string
	}{
		{ForwardAcceptConfig{}, ""},
		{ForwardAcceptConfig{Variant: "both"}, `forward accept: variant "both": want auto, legacy or nft`},
		{ForwardAcceptConfig{CheckPeriod: -1}, "forward accept: check period -1ns: must not be negative"},
		{ForwardAcceptConfig{MasqueradeBit: 32}, "forward accept: options: MasqueradeBit 32: must be between 1 and 31 (0: the default)"},
	} {
		if got := errString(tc.cfg.Validate()); got != tc.err {
			t.Errorf("%+v: error %q, want %q", tc.cfg, got, tc.err)
		}
	}
}

// errString returns err's text, "" for nil.
func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
