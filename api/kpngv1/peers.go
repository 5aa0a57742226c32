package kpngv1

import (
	"fmt"
	"net/netip"
	"slices"

	"sigs.k8s.io/kpng/model"
)

// PeerIPs checks a list of controller replica addresses, as a controller
// sets it and a backend takes it from a PeerAddresses message: IP addresses
// without a zone, at most MaxPeers. It returns them in the form both ends
// compare: IPv4-mapped addresses as IPv4, sorted, without duplicates. The
// error quotes the first bad address, cut (model.Quote).
func PeerIPs(ips []string) ([]string, error) {
	if len(ips) > MaxPeers {
		return nil, fmt.Errorf("%d replica addresses, more than %d", len(ips), MaxPeers)
	}
	out := make([]string, 0, len(ips))
	for _, ip := range ips {
		a, err := netip.ParseAddr(ip)
		if err != nil || a.Zone() != "" {
			return nil, fmt.Errorf("replica address %s is not an IP address", model.Quote(ip))
		}
		out = append(out, a.Unmap().String())
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}
