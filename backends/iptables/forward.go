package iptables

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"time"
)

// ForwardAcceptConfig configures a ForwardAccept: the iptables side of a
// proxier that is not this package's (the nft backend's) on a node whose
// filter FORWARD policy is DROP.
type ForwardAcceptConfig struct {
	// ServiceProxyName is the proxier's service-proxy-name: the chain is
	// ForwardAcceptChain(ServiceProxyName).
	ServiceProxyName string
	// MasqueradeBit is the proxier's masquerade mark bit (1-31); 0 means
	// DefaultMasqueradeBit.
	MasqueradeBit int
	// NetNS is the path of the network namespace to write in
	// (/run/netns/x); empty: the current one.
	NetNS string
	// Variant is where the chain goes. VariantAuto (or empty): each
	// variant and family whose filter FORWARD policy is DROP, or that
	// holds the chain or its jump already, looked at again at each check
	// (a legacy filter table that does not exist is not created by
	// looking); VariantLegacy or VariantNFT: that one, both families,
	// whatever the policy.
	Variant string
	// CheckPeriod, if positive, is how often Start checks the chain and
	// its jump and writes them again when they differ or are gone (a
	// firewall reload, iptables -F, the jump deleted); 0: Start ensures
	// them once.
	CheckPeriod time.Duration
	// Runner runs iptables-save and iptables-restore; nil:
	// ExecRunner{NetNS: NetNS}.
	Runner Runner
}

// Validate reports the first setting of c that cannot be used.
func (c ForwardAcceptConfig) Validate() error {
	switch c.Variant {
	case "", VariantAuto, VariantLegacy, VariantNFT:
	default:
		return fmt.Errorf("forward accept: variant %q: want auto, legacy or nft", c.Variant)
	}
	if c.CheckPeriod < 0 {
		return fmt.Errorf("forward accept: check period %v: must not be negative", c.CheckPeriod)
	}
	if err := (Options{MasqueradeBit: c.MasqueradeBit}).Validate(); err != nil {
		return fmt.Errorf("forward accept: %w", err)
	}
	return nil
}

// ForwardAcceptChain returns the name of the filter chain a ForwardAccept
// of the proxier serviceProxyName keeps: "KPNG-FWD-", 6 characters of the
// hash of the name (those of its ChainPrefix), "-ACCEPT". No ChainPrefix
// starts so (its 6 characters hold no "-"), so the chain is never one of
// an iptables proxier's, whose full syncs delete the chains of their
// prefix they did not plan.
func ForwardAcceptChain(serviceProxyName string) string {
	return "KPNG-FWD-" + hash(serviceProxyName, 6) + "-ACCEPT"
}

// forwardAcceptRules are the rules of the chain, as iptables-save prints
// them (the check compares them so): what the proxier marked for
// masquerading, and the replies and related packets of accepted
// connections (kube-proxy's KUBE-FORWARD; the iptables proxier's own
// FORWARD chain ends with the same two).
func forwardAcceptRules(masqueradeBit int) []string {
	mark := Options{MasqueradeBit: masqueradeBit}.mark()
	return []string{
		`-m comment --comment "kpng forwarding: marked for masquerading" -m mark --mark ` + mark + "/" + mark + " -j ACCEPT",
		`-m comment --comment "kpng forwarding: replies and related" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT`,
	}
}

// forwardAcceptJump is the jump from filter FORWARD to the chain.
func forwardAcceptJump(chainName string) jump {
	return jump{Table: "filter", From: "FORWARD", To: chainName}
}

// filterState is what iptables-save -t filter output says of a
// ForwardAccept's chain.
type filterState struct {
	// Policy is the FORWARD chain's policy ("DROP", "ACCEPT"; "" when
	// the output has no filter table).
	Policy string
	// Chain is true when the chain is declared; Rules are its rules (the
	// text after "-A <chain> ").
	Chain bool
	Rules []string
	// Jumps are the rules of FORWARD that target the chain, as saved
	// ("-A FORWARD … -j <chain>").
	Jumps []string
}

// parseFilter reads iptables-save -t filter output for the chain named
// chainName.
func parseFilter(save []byte, chainName string) filterState {
	var st filterState
	for l := range bytes.SplitSeq(save, []byte("\n")) {
		line := strings.TrimSpace(string(l))
		switch {
		case strings.HasPrefix(line, ":FORWARD "):
			st.Policy, _, _ = strings.Cut(strings.TrimPrefix(line, ":FORWARD "), " ")
		case strings.HasPrefix(line, ":"+chainName+" "):
			st.Chain = true
		case strings.HasPrefix(line, "-A "+chainName+" "):
			st.Rules = append(st.Rules, strings.TrimPrefix(line, "-A "+chainName+" "))
		case strings.HasPrefix(line, "-A FORWARD ") && strings.HasSuffix(line, " -j "+chainName):
			st.Jumps = append(st.Jumps, line)
		}
	}
	return st
}

// forwardAcceptRepair returns the iptables-restore --noflush input that
// makes the chain hold rules and a jump to it from FORWARD exist (the
// chain declared, which flushes it, and filled; the jump inserted first
// when missing), with what was wrong; nil when st is already so.
func forwardAcceptRepair(st filterState, chainName, serviceProxyName string, rules []string) (restore []byte, why string) {
	var wrong []string
	switch {
	case !st.Chain:
		wrong = append(wrong, "the chain is missing")
	case !slices.Equal(st.Rules, rules):
		wrong = append(wrong, "the chain's rules differ")
	}
	var inserts []string
	if len(st.Jumps) == 0 {
		wrong = append(wrong, "the jump from FORWARD is missing")
		inserts = append(inserts, forwardAcceptJump(chainName).insertLine(serviceProxyName))
	}
	if len(wrong) == 0 {
		return nil, ""
	}
	return restoreInput("filter", &tablePlan{Chains: []*chain{{Name: chainName, Rules: rules}}}, nil, inserts...), strings.Join(wrong, ", ")
}

// forwardAcceptRemoval returns the iptables-restore --noflush input that
// deletes the jumps of st and the chain (declared first, which flushes
// it); nil when neither is there.
func forwardAcceptRemoval(st filterState, chainName string) []byte {
	if !st.Chain && len(st.Jumps) == 0 {
		return nil
	}
	var b bytes.Buffer
	b.WriteString("*filter\n")
	if st.Chain {
		b.WriteString(":" + chainName + " - [0:0]\n")
	}
	for _, j := range st.Jumps {
		b.WriteString("-D " + strings.TrimPrefix(j, "-A ") + "\n")
	}
	if st.Chain {
		b.WriteString("-X " + chainName + "\n")
	}
	b.WriteString("COMMIT\n")
	return b.Bytes()
}
