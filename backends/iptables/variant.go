package iptables

import (
	"context"
	"fmt"
)

// The iptables variants: the two sets of binaries Debian's iptables
// package ships, writing to the legacy xtables kernel tables or to
// nftables.
const (
	// VariantAuto picks the variant the node already uses (DetectVariant).
	VariantAuto = "auto"
	// VariantLegacy is iptables-legacy, ip6tables-legacy and their
	// -save and -restore.
	VariantLegacy = "legacy"
	// VariantNFT is iptables-nft, ip6tables-nft and their -save and
	// -restore.
	VariantNFT = "nft"
)

// binary returns the name of a tool ("", "-save", "-restore") of the
// variant in family f: "ip6tables-legacy-restore".
func binary(variant string, f family, tool string) string {
	name := "iptables"
	if f == ipv6 {
		name = "ip6tables"
	}
	return name + "-" + variant + tool
}

// DetectVariant returns the variant whose tables hold more rules, as
// kube-proxy's images do (iptables-wrapper): it counts the rules that
// iptables-legacy-save and ip6tables-legacy-save print against those of
// the -nft ones, and prefers nft when neither has more (a node where
// nothing uses iptables yet). A variant whose save fails counts as
// empty; both failing is an error.
func DetectVariant(ctx context.Context, r Runner) (string, error) {
	count := map[string]int{}
	var errs []error
	for _, v := range []string{VariantLegacy, VariantNFT} {
		for _, f := range families {
			out, err := r.Run(ctx, binary(v, f, "-save"), nil, nil)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			count[v] += countRules(out)
		}
	}
	if len(errs) == 4 {
		return "", fmt.Errorf("detect the iptables variant: no iptables-save works: %v", errs[0])
	}
	if count[VariantLegacy] > count[VariantNFT] {
		return VariantLegacy, nil
	}
	return VariantNFT, nil
}

// resolveVariant returns the variant to use for v ("" is auto).
func resolveVariant(ctx context.Context, r Runner, v string) (string, error) {
	switch v {
	case VariantLegacy, VariantNFT:
		return v, nil
	case "", VariantAuto:
		return DetectVariant(ctx, r)
	}
	return "", fmt.Errorf("iptables variant %q: want auto, legacy or nft", v)
}
