// Package localsink is the interface between kpng and a backend in the same
// process: a Sink receives the state of the selected services one changed
// service at a time, in rounds, and reports whether it applied each round.
// The package also holds what sits on either side of that interface: the
// Feeder that every kpng source uses to deliver rounds (it sends only what
// changed and retries the rounds a sink failed to apply), the adapters
// between a Sink and the full-state style (a callback receiving every
// service), Tee, and EndpointChanges for backends that want per-endpoint
// differences.
//
// # The contract
//
// Every kpng source (the Kubernetes watcher, the remote client, the file
// input, the adapters of this package) keeps these rules, and
// localsink/sinktest checks them:
//
//   - Calls come one at a time, never concurrently: a Sink needs no locking
//     of its own against kpng (it may be called from more than one
//     goroutine over its life, when a retry fires).
//   - A round is an optional Reset, then Update calls, then Sync. Between
//     two Syncs the state may be half-updated; it is meant to be applied on
//     Sync.
//   - Nothing is delivered before the source has its first complete state.
//     The first round starts with Reset and carries that whole state
//     (possibly empty: the first Sync always comes).
//   - Reset means "forget everything": the Updates of the round describe
//     the whole state from nothing, every one with a nil prev.
//   - Update is called once per changed service in a round, in key order
//     (namespace, then name). prev is the cur of the previous Update for
//     that service (nil when there was none, or after Reset); cur is the
//     new value, nil when the service is gone. prev and cur are never both
//     nil and never the same pointer: an unchanged service is not
//     delivered, and a round that changes nothing is not delivered at all,
//     but for the first round, a round after Reset, and a retry.
//   - cur's endpoints are sorted by address and unique (model.CompareEndpoints).
//   - Values are never modified after delivery: a sink may keep them. What
//     did not change is pointer-equal: cur.Service == prev.Service when the
//     service itself did not change, and an unchanged endpoint is the same
//     pointer in prev and cur. A backend can skip work by comparing pointers.
//   - Sync returns nil when the data plane matches what the sink was given.
//     An error means it does not (yet): the sink keeps the Updates it
//     received, and the source calls Sync again, with the newer changes
//     when there are some (the failed round merged with them) or alone,
//     after a backoff or with its next round, whichever comes first. A sink
//     that lost track of what it holds returns an error wrapping ErrResync:
//     it then gets Reset and the whole state.
//
// # Cluster-level facts
//
// Facts about the cluster that belong to no service (model.Cluster: the
// service CIDRs, for the cluster's default proxier) reach the sinks that
// also implement ClusterSink. The rules for SetCluster:
//
//   - It comes within a round, after the round's Reset if any and before
//     its Updates, at most once per round.
//   - It gives the facts when they differ from those last given (nil:
//     none). Reset forgets them too: after a Reset, SetCluster comes
//     when there are facts. A round may hold only SetCluster and Sync.
//   - The value is never modified after delivery.
//
// A sink that does not implement ClusterSink gets the same rounds without
// the facts (and no round for a change of the facts alone).
package localsink

import (
	"errors"
	"time"

	"sigs.k8s.io/kpng/model"
)

// Sink receives the state of the selected services in rounds (see the
// package documentation for the contract every source keeps).
type Sink interface {
	// Reset drops the whole state: the Updates up to the next Sync
	// describe it from nothing.
	Reset()
	// Update says that service key changed from prev to cur (prev nil:
	// created; cur nil: deleted).
	Update(key model.ServiceKey, prev, cur *model.ServiceEndpoints)
	// Sync ends the round: the sink applies it and says whether it could.
	Sync() error
}

// ClusterSink is a Sink that also receives the cluster-level facts (see
// the package documentation for when SetCluster comes).
type ClusterSink interface {
	Sink
	// SetCluster gives the facts of the cluster as of this round (nil:
	// none).
	SetCluster(c *model.Cluster)
}

// ErrResync, wrapped in the error of a failed Sync, asks the source for a
// Reset and the whole state in the next round, instead of the failed
// round's services again: for a sink that cannot return to the state it
// held before the round.
var ErrResync = errors.New("needs the whole state again")

// ProblemReporter is a Sink that says which parts of the state it holds
// it could not program (a bad field, an address another service has, a
// protocol it does not proxy). Implementing it is optional: the Feeder
// asks after each Sync, logs each problem once when it appears, and puts
// them in the round's record (Round.Problems), from which kpng's metrics
// count them by reason and its debug endpoint lists them.
type ProblemReporter interface {
	// Problems returns the problems of the state the sink holds, as of
	// its last Sync, in a slice the caller may keep (the sink does not
	// modify it afterwards). It is called like the Sink's methods: one
	// call at a time, never concurrently with them.
	Problems() []model.Problem
}

// TriggerSink is a Sink that passes trigger times on: the times the
// changes it receives were triggered in the cluster (see
// Feeder.Triggered), such as the gRPC stream of a kpng controller, whose
// remote backends measure their network programming latency from them.
// Implementing it is optional: the Feeder calls Triggered after the Update
// of a service whose change has trigger times, in the same round.
type TriggerSink interface {
	Triggered(key model.ServiceKey, times []time.Time)
}
