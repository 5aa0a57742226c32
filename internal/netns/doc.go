// Package netns builds throw-away network topologies for tests that need
// real traffic: named network namespaces (`ip netns`), veth pairs between
// them, addresses, routes and sysctls, and small TCP and UDP servers that
// answer with their identity.
//
// Everything is created through the iproute2 `ip` command and removed by
// t.Cleanup, also when the test fails. The tests using this package must run
// as root; call RequirePrivileged first: it skips the test otherwise, or
// fails it when KPNG_REQUIRE_PRIVILEGED=1 (as CI sets it).
//
// Namespaces are named <prefix><pid>-<n>-<label> (prefix kpngt- unless the
// caller gives its own: NewWithPrefix, BlogWithPrefix), so that tests
// running in parallel, in one process or several, never collide, and so that
// the namespaces left behind by a test process that was killed can be
// recognised and removed: each process removes, for each prefix it uses, the
// namespaces of that prefix whose creating process is gone, and never those
// of another prefix (see NewWithPrefix).
//
// Links are created directly inside their namespaces (`ip -n NS link add ...
// netns PEER`), so that nothing, not even temporarily, is added to the
// namespace the tests run in, and interface names need only be unique within
// one test namespace.
//
// NS.Exec runs a command inside a namespace (`ip netns exec`); NS.Do runs a
// Go function on a thread switched into it (sockets created there stay in
// the namespace). NS.Serve starts TCP and UDP servers in a namespace that
// answer every request with their identity and the addresses they saw, and
// NS.Ask sends a request from a namespace and returns that Answer, so a test
// can tell which server, reached on which address, answered.
//
// Blog builds the topology of kpng's blog post: a client, a node where a
// proxier installs its rules, and two pods on that node. A typical test:
//
//	func TestMyProxier(t *testing.T) {
//		netns.RequirePrivileged(t)
//		b := netns.Blog(t)
//		if _, _, err := b.Node.Exec(state, "bash", "my-proxier"); err != nil {
//			t.Fatal(err) // the proxier's rules go in the node
//		}
//		b.ExpectService(t, b.Client, netns.PodID)
//		b.ExpectNoService(t, b.Client, time.Second) // after an empty state
//	}
//
// The package is Linux only.
package netns
