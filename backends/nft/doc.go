// Package nft is kpng's nftables backend: a localsink.Sink that programs
// the services it receives into one nftables table, over netlink
// (github.com/google/nftables), without the nft binary.
//
// Its API is small, of the same shape as the other backends': New(ctx,
// cfg) returns the *Sink (the context's end stops what it runs, its
// logger is the sink's), Cleanup(ctx, cfg) removes a proxier's table,
// Config.BindFlags and Validate give a command its flags, ConnInNetNS
// works in another network namespace, TableName, and Options with its
// defaults (DefaultMasqueradeBit, DefaultCheckPeriod); SyncResult and
// Stats describe each transaction to Config.AfterSync. The rule model is
// unexported.
//
// It plans at Update: each Update goes to the tracker, which works out
// the service's objects and their difference with what the table holds
// at once, so that a Sync only sends a transaction already computed
// (most rounds change few services, and the tracker keeps only the
// difference).
//
// The package has two layers, told apart by their build constraint:
//
//   - the rule model, pure Go with no netlink call, built on every system
//     (vetted on Windows and macOS by make cross): every object name and
//     the table's fixed layout (base chains, hooks, priorities, kinds of
//     maps) in one place; what differs between IPv4 and IPv6, each in a
//     table of its own; the rule kinds of DNAT, filtering, masquerading and
//     affinity; a service seen from this node turned into its chains,
//     maps and elements; the endpoint blocks placed in the shared
//     endpoint maps; the tracker that keeps every service's objects and
//     works out the minimal change between two rounds; the stale UDP
//     flows a change leaves behind; and the text of a ruleset in nft
//     syntax, for golden-file tests (each rule's text is its String, and
//     a kernel test checks that the kernel's own listing of a programmed
//     ruleset reads the same, so the text and the netlink expressions
//     cannot drift);
//   - the kernel side (Linux only, as google/nftables): the Config, each
//     rule's netlink expressions (every rule kind is checked to have
//     them), set elements marshaled by the package itself, the socket the
//     transactions go through, the applier (one transaction per call over
//     both tables: the whole tables, which atomically replace any previous
//     tables of the same name and the inet table of kpng's earlier
//     versions, or only what changed; a rejected transaction changes
//     nothing), the Sink (each Update goes to the tracker, each Sync is
//     one transaction, a failure makes the next Sync a full one), the
//     monitor that rewrites the tables at once when another program
//     changed one (backends/nfmonitor: the kernel's notifications, the
//     sink's own transactions told apart by their socket's port ID), and
//     the periodic check that rewrites them when someone deleted or
//     flushed one or its chains (for what the notifications miss).
//
// The table layout is documented in docs/backends/nft.md. In short: two
// tables named "kpng-<service-proxy-name>", one of family ip for IPv4 and
// one of family ip6 for IPv6 (a table of family inet costs each new
// connection's first packet about 1% more, measured beside kube-proxy's
// ip table), each with the same fixed chains; NAT base chains
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
// DNATed packet from a local endpoint to itself, found in a set of pairs;
// external traffic with the Cluster policy, cluster-IP traffic from outside
// the cluster CIDRs).
package nft
