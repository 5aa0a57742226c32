//go:build linux

package nft

import (
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"sigs.k8s.io/kpng/internal/netns"
)

// compareEnv names the two network namespaces TestKernelTablesEqual
// compares: "FRESH,OTHER", paths such as /run/netns/x.
const compareEnv = "KPNG_COMPARE_NETNS"

// TestKernelTablesEqual compares the tables that two running proxiers
// left in two network namespaces, with the convergence tests' reader
// (readKernelTable: the same table whatever history led to it): the soak
// (internal/cmd/kpng-soak) runs it, from the package's compiled test
// binary, on the namespace of a kpng that went through an hour of churn
// and that of a kpng freshly started on the same API objects. It skips
// unless KPNG_COMPARE_NETNS=FRESH,OTHER is set; KPNG_COMPARE_TABLE names
// the table (default: kpng's for the services without a
// service-proxy-name).
func TestKernelTablesEqual(t *testing.T) {
	paths := strings.Split(os.Getenv(compareEnv), ",")
	if len(paths) != 2 || paths[0] == "" || paths[1] == "" {
		t.Skipf("%s=FRESH,OTHER is not set: nothing to compare", compareEnv)
	}
	netns.RequirePrivileged(t)
	table := os.Getenv("KPNG_COMPARE_TABLE")
	if table == "" {
		table = TableName("")
	}
	var tables [2]*kernelTable
	for i, path := range paths {
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatalf("open the network namespace %s: %v", path, err)
		}
		tables[i] = mustReadKernelTable(t, ConnInNetNS(fd), table)
		unix.Close(fd)
		if tables[i] == nil {
			t.Fatalf("%s holds no table %s", path, table)
		}
		chains, rules, sets, elements := tableCounts(tables[i])
		t.Logf("%s: table %s: %d chains, %d rules, %d sets and maps (but the endpoint maps), %d elements in them, %d endpoint maps",
			path, table, chains, rules, sets, elements, len(tables[i].EndpointMaps))
	}
	if diff := diffKernelTables(tables[0], tables[1]); diff != "" {
		t.Fatalf("table %s in %s differs from the one in %s (-%s +%s):\n%s", table, paths[1], paths[0], paths[0], paths[1], diff)
	}
	if len(tables[1].Unused) > 0 {
		t.Errorf("%s: endpoint intervals no rule uses: %v", paths[1], tables[1].Unused)
	}
}

// tableCounts counts what a table read back holds: chains, rules, sets
// and maps (the endpoint maps aside) and their elements.
func tableCounts(kt *kernelTable) (chains, rules, sets, elements int) {
	for _, c := range kt.Chains {
		chains++
		rules += len(c) - 1
	}
	for _, s := range kt.Sets {
		sets++
		elements += len(s) - 1
	}
	return chains, rules, sets, elements
}
