//go:build linux

package main

import (
	"net/netip"
	"strings"

	"sigs.k8s.io/kpng/cmd/kpng/app"
)

// parseIPs parses a comma-separated list of addresses given to flag
// (named with its command in messages: "to-nft --node-ip").
func parseIPs(flag, list string) ([]netip.Addr, error) {
	return parseList(list, func(s string) (netip.Addr, error) {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return a, app.Usagef("%s: %q is not an IP address", flag, s)
		}
		return a.Unmap(), nil
	})
}

// parseCIDRs parses a comma-separated list of CIDRs given to flag.
func parseCIDRs(flag, list string) ([]netip.Prefix, error) {
	return parseList(list, func(s string) (netip.Prefix, error) {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return p, app.Usagef("%s: %q is not a CIDR", flag, s)
		}
		if p != p.Masked() {
			return p, app.Usagef("%s: %q has host bits set (did you mean %s?)", flag, s, p.Masked())
		}
		return p, nil
	})
}

// parseList parses the non-empty items of a comma-separated list with
// parse.
func parseList[T any](list string, parse func(string) (T, error)) ([]T, error) {
	var out []T
	for _, s := range strings.Split(list, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		v, err := parse(s)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}
