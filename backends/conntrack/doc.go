// Package conntrack deletes the conntrack entries that a change of a
// kernel backend's rules made stale, for the backends that share it (nft,
// iptables): UDP has no connection teardown, so an entry keeps sending a
// client's flow where its first packet went (to an endpoint, or nowhere)
// until it expires, whatever the rules say since.
//
// A backend computes which flows are stale (its own business: it knows
// which service addresses lead to which endpoints before and after a
// round) and hands them to Delete as Flows; Delete dumps the conntrack
// table of each family once and deletes the matching entries, matching
// each entry in O(1) whatever the number of flows.
package conntrack
