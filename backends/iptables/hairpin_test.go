package iptables

import (
	"net/netip"
	"testing"

	"golang.org/x/net/bpf"
)

// header returns a minimal IP header of family f from src to dst (the
// fields the program reads; the rest zero).
func header(f family, src, dst string) []byte {
	s, d := netip.MustParseAddr(src), netip.MustParseAddr(dst)
	if f == ipv4 {
		h := make([]byte, 20)
		h[0] = 0x45
		copy(h[12:16], s.AsSlice())
		copy(h[16:20], d.AsSlice())
		return h
	}
	h := make([]byte, 40)
	h[0] = 0x60
	copy(h[8:24], s.AsSlice())
	copy(h[24:40], d.AsSlice())
	return h
}

// TestSameAddrsProgram runs the hairpin program in x/net/bpf's VM: 1 for
// a packet to its own source, 0 otherwise, whichever word of an IPv6
// address differs.
func TestSameAddrsProgram(t *testing.T) {
	cases := []struct {
		f        family
		src, dst string
		want     int
	}{
		{ipv4, "10.1.0.2", "10.1.0.2", 1},
		{ipv4, "10.1.0.2", "10.1.0.3", 0},
		{ipv4, "11.1.0.2", "10.1.0.2", 0},
		{ipv6, "fd00:1::2", "fd00:1::2", 1},
		{ipv6, "fd00:1::2", "fd00:1::3", 0},
		{ipv6, "fd00:1::2", "fd01:1::2", 0},
		{ipv6, "fd00:1:0:0:1::2", "fd00:1::2", 0},
		{ipv6, "fd00:1:0:1::2", "fd00:1::2", 0},
	}
	for _, tc := range cases {
		vm, err := bpf.NewVM(sameAddrsProgram(tc.f))
		if err != nil {
			t.Fatal(err)
		}
		got, err := vm.Run(header(tc.f, tc.src, tc.dst))
		if err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("%s %s → %s: %d, want %d", tc.f, tc.src, tc.dst, got, tc.want)
		}
	}
	if got, want := sameAddrsBPF(ipv4), "6,32 0 0 12,7 0 0 0,32 0 0 16,29 0 1 0,6 0 0 1,6 0 0 0"; got != want {
		t.Errorf("IPv4 bytecode %q, want %q", got, want)
	}
}
