package kpngv1_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"sigs.k8s.io/kpng/api/kpngv1"
)

// TestPeerIPs: a list of controller replicas is taken sorted, without
// duplicates, IPv4-mapped addresses as IPv4; a list with anything but IP
// addresses (a name, an address with a zone), or longer than MaxPeers, is
// refused whole, the bad value quoted and cut in the error.
func TestPeerIPs(t *testing.T) {
	got, err := kpngv1.PeerIPs([]string{"10.0.0.2", "::ffff:10.0.0.1", "fd00::1", "10.0.0.2"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"10.0.0.1", "10.0.0.2", "fd00::1"}, got); diff != "" {
		t.Errorf("PeerIPs (-want +got):\n%s", diff)
	}
	long := strings.Repeat("x", 1000)
	var many []string
	for i := range kpngv1.MaxPeers + 1 {
		many = append(many, fmt.Sprintf("10.1.%d.%d", i/256, i%256))
	}
	for _, c := range []struct {
		ips  []string
		want string
	}{
		{[]string{"10.0.0.1", "kpng-controller"}, `replica address "kpng-controller" is not an IP address`},
		{[]string{"fe80::1%eth0"}, `replica address "fe80::1%eth0" is not an IP address`},
		{[]string{long}, `(1000 bytes) is not an IP address`},
		{many, fmt.Sprintf("%d replica addresses, more than %d", kpngv1.MaxPeers+1, kpngv1.MaxPeers)},
	} {
		if _, err := kpngv1.PeerIPs(c.ips); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("kpngv1.PeerIPs(%.40q): %v, want an error with %q", c.ips, err, c.want)
		}
	}
}
