// Package conformance is a kit of behaviour scenarios that any kpng backend
// can run against itself: what a Kubernetes service proxier must do, shown
// with real TCP and UDP traffic, IPv4 and IPv6, in network namespaces.
//
// A backend plugs in with a Backend: a function that builds it for a node
// network namespace and returns its localsink.Sink, and the features it
// declares unsupported. Run builds, for each scenario, the topology of
// kpng's blog (a client, a node, two pods), starts the backend for the
// node, feeds it states through a localsink.Feeder as kpng does (checking
// the Sink contract on the way) and checks the traffic. A scenario needing
// a feature the backend declares unsupported is skipped (t.Skip) with the
// backend's reason, never reported as passed. A failed check is reported
// once, with what it checked and the state the backend was given; checks
// of random choices send enough requests that chance decides none of them
// (below one in a million). Backend.NetNSPrefix names the kit's network
// namespaces.
//
// The kit needs root (network namespaces); without, Run skips, or fails
// when KPNG_REQUIRE_PRIVILEGED=1. It is Linux only. docs/conformance.md
// lists the scenarios and shows how to run the kit on an outside backend.
package conformance
