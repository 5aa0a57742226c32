// Package conntrack deletes the conntrack entries that a change of a
// kernel backend's rules made stale, for the backends that share it (nft,
// iptables): UDP has no connection teardown, so an entry keeps sending a
// client's flow where its first packet went (to an endpoint, or nowhere)
// until it expires, whatever the rules say since.
//
// Deleting those entries is a duty of every backend whose UDP traffic goes
// through conntrack (kube-proxy does it; the conformance kit's
// udp-stale-flow scenario checks it), and this package is for outside
// backends too. A backend computes which flows are stale (its own
// business: it knows which service addresses lead to which endpoints
// before and after a round) and, once its new rules are in place, hands
// them to DeleteFlows (or Delete, with a handle of its own) as Flows: one
// per UDP service address and port and removed endpoint. The table of each
// family is dumped once and each entry matched in O(1), whatever the
// number of flows. See the example.
package conntrack
