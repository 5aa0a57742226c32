//go:build windows

package userspace

import (
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"

	"k8s.io/klog/v2"
)

// windowsPlatform holds the service addresses on an existing interface
// (a loopback adapter, say) with netsh, marked skipassource so that
// Windows never picks them as the source of other traffic, and
// store=active so that they do not outlive a reboot.
type windowsPlatform struct {
	iface  string
	logger klog.Logger
	// saidNoBlackhole is set once blackhole said it cannot.
	saidNoBlackhole bool
}

// newPlatform checks that the interface exists, and removes the
// addresses a previous run left on it.
func newPlatform(logger klog.Logger, cfg Config, opts Options) (platform, error) {
	if cfg.NetNS != "" {
		return nil, fmt.Errorf("network namespaces (NetNS %q) exist on Linux only", cfg.NetNS)
	}
	if _, err := net.InterfaceByName(opts.Interface); err != nil {
		return nil, fmt.Errorf("interface %q (create a loopback adapter and name it so, or set Options.Interface): %w", opts.Interface, err)
	}
	if err := cleanup(logger, cfg, opts); err != nil {
		return nil, err
	}
	return &windowsPlatform{iface: opts.Interface, logger: logger}, nil
}

// netsh runs netsh with args.
func netsh(args ...string) error {
	out, err := exec.Command("netsh", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("netsh %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func (p *windowsPlatform) addAddress(a netip.Addr) error {
	if a.Is4() {
		return netsh("interface", "ipv4", "add", "address", "name="+p.iface, "address="+a.String(), "mask=255.255.255.255", "skipassource=true", "store=active")
	}
	return netsh("interface", "ipv6", "add", "address", "interface="+p.iface, "address="+a.String()+"/128", "skipassource=true", "store=active")
}

// awaitLocal returns at once: netsh returns once the address is usable.
func (p *windowsPlatform) awaitLocal([]netip.Addr) error { return nil }

func (p *windowsPlatform) removeAddress(a netip.Addr) error {
	if a.Is4() {
		return netsh("interface", "ipv4", "delete", "address", "name="+p.iface, "address="+a.String())
	}
	return netsh("interface", "ipv6", "delete", "address", "interface="+p.iface, "address="+a.String())
}

func (p *windowsPlatform) nodeAddresses() ([]netip.Addr, error) { return interfaceAddresses(p.iface) }

// blackhole cannot drop the service CIDRs on Windows (it has no
// blackhole routes): it says so once, and the addresses no service holds
// are routed as the node routes them.
func (p *windowsPlatform) blackhole(prefixes []netip.Prefix) error {
	if len(prefixes) > 0 && !p.saidNoBlackhole {
		p.saidNoBlackhole = true
		p.logger.Info("The service CIDRs are not dropped on Windows: the addresses no service holds are routed as the node routes them", "serviceCIDRs", prefixes)
	}
	return nil
}

func (p *windowsPlatform) in(fn func() error) error { return fn() }

func (p *windowsPlatform) close() error { return nil }

// cleanup removes the service addresses from the interface: every address
// on it but its own link-local ones is the proxier's.
func cleanup(logger klog.Logger, _ Config, opts Options) error {
	ifi, err := net.InterfaceByName(opts.Interface)
	if err != nil {
		return nil
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return fmt.Errorf("addresses of %s: %w", opts.Interface, err)
	}
	p := &windowsPlatform{iface: opts.Interface, logger: logger}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok && usableNodeAddress(ip.Unmap()) {
				if err := p.removeAddress(ip.Unmap()); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// interfaceAddresses lists, through the standard library, the usable
// unicast addresses of every interface but skip.
func interfaceAddresses(skip string) ([]netip.Addr, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("list interfaces: %w", err)
	}
	var out []netip.Addr
	for _, ifi := range ifs {
		if ifi.Name == skip {
			continue
		}
		addrs, err := ifi.Addrs()
		if err != nil {
			return nil, fmt.Errorf("addresses of %s: %w", ifi.Name, err)
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok && usableNodeAddress(ip.Unmap()) {
					out = append(out, ip.Unmap())
				}
			}
		}
	}
	return out, nil
}
