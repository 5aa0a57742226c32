// Package localsink defines Sink, the incremental interface through which kpng
// hands state changes to a backend, and adapters between it and the
// full-state style (a callback receiving every service on each change).
package localsink

import "sigs.k8s.io/kpng/client/model"

// Sink receives the state of the selected services as a stream of changes.
//
// Ordering guarantees, which every kpng source (the watcher, the adapters in
// this package, remote streams) keeps:
//
//   - Calls come from one goroutine at a time; a Sink needs no locking of
//     its own against kpng.
//   - The first call is Reset. Reset may come again later; it means "forget
//     everything": the calls that follow, up to the next Sync, describe the
//     whole state from nothing.
//   - Between two Syncs, the calls describe one consistent change. The state
//     is only meant to be applied (rules programmed, traffic switched) on
//     Sync; in between, it may be half-updated.
//   - SetService for a service comes before any SetEndpoint for it, in the
//     round where the service first appears.
//   - When a service goes away, DeleteEndpoint is called for each of its
//     endpoints before DeleteService.
//   - Within a round, calls are grouped by service, services in key order;
//     for one service, endpoint deletions come before endpoint sets.
//   - Set* is only called when the value differs from the one last set for
//     that key; values passed in are never modified afterwards.
type Sink interface {
	// Reset drops the whole state.
	Reset()
	// SetService creates or replaces a service.
	SetService(svc *model.Service)
	// DeleteService removes a service; its endpoints were deleted first.
	DeleteService(svc model.ServiceKey)
	// SetEndpoint creates or replaces the endpoint key of service svc.
	SetEndpoint(svc model.ServiceKey, key string, ep *model.Endpoint)
	// DeleteEndpoint removes the endpoint key of service svc.
	DeleteEndpoint(svc model.ServiceKey, key string)
	// Sync marks the end of a consistent change.
	Sync()
}
