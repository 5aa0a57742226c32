//go:build linux

package benchnode

import (
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"

	"sigs.k8s.io/kpng/internal/netns"
)

// NodeIP is the node's address, on the veth, with the default route
// through 10.255.0.254.
var NodeIP = netip.MustParseAddr("10.255.0.1")

// Node is a namespace made by Make.
type Node struct {
	// Name is the namespace's name (ip netns), Path its path.
	Name, Path string
	listener   net.Listener
}

// Make makes the namespace name (deleting one of that name first) with
// endpoints on its loopback. Close removes it.
func Make(name string, endpoints []netip.Addr) (*Node, error) {
	_ = exec.Command("ip", "netns", "del", name).Run()
	n := &Node{Name: name, Path: "/run/netns/" + name}
	cmds := [][]string{
		{"ip", "netns", "add", name},
		{"ip", "-n", name, "link", "set", "lo", "up"},
		{"ip", "-n", name, "link", "add", "eth0", "type", "veth", "peer", "name", "eth1"},
		{"ip", "-n", name, "link", "set", "eth0", "up"},
		{"ip", "-n", name, "link", "set", "eth1", "up"},
		{"ip", "-n", name, "addr", "add", NodeIP.String() + "/24", "dev", "eth0"},
		{"ip", "-n", name, "route", "add", "default", "via", "10.255.0.254", "dev", "eth0"},
	}
	for _, ep := range endpoints {
		cmds = append(cmds, []string{"ip", "-n", name, "addr", "add", ep.String() + "/32", "dev", "lo"})
	}
	for _, c := range cmds {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			n.Close()
			return nil, fmt.Errorf("%s: %w: %s", strings.Join(c, " "), err, strings.TrimSpace(string(out)))
		}
	}
	var err error
	if n.listener, err = netns.RunIn(n.Path, func() (net.Listener, error) { return net.Listen("tcp", "0.0.0.0:8080") }); err != nil {
		n.Close()
		return nil, err
	}
	go func() {
		for {
			conn, err := n.listener.Accept()
			if err != nil {
				return
			}
			conn.Close()
		}
	}()
	return n, nil
}

// Close stops the server and removes the namespace.
func (n *Node) Close() {
	if n.listener != nil {
		n.listener.Close()
	}
	_ = exec.Command("ip", "netns", "del", n.Name).Run()
}
