package model

import (
	"errors"
	"fmt"
)

// Reason is the kind of a Problem: what an operator must fix.
type Reason string

// The reasons of problems.
const (
	// ReasonAddressConflict: an address and port another service (or
	// another port of the same service) already uses; the first service
	// in key order keeps it.
	ReasonAddressConflict Reason = "AddressConflict"
	// ReasonBadField: a value that is malformed or out of range (an
	// address of the wrong family, a port outside 1–65535, a protocol and
	// port listed twice).
	ReasonBadField Reason = "BadField"
	// ReasonUnsupportedProtocol: a protocol the backend does not proxy.
	ReasonUnsupportedProtocol Reason = "UnsupportedProtocol"
	// ReasonOther: a problem a backend reported as a plain error.
	ReasonOther Reason = "Other"
)

// Problem is a part of a service that a backend cannot program: it leaves
// that part out and programs the rest. Backends report the problems of
// what they hold (localsink.ProblemReporter); kpng logs each one once,
// when it appears, counts them by Reason and lists them on its debug
// endpoint. A Problem is an error whose text is Message.
//
// Problems are comparable: the same problem found again in a later round
// is equal to the first one.
type Problem struct {
	// Service is the service concerned.
	Service ServiceKey
	// Field names the part of the service: a field path of the Service
	// ("spec.ports[1].protocol", "spec.externalIPs"), or of its
	// EndpointSlices ("endpoints[].addresses").
	Field string
	// Reason is the kind of problem.
	Reason Reason
	// Message says it all in one sentence, naming the service and the
	// field.
	Message string
}

// NewProblem returns the Problem of service key's field, its message
// formatted from format and args.
func NewProblem(key ServiceKey, field string, reason Reason, format string, args ...any) *Problem {
	return &Problem{Service: key, Field: field, Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// Error implements error: the Message.
func (p *Problem) Error() string { return p.Message }

// ProblemOf returns err as a Problem: the Problem it wraps, or else one of
// service key with ReasonOther and err's text.
func ProblemOf(key ServiceKey, err error) Problem {
	if p, ok := errors.AsType[*Problem](err); ok {
		return *p
	}
	return Problem{Service: key, Reason: ReasonOther, Message: err.Error()}
}

// AddressFieldPath returns the API path of the field of s that a backend
// names field in its messages ("clusterIPs", "externalIPs",
// "loadBalancer ingress IPs", "nodePort" of port), for a Problem's
// Field; any other field is returned as it is.
func (s *Service) AddressFieldPath(field string, port *PortMapping) string {
	switch field {
	case "clusterIPs":
		return "spec.clusterIPs"
	case "externalIPs":
		return "spec.externalIPs"
	case "loadBalancer ingress IPs":
		return "status.loadBalancer.ingress"
	case "nodePort":
		for i, p := range s.Ports {
			if p == port {
				return fmt.Sprintf("spec.ports[%d].nodePort", i)
			}
		}
		return "spec.ports[].nodePort"
	}
	return field
}
