// Package client is the entry point for writing a kpng backend.
//
// The smallest backend is the one from kpng's blog post:
//
//	func main() {
//		client.Run(jsonPrint)
//	}
//
//	func jsonPrint(items []*client.ServiceEndpoints) {
//		enc := json.NewEncoder(os.Stdout)
//		for _, item := range items {
//			_ = enc.Encode(item)
//		}
//	}
//
// Run parses the command line (see Flags), watches the Kubernetes API server
// for the services of one service-proxy-name, and calls the handler with the
// whole state each time it changes. RunSink does the same for an incremental
// localsink.Sink. RunWith adds a program's own flags to that command line
// and builds its sink once it is parsed, keeping Run's signals and exit
// statuses. Programs with a lifecycle of their own use the watcher package
// directly (or Flags.Run with a context of theirs).
//
// The model types are defined in package model (sigs.k8s.io/kpng/model),
// the foundation every other package imports; this package gives short
// names to every type a backend meets, so that a backend written against
// Run or RunSink needs only this import.
package client

import (
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

// ServiceEndpoints is one service with its endpoints (see model.ServiceEndpoints).
type ServiceEndpoints = model.ServiceEndpoints

// Service is a Kubernetes Service as a proxier sees it (see model.Service).
type Service = model.Service

// ServiceKey names a service: the key of Sink.Update (see model.ServiceKey).
type ServiceKey = model.ServiceKey

// ServiceIPs are a service's addresses (see model.ServiceIPs).
type ServiceIPs = model.ServiceIPs

// Endpoint is one endpoint of a service (see model.Endpoint).
type Endpoint = model.Endpoint

// IPSet is a sorted set of addresses split by family (see model.IPSet).
type IPSet = model.IPSet

// PortMapping is one service port (see model.PortMapping).
type PortMapping = model.PortMapping

// ClientIPAffinity is a service's ClientIP session affinity (see
// model.ClientIPAffinity).
type ClientIPAffinity = model.ClientIPAffinity

// Hints are an endpoint's topology hints (see model.Hints).
type Hints = model.Hints

// Problem is an error in one service's field, reported by a sink that
// implements ProblemReporter (see model.Problem).
type Problem = model.Problem

// Protocol is an L4 protocol, numeric in JSON (see model.Protocol).
type Protocol = model.Protocol

// The protocols of service ports.
const (
	TCP  = model.TCP
	UDP  = model.UDP
	SCTP = model.SCTP
)

// Sink is an incremental backend, the argument of RunSink (see
// localsink.Sink): Reset, Update per changed service, then Sync.
type Sink = localsink.Sink

// ProblemReporter is what a Sink implements to report the services it
// could not program (see localsink.ProblemReporter).
type ProblemReporter = localsink.ProblemReporter

// HandlerFunc receives the whole state on each change (see localsink.Handler).
type HandlerFunc = localsink.Handler
