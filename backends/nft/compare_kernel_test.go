//go:build linux

package nft

import (
	"fmt"
	"os"
	"strings"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// compareEnv makes the test binary compare two tables instead of running
// the tests (see compareTables): "FRESH,OTHER", the paths of two network
// namespaces such as /run/netns/x.
const compareEnv = "KPNG_COMPARE_NETNS"

// compareTables compares the tables that two running proxiers left in the
// network namespaces of spec ("FRESH,OTHER"), with the convergence tests'
// reader (readKernelTable: the same table whatever history led to it), and
// returns the exit status: 0 when they are equal, 1 when they differ or
// cannot be read. The soak (hack/cmd/kpng-soak) runs it, from the
// package's compiled test binary with KPNG_COMPARE_NETNS set, on the
// namespace of a kpng that went through an hour of churn and that of a
// kpng freshly started on the same API objects. KPNG_COMPARE_TABLE names
// the table (default: kpng's for the services without a
// service-proxy-name).
func compareTables(spec string) int {
	paths := strings.Split(spec, ",")
	if len(paths) != 2 || paths[0] == "" || paths[1] == "" {
		fmt.Fprintf(os.Stderr, "%s=%q: want FRESH,OTHER\n", compareEnv, spec)
		return 1
	}
	table := os.Getenv("KPNG_COMPARE_TABLE")
	if table == "" {
		table = TableName("")
	}
	var tables [2]*kernelTable
	for i, path := range paths {
		kt, err := readTableIn(path, table)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		tables[i] = kt
		chains, rules, sets, elements := tableCounts(kt)
		fmt.Printf("%s: table %s: %d chains, %d rules, %d sets and maps (but the endpoint maps), %d elements in them, %d endpoint maps\n",
			path, table, chains, rules, sets, elements, len(kt.EndpointMaps))
	}
	if diff := diffKernelTables(tables[0], tables[1]); diff != "" {
		fmt.Fprintf(os.Stderr, "table %s in %s differs from the one in %s (-%s +%s):\n%s", table, paths[1], paths[0], paths[0], paths[1], diff)
		return 1
	}
	if len(tables[1].Unused) > 0 {
		fmt.Fprintf(os.Stderr, "%s: endpoint intervals no rule uses: %v\n", paths[1], tables[1].Unused)
		return 1
	}
	fmt.Println("tables equal")
	return 0
}

// readTableIn reads table back from the network namespace at path.
func readTableIn(path, table string) (*kernelTable, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open the network namespace %s: %w", path, err)
	}
	defer unix.Close(fd)
	conn, err := ConnInNetNS(fd)(nftables.AsLasting())
	if err != nil {
		return nil, fmt.Errorf("%s: read table %s: %w", path, table, err)
	}
	defer conn.CloseLasting()
	kt, err := readKernelTable(conn, table)
	if err != nil {
		return nil, fmt.Errorf("%s: read table %s: %w", path, table, err)
	}
	if kt == nil {
		return nil, fmt.Errorf("%s holds no table %s", path, table)
	}
	return kt, nil
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
