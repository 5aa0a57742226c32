// Package model holds the data kpng hands to a backend: services with their
// addresses, ports and policies, and their endpoints with the conditions and
// node-specific facts (Local, topology hints) already worked out.
//
// The JSON encoding of these types is a public contract: the field names and
// nesting of ServiceEndpoints, Service, ServiceIPs, IPSet, PortMapping and
// Endpoint are what kpng-json prints and what users' jq scripts read.
// Fields may be added (always with omitempty or omitzero), never renamed.
// Service.LoadBalancerSourceRanges are parsed netip.Prefix values, whose
// JSON form is the same strings ("198.51.100.0/24"); go-cmp compares them
// with cmpopts.EquateComparable(netip.Prefix{}).
//
// Values handed to a backend are never modified afterwards by kpng; treat them
// as read-only: to change one, build a new value (a shallow copy of the
// struct with new slices or maps where they differ), as
// Node.ViewService does.
package model
