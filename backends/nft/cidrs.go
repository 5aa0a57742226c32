package nft

import (
	"net/netip"
	"slices"
)

// addrRange is an interval of addresses of one family, From to Last
// included: a service CIDR, or several that overlap or touch, merged
// (one drop rule of cluster-ips-check each).
type addrRange struct {
	From, Last netip.Addr
}

// family returns the range's family.
func (r addrRange) family() ipFamily { return familyOf(r.From) }

// String returns the range as nft lists a match on it: a prefix when
// the range is one ("10.96.0.0/16", an address alone for a single
// address), else "from-last".
func (r addrRange) String() string {
	if p, ok := r.prefix(); ok {
		return prefixText(p)
	}
	return r.From.String() + "-" + r.Last.String()
}

// prefix returns the prefix that is exactly the range, if there is one.
func (r addrRange) prefix() (netip.Prefix, bool) {
	for bits := 0; bits <= r.From.BitLen(); bits++ {
		p := netip.PrefixFrom(r.From, bits)
		if p.Masked().Addr() != r.From {
			continue
		}
		if lastOf(p) == r.Last {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

// lastOf returns the last address of p.
func lastOf(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// mergedRanges returns the ranges covering prefixes (in canonical form:
// model.CanonicalCIDRs), merged where they overlap or touch (one rule
// each, no address matched twice), sorted by family and address.
func mergedRanges(prefixes []netip.Prefix) []addrRange {
	var rs []addrRange
	for _, p := range prefixes {
		rs = append(rs, addrRange{From: p.Addr(), Last: lastOf(p)})
	}
	slices.SortFunc(rs, func(a, b addrRange) int { return a.From.Compare(b.From) })
	var out []addrRange
	for _, r := range rs {
		if n := len(out); n > 0 {
			cur := &out[n-1]
			next := cur.Last.Next()
			if cur.family() == r.family() && (!next.IsValid() || r.From.Compare(next) <= 0) {
				if r.Last.Compare(cur.Last) > 0 {
					cur.Last = r.Last
				}
				continue
			}
		}
		out = append(out, r)
	}
	return out
}

// rangeChanges are the service CIDR ranges deleted and added in a
// round, and Now all of them after it (when any changed: the rules of
// cluster-ips-check are written again from it).
type rangeChanges struct {
	Created, Deleted []addrRange
	// Now are all the ranges after the round, set only when some changed.
	Now []addrRange
}

// Len returns the number of ranges changed.
func (c rangeChanges) Len() int { return len(c.Created) + len(c.Deleted) }
