// Package benchnode makes the network namespace the side-by-side
// benchmarks (hack/cmd/kpng-sidebyside, kpng-outage, kpng-firstpacket replay) stand a
// node in: its loopback up, a veth pair carrying the node's address and the
// default route, the probed services' endpoint addresses on its loopback,
// and a TCP server on :8080 that accepts and closes, so that a connection
// to a service's cluster IP is DNATed by the node's rules to a local
// endpoint and answered.
package benchnode
