// Command etcd is etcd's server, built from the Go module proxy for the test
// control plane. It exists only because go.etcd.io/etcd/server/v3 ships the
// etcdmain package but no main package.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
