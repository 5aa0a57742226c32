//go:build linux

package nft

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/mdlayher/netlink"
	vnetlink "github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"sigs.k8s.io/kpng/backends/conformance"
	"sigs.k8s.io/kpng/internal/netns"
	"sigs.k8s.io/kpng/localsink"
)

// TestKernelListingReloads programs the ruleset of each golden case
// (together they hold every rule, set and map kind in both families:
// checkCoverage) into a namespace, lists it with `nft list table`, loads
// that listing with `nft -f` into a fresh namespace and lists it again.
// Loading must succeed (a node saving and restoring its ruleset, `nft
// list ruleset > file` then `nft -f file`, must not fail on kpng's table),
// the second listing must read as the first, and each set must hold the
// same user data: the typeof declarations kpng writes for the maps keyed
// by a random number (typeof.go) are byte for byte those nft writes when
// it reads them. TestConformanceReloaded sends traffic through reloaded
// rules.
func TestKernelListingReloads(t *testing.T) {
	netns.RequirePrivileged(t)
	netns.RequireCommands(t, "nft")
	checkCoverage(t)
	src := netns.New(t, "listed")
	cases := goldenCases()
	for _, name := range slices.Sorted(maps.Keys(cases)) {
		t.Run(name, func(t *testing.T) {
			rs, _ := buildRuleset("kpng-"+name, goldenOptions[name], cases[name])
			a := newApplier(connIn(t, src), rs.Table)
			defer a.Close()
			if _, err := a.Full(rs); err != nil {
				t.Fatalf("program table %s: %v", rs.Table, err)
			}
			listing := nftList(t, src, rs.Table)
			dst := netns.New(t, "reloaded")
			if _, stderr, err := dst.Exec([]byte(listing), "nft", "-f", "-"); err != nil {
				t.Fatalf("nft -f of the listing: %v\n%s\nlisting:\n%s", err, stderr, listing)
			}
			again := nftList(t, dst, rs.Table)
			want, err := parseListing(listing)
			if err != nil {
				t.Fatalf("listing: %v\n%s", err, listing)
			}
			got, err := parseListing(again)
			if err != nil {
				t.Fatalf("listing of the reloaded table: %v\n%s", err, again)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("table %s: the reloaded table lists otherwise (-programmed +reloaded):\n%s", rs.Table, diff)
			}
			// The sets kpng declares with typeof; nft writes user data of
			// its own for the others (the types of the kernel are enough
			// for them, whatever the user data says).
			kpng, nft := kernelSetUserData(t, src, rs.Table), kernelSetUserData(t, dst, rs.Table)
			for _, s := range rs.Sets {
				if s.userData() == nil {
					continue
				}
				if kpng[s.Name] == "" || kpng[s.Name] != nft[s.Name] {
					t.Errorf("table %s, map %s: user data\nkpng %s\nnft  %s", rs.Table, s.Name, kpng[s.Name], nft[s.Name])
				}
			}
		})
	}
}

// kernelSetUserData returns the user data of each set of the tables named
// table (of any family) in the namespace ns, by name (as hex), read with a
// netlink dump of the sets (google/nftables does not read a set's user
// data).
func kernelSetUserData(t *testing.T, ns *netns.NS, table string) map[string]string {
	t.Helper()
	f, err := os.Open(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: int(f.Fd())})
	if err != nil {
		t.Fatalf("netlink socket in %s: %v", ns, err)
	}
	defer c.Close()
	req := netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETSET), Flags: netlink.Request | netlink.Dump},
		Data:   []byte{unix.NFPROTO_UNSPEC, unix.NFNETLINK_V0, 0, 0},
	}
	msgs, err := c.Execute(req)
	if err != nil {
		t.Fatalf("dump the sets of %s: %v", ns, err)
	}
	out := map[string]string{}
	for _, m := range msgs {
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			t.Fatal(err)
		}
		var tbl, name, ud string
		for ad.Next() {
			switch ad.Type() {
			case unix.NFTA_SET_TABLE:
				tbl = ad.String()
			case unix.NFTA_SET_NAME:
				name = ad.String()
			case unix.NFTA_SET_USERDATA:
				ud = fmt.Sprintf("% x", ad.Bytes())
			}
		}
		if err := ad.Err(); err != nil {
			t.Fatal(err)
		}
		if tbl == table {
			out[name] = ud
		}
	}
	if len(out) == 0 {
		t.Fatalf("no set in table %s of %s", table, ns)
	}
	return out
}

// TestConformanceReloaded runs the whole conformance kit (real TCP and
// UDP traffic, both families, every scenario) against rules that nft
// loaded from a listing of kpng's table, never against what kpng sent:
// the sink programs a scratch namespace, and after each of its Syncs the
// table is listed there with `nft list table` and that listing loaded
// with `nft -f` into the kit's node namespace, replacing the table of the
// previous Sync in one transaction. A listing that loads but means
// something else (a key, an offset, a type, a verdict read otherwise)
// fails the scenario whose traffic it carries.
func TestConformanceReloaded(t *testing.T) {
	netns.RequireCommands(t, "nft", "ip")
	conformance.Run(t, conformance.Backend{Name: "nft, reloaded with nft -f", Start: startReloaded})
}

// startReloaded builds the nft sink of a scratch namespace, whose table
// reloadingSink copies into the kit's node namespace through nft.
func startReloaded(t testing.TB, node conformance.Node) (localsink.Sink, error) {
	scratch := netns.New(t, "scratch")
	f, err := os.Open(node.NetNS)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { f.Close() })
	nodeFD := int(f.Fd())
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	cfg := Config{
		ServiceProxyName: "conformance",
		Conn:             connIn(t, scratch),
		// The flows are the node's.
		Conntrack: func() (*vnetlink.Handle, error) {
			return vnetlink.NewHandleAt(vnetns.NsHandle(nodeFD), unix.NETLINK_NETFILTER)
		},
		Options: Options{NodeIPs: node.IPs, ClusterCIDRs: node.PodCIDRs},
	}
	sink, err := New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	var inner fullSink = sink
	table := TableName(cfg.ServiceProxyName)
	t.Cleanup(func() {
		_ = Cleanup(context.Background(), Config{ServiceProxyName: cfg.ServiceProxyName, Conn: ConnInNetNS(nodeFD)})
	})
	return &reloadingSink{fullSink: inner, scratch: scratch, node: filepath.Base(node.NetNS), table: table}, nil
}

// fullSink is what the nft sink implements: the kit gives it the
// cluster's facts and asks for its problems.
type fullSink interface {
	localsink.ClusterSink
	localsink.ProblemReporter
}

// reloadingSink is a sink whose Syncs end by copying its table, through a
// listing and nft -f, from the scratch namespace it programs to the node
// namespace (named node under /run/netns).
type reloadingSink struct {
	fullSink
	scratch *netns.NS
	node    string
	table   string
}

// Sync implements localsink.Sink.
func (s *reloadingSink) Sync() error {
	if err := s.fullSink.Sync(); err != nil {
		return err
	}
	// One transaction: each table created if missing, deleted, loaded.
	var script strings.Builder
	var listing string
	for _, family := range []string{"ip", "ip6"} {
		out, _, err := s.scratch.Exec(nil, "nft", "list", "table", family, s.table)
		if err != nil {
			return fmt.Errorf("list the table %s %s: %w", family, s.table, err)
		}
		fmt.Fprintf(&script, "table %s %s\ndelete table %s %s\n", family, s.table, family, s.table)
		listing += out
	}
	script.WriteString(listing)
	cmd := exec.Command("ip", "netns", "exec", s.node, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script.String())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("nft -f of the listing into %s: %w: %s\nlisting:\n%s", s.node, err, stderr.String(), listing)
	}
	return nil
}
