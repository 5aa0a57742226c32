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
// It plans at Sync: Update only records the services changed, and Sync
// re-plans them all at once, because a service's chains depend on the
// others' (a contended address, the dispatch tree of the SERVICES chains)
// and iptables-restore writes whole chains anyway, so planning once per
// round costs least.
//
// The package has two layers:
//
//   - the plan, pure Go with no command run, built on every system
//     (vetted on Windows and macOS by make cross): config.go (the Config
//     and its flags), names.go (every chain name:
//     the fixed chains and the hashed per-service ones, at most
//     MaxChainName characters), options.go, plan.go (one service seen
//     from this node → its chains and rules in each family and table, as
//     the text of iptables-restore input, and its dispatch entries; it
//     also records which endpoints each UDP service destination reaches,
//     for the conntrack cleanup), state.go (the plan kept from round to
//     round: each service's fragment, re-planned only when it changes or
//     when its share of a contended address changes, and the whole plan
//     assembled from them), hairpin.go (the BPF program of the one
//     hairpin rule), dispatch.go (beyond 32 rules, the SERVICES chains laid
//     out as a tree of chains keyed by destination prefix, so that a
//     packet meets tens of rules rather than one per service) and
//     restore.go (the restore input of a table: the text
//     that is sent is the text the golden tests check);
//   - the kernel side (Linux): sink_linux.go (each Sync re-plans the
//     services changed and writes with one iptables-restore per family
//     and table: every chain in a full sync, only the chains whose rules
//     changed in a partial one,
//     deleting the chains no longer used; a failed restore leaves
//     that table as it was, is returned, and makes the next Sync a full
//     one; with CheckPeriod, a canary chain per table whose loss, when
//     someone flushed the tables, makes the sink rewrite everything),
//     jumps_linux.go (the jumps from the built-in chains, ensured
//     with github.com/coreos/go-iptables, which also detects
//     --random-fully and handles --wait) and variant.go.
//
// The chain layout is drawn in docs/backends/iptables.md.
package iptables
