package nodeflags

import (
	"flag"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestBind(t *testing.T) {
	var (
		cidrs, npa []netip.Prefix
		ips        []netip.Addr
		all        bool
		bit        = 14
	)
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	Node{ClusterCIDRs: &cidrs, NodePortAddresses: &npa, NodeIPs: &ips, MasqueradeAll: &all, MasqueradeBit: &bit}.Bind(fs)
	err := fs.Parse([]string{"--cluster-cidr=10.0.0.0/8, fd00::/64", "--nodeport-addresses=192.168.0.0/16",
		"--node-ip=10.1.2.3,::ffff:10.1.2.4,fd00::1", "--masquerade-all", "--masquerade-bit=3"})
	if err != nil {
		t.Fatal(err)
	}
	want := []any{
		[]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/64")},
		[]netip.Prefix{netip.MustParsePrefix("192.168.0.0/16")},
		[]netip.Addr{netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("10.1.2.4"), netip.MustParseAddr("fd00::1")},
		true, 3,
	}
	if diff := cmp.Diff(want, []any{cidrs, npa, ips, all, bit}, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b }), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("parsed (-want +got):\n%s", diff)
	}
}

func TestBindOnlyGiven(t *testing.T) {
	var ips []netip.Addr
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	Node{NodeIPs: &ips, Usage: map[string]string{NodeIP: "custom help"}}.Bind(fs)
	if fs.Lookup(ClusterCIDR) != nil || fs.Lookup(MasqueradeBit) != nil {
		t.Error("flags bound for nil fields")
	}
	if f := fs.Lookup(NodeIP); f == nil || f.Usage != "custom help" {
		t.Errorf("--node-ip: %+v, want the custom help", f)
	}
}

func TestBadValues(t *testing.T) {
	for _, arg := range []string{"--cluster-cidr=10.0.0.1/8", "--cluster-cidr=nope", "--node-ip=10.0.0.300", "--node-ip=fe80::1%eth0", "--masquerade-bit=x", "--masquerade-bit=0", "--masquerade-bit=32"} {
		var cidrs []netip.Prefix
		var ips []netip.Addr
		bit := 14
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		Node{ClusterCIDRs: &cidrs, NodeIPs: &ips, MasqueradeBit: &bit}.Bind(fs)
		name, _, _ := strings.Cut(arg, "=")
		if err := fs.Parse([]string{arg}); err == nil || !strings.Contains(err.Error(), strings.TrimPrefix(name, "-")) {
			t.Errorf("%s: %v, want an error naming the flag", arg, err)
		}
	}
}

func TestCheckOptions(t *testing.T) {
	good := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/64")}
	ips := []netip.Addr{netip.MustParseAddr("10.0.0.2")}
	if err := CheckOptions(good, good, ips, 0); err != nil {
		t.Errorf("good options: %v", err)
	}
	for _, tc := range []struct {
		name        string
		cidrs, npas []netip.Prefix
		ips         []netip.Addr
		bit         int
		want        string
	}{
		{"bit", nil, nil, nil, 32, "MasqueradeBit 32"},
		{"negative bit", nil, nil, nil, -1, "MasqueradeBit -1"},
		{"host bits", []netip.Prefix{netip.PrefixFrom(netip.MustParseAddr("10.0.0.1"), 8)}, nil, nil, 0, "ClusterCIDRs"},
		{"mapped", nil, []netip.Prefix{netip.MustParsePrefix("::ffff:10.0.0.0/104")}, nil, 0, "NodePortAddresses"},
		{"invalid prefix", nil, []netip.Prefix{{}}, nil, 0, "NodePortAddresses"},
		{"zone", nil, nil, []netip.Addr{netip.MustParseAddr("fe80::1%eth0")}, 0, "NodeIPs"},
	} {
		err := CheckOptions(tc.cidrs, tc.npas, tc.ips, tc.bit)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %s", tc.name, err, tc.want)
		}
	}
}

func TestMasqueradeBitDefault(t *testing.T) {
	bit := 14
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	Node{MasqueradeBit: &bit}.Bind(fs)
	if f := fs.Lookup(MasqueradeBit); f.DefValue != "14" {
		t.Errorf("--masquerade-bit default %q, want 14", f.DefValue)
	}
}

// TestBindDefaultsTheBit: a zero MasqueradeBit becomes the default at
// Bind (the flag's default and the value kept when the flag is not
// given); a bit already set is kept.
func TestBindDefaultsTheBit(t *testing.T) {
	for _, tc := range []struct{ start, want int }{{0, DefaultMasqueradeBit}, {3, 3}} {
		bit := tc.start
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		Node{MasqueradeBit: &bit}.Bind(fs)
		if err := fs.Parse(nil); err != nil {
			t.Fatal(err)
		}
		if bit != tc.want || fs.Lookup(MasqueradeBit).DefValue != strconv.Itoa(tc.want) {
			t.Errorf("start %d: bit %d, flag default %s; want %d", tc.start, bit, fs.Lookup(MasqueradeBit).DefValue, tc.want)
		}
	}
}
