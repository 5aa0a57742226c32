// Package iptables is kpng's iptables backend: a localsink.Sink that
// programs the services it receives into iptables (IPv4) and ip6tables
// (IPv6) chains of its own, through iptables-restore --noflush, with the
// behaviour of the nft backend (and of kube-proxy's iptables mode).
//
// Its API, of the same shape as the other backends': New(ctx, cfg)
// returns the *Sink (the context bounds the commands it runs and its end
// stops the periodic check; its logger is the sink's), with a Config (its
// Options, the network namespace, the variant: legacy, nft or auto;
// Config.BindFlags and Validate give a command its flags), Cleanup(ctx,
// cfg) to remove a proxier's chains, ChainPrefix, DetectVariant, and the
// Runner seam through which every iptables-save and iptables-restore runs
// (ExecRunner by default). SyncResult describes each sync to
// Config.AfterSync.
//
// ForwardAccept (NewForwardAccept, ForwardAcceptConfig,
// ForwardAcceptChain) serves another backend: on a node whose filter
// FORWARD policy is DROP, it keeps a chain accepting what that proxier
// marked for masquerading and the replies, jumped to from FORWARD, which
// the nft backend cannot do from its own nftables table (`kpng … to-nft
// --forward-accept`).
//
// It plans at Sync: Update only records the services changed, and Sync
// re-plans them all at once, because a service's chains depend on the
// others' (a contended address, the dispatch tree of the SERVICES chains)
// and iptables-restore writes whole chains anyway, so planning once per
// round costs least.
//
// The package has two layers, told apart by their build constraint:
//
//   - the plan, pure Go with no command run, built on every system
//     (vetted on Windows and macOS by make cross): the Config and its
//     flags; every chain name (the fixed chains and the hashed
//     per-service ones, at most MaxChainName characters); one service
//     seen from this node turned into its chains and rules in each family
//     and table, as the text of iptables-restore input, with its dispatch
//     entries and the endpoints each UDP destination reaches (for the
//     conntrack cleanup); the plan kept from round to round (each
//     service's fragment, re-planned only when it or its share of a
//     contended address changes); the BPF program of the one hairpin
//     rule; beyond 32 rules, the SERVICES chains laid out as a tree of
//     chains keyed by destination prefix, so that a packet meets tens of
//     rules rather than one per service; and the restore input of a table
//     (the text that is sent is the text the golden tests check);
//   - the kernel side (Linux): the Sink (each Sync re-plans the services
//     changed and writes with one iptables-restore per family and table:
//     every chain in a full sync, only the chains whose rules changed in
//     a partial one, deleting the chains no longer used; a failed restore
//     leaves that table as it was, is returned, and makes the next Sync a
//     full one; with CheckPeriod, a canary chain per table whose loss,
//     when someone flushed the tables, or a jump from a built-in chain
//     gone, makes the sink rewrite everything; with iptables-nft, the
//     monitor of backends/nfmonitor does it at once, from the kernel's
//     notifications of other programs' changes), the jumps from the
//     built-in chains (ensured with
//     github.com/coreos/go-iptables, which also detects --random-fully and
//     handles --wait) and the variant's detection.
//
// The chain layout is drawn in docs/backends/iptables.md.
package iptables
