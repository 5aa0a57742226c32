// Package nft is kpng's nftables backend: a localsink.Sink that programs
// the services it receives into one nftables table, over netlink
// (github.com/google/nftables), without the nft binary.
//
// The package has two layers:
//
//   - the rule model (model.go, build.go, tracker.go, text.go: pure Go, no
//     netlink): from services and endpoints seen from this node, the tables,
//     chains, verdict maps and map elements that implement them, and the
//     minimal change between two states, rendered as nft-like text for
//     golden-file tests;
//   - the applier and the sink (Linux only): the first sync writes the whole
//     table in one netlink transaction that atomically replaces any previous
//     table of the same name; later syncs send only the chains and map
//     elements that changed, in one transaction. A rejected transaction
//     changes nothing (netlink batches are atomic) and makes the next sync a
//     full one.
//
// The table layout is documented in docs/backends/nft.md. In short: one
// table of family inet named "kpng-<service-proxy-name>"; NAT base chains
// (prerouting and output, priority dstnat) look the destination
// (address . protocol . port, or protocol . port on a local address for
// node ports) up in verdict maps and go to a chain per service port, which
// DNATs to an endpoint drawn at random from its block of an endpoint map
// (slot . numgen random: an endpoint change only changes map elements);
// with session affinity, it picks an endpoint chain instead, which records
// the client and DNATs. Filter base chains (input,
// forward, output) look the same keys up in maps of the services without
// usable endpoints, to reject (TCP reset or ICMP port unreachable) or drop;
// filter chains before DNAT enforce loadBalancerSourceRanges; a NAT
// postrouting chain masquerades the packets marked for it (hairpin: a
// DNATed packet from an endpoint to itself, found in a set of pairs;
// external traffic with the Cluster policy, cluster-IP traffic from outside
// the cluster CIDRs).
package nft
