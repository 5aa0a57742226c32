//go:build linux

package userspace

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"time"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// linuxPlatform holds the service addresses on a dummy interface, over
// netlink, in the proxier's network namespace.
type linuxPlatform struct {
	h    *netlink.Handle
	link netlink.Link
	// target and orig are the proxier's network namespace and the one
	// to come back to; nil without Config.NetNS.
	target, orig *os.File
}

// newPlatform opens the network namespace of cfg, creates the interface
// when it is missing, brings it up and removes the addresses a previous
// run left on it.
func newPlatform(logger klog.Logger, cfg Config, opts Options) (platform, error) {
	p := &linuxPlatform{}
	ns := vnetns.None()
	if cfg.NetNS != "" {
		var err error
		if p.target, err = os.Open(cfg.NetNS); err != nil {
			return nil, fmt.Errorf("network namespace: %w", err)
		}
		if p.orig, err = os.Open("/proc/thread-self/ns/net"); err != nil {
			p.close()
			return nil, fmt.Errorf("current network namespace: %w", err)
		}
		ns = vnetns.NsHandle(p.target.Fd())
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		p.close()
		return nil, fmt.Errorf("netlink: %w", err)
	}
	p.h = h
	if p.link, err = ensureDummy(logger, h, opts.Interface); err != nil {
		p.close()
		return nil, err
	}
	if err := p.flush(); err != nil {
		p.close()
		return nil, err
	}
	return p, nil
}

// ensureDummy returns the interface name, creating it when it is missing
// as a dummy interface or, on a kernel without the dummy driver, as a
// bridge without ports (which holds local addresses the same way), and
// brings it up.
func ensureDummy(logger klog.Logger, h *netlink.Handle, name string) (netlink.Link, error) {
	link, err := h.LinkByName(name)
	if errors.As(err, new(netlink.LinkNotFoundError)) {
		if err := addDummy(logger, h, name); err != nil {
			return nil, err
		}
		link, err = h.LinkByName(name)
	}
	if err != nil {
		return nil, fmt.Errorf("interface %s: %w", name, err)
	}
	if err := h.LinkSetUp(link); err != nil {
		return nil, fmt.Errorf("bring interface %s up: %w", name, err)
	}
	return link, nil
}

// addDummy creates the interface name: a dummy interface, or a bridge
// without ports when the kernel has no dummy driver.
func addDummy(logger klog.Logger, h *netlink.Handle, name string) error {
	attrs := netlink.LinkAttrs{Name: name}
	err := h.LinkAdd(&netlink.Dummy{LinkAttrs: attrs})
	if errors.Is(err, unix.EOPNOTSUPP) {
		logger.Info("No dummy interface driver in this kernel: using a bridge without ports", "interface", name)
		err = h.LinkAdd(&netlink.Bridge{LinkAttrs: attrs})
	}
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("create interface %s: %w", name, err)
	}
	return nil
}

// flush removes the interface's addresses but its link-local ones.
func (p *linuxPlatform) flush() error {
	addrs, err := p.h.AddrList(p.link, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("list the addresses of %s: %w", p.link.Attrs().Name, err)
	}
	for _, a := range addrs {
		if a.IP.IsLinkLocalUnicast() {
			continue
		}
		if err := p.h.AddrDel(p.link, &a); err != nil {
			return fmt.Errorf("remove %s from %s: %w", a.IPNet, p.link.Attrs().Name, err)
		}
	}
	return nil
}

// hostAddr is a as a netlink address of one host, without duplicate
// address detection (which would keep an IPv6 address unusable for a
// second or so).
func hostAddr(a netip.Addr) *netlink.Addr {
	bits := a.BitLen()
	na := &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, bits)}}
	if a.Is6() {
		na.Flags = unix.IFA_F_NODAD
	}
	return na
}

func (p *linuxPlatform) addAddress(a netip.Addr) error {
	if err := p.h.AddrReplace(p.link, hostAddr(a)); err != nil {
		return fmt.Errorf("add %s to %s: %w", a, p.link.Attrs().Name, err)
	}
	return nil
}

// localRouteTimeout bounds awaitLocal's wait.
const localRouteTimeout = 2 * time.Second

// awaitLocal returns once a route lookup of each of addrs finds its local
// route. An IPv6 address is not local yet when the netlink request that
// adds it returns: the kernel inserts its local route afterwards, from a
// work queue (addrconf's DAD work, which ends at once with nodad, but
// runs when it is scheduled: a few milliseconds on a busy node). Until
// then a datagram to the address is routed as if it were not the node's
// (to the service CIDR's blackhole route, or out of the interface) and
// lost, although the socket bound to the address exists. IPv4 addresses
// get their local route within the request.
func (p *linuxPlatform) awaitLocal(addrs []netip.Addr) error {
	deadline := time.Now().Add(localRouteTimeout)
	wait := 100 * time.Microsecond
	for _, a := range addrs {
		if a.Is4() {
			continue
		}
		for {
			routes, err := p.h.RouteGet(a.AsSlice())
			if err == nil && len(routes) > 0 && routes[0].Type == unix.RTN_LOCAL {
				break
			}
			if time.Now().After(deadline) {
				if err == nil {
					err = fmt.Errorf("found %v", routes)
				}
				return fmt.Errorf("address %s on %s: no local route after %v: %w", a, p.link.Attrs().Name, localRouteTimeout, err)
			}
			time.Sleep(wait)
			wait = min(2*wait, 20*time.Millisecond)
		}
	}
	return nil
}

func (p *linuxPlatform) removeAddress(a netip.Addr) error {
	if err := p.h.AddrDel(p.link, hostAddr(a)); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
		return fmt.Errorf("remove %s from %s: %w", a, p.link.Attrs().Name, err)
	}
	return nil
}

func (p *linuxPlatform) nodeAddresses() ([]netip.Addr, error) {
	addrs, err := p.h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list the node's addresses: %w", err)
	}
	var out []netip.Addr
	for _, a := range addrs {
		if a.LinkIndex == p.link.Attrs().Index {
			continue
		}
		if ip, ok := netip.AddrFromSlice(a.IP); ok && usableNodeAddress(ip.Unmap()) {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}

// routeProtocol marks the blackhole routes of the service CIDRs as
// kpng's (rtm_protocol 107, unused by iproute2's rt_protos): a proxier
// finds those of a previous run, and never touches other routes.
const routeProtocol netlink.RouteProtocol = 107

// blackhole keeps one blackhole route in the main table per prefix, of
// protocol routeProtocol: missing ones are added, the others deleted.
func (p *linuxPlatform) blackhole(prefixes []netip.Prefix) error {
	have, err := blackholeRoutes(p.h)
	if err != nil {
		return err
	}
	want := map[netip.Prefix]bool{}
	for _, pfx := range prefixes {
		want[pfx] = true
	}
	var errs []error
	for pfx, r := range have {
		if !want[pfx] {
			if err := p.h.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("remove the blackhole route of %s: %w", pfx, err))
			}
		}
	}
	for _, pfx := range prefixes {
		if _, ok := have[pfx]; ok {
			continue
		}
		err := p.h.RouteAdd(blackholeRoute(pfx))
		if errors.Is(err, unix.EEXIST) {
			err = errors.New("another route of the main table has that destination: left alone, the range is not dropped")
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("blackhole route of service CIDR %s: %w", pfx, err))
		}
	}
	return errors.Join(errs...)
}

// blackholeRoute is the route dropping the addresses of pfx.
func blackholeRoute(pfx netip.Prefix) *netlink.Route {
	return &netlink.Route{
		Dst:      &net.IPNet{IP: pfx.Addr().AsSlice(), Mask: net.CIDRMask(pfx.Bits(), pfx.Addr().BitLen())},
		Type:     unix.RTN_BLACKHOLE,
		Protocol: routeProtocol,
		Table:    unix.RT_TABLE_MAIN,
	}
}

// blackholeRoutes lists the blackhole routes of kpng (routeProtocol) in
// the main table, by destination.
func blackholeRoutes(h *netlink.Handle) (map[netip.Prefix]netlink.Route, error) {
	out := map[netip.Prefix]netlink.Route{}
	for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := h.RouteListFiltered(family, &netlink.Route{Protocol: routeProtocol, Table: unix.RT_TABLE_MAIN, Type: unix.RTN_BLACKHOLE},
			netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE|netlink.RT_FILTER_TYPE)
		if err != nil {
			return nil, fmt.Errorf("list the blackhole routes: %w", err)
		}
		for _, r := range routes {
			if r.Dst == nil {
				continue
			}
			a, ok := netip.AddrFromSlice(r.Dst.IP)
			ones, _ := r.Dst.Mask.Size()
			if ok {
				out[netip.PrefixFrom(a.Unmap(), ones)] = r
			}
		}
	}
	return out, nil
}

// in runs fn on a thread in the proxier's network namespace. When the
// thread cannot be brought back, it stays locked, so that the Go runtime
// ends it rather than reuse it in the wrong namespace.
func (p *linuxPlatform) in(fn func() error) error {
	if p.target == nil {
		return fn()
	}
	runtime.LockOSThread()
	if err := unix.Setns(int(p.target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter network namespace: %w", err)
	}
	err := fn()
	if berr := unix.Setns(int(p.orig.Fd()), unix.CLONE_NEWNET); berr != nil {
		return errors.Join(err, fmt.Errorf("leave network namespace: %w", berr))
	}
	runtime.UnlockOSThread()
	return err
}

func (p *linuxPlatform) close() error {
	if p.h != nil {
		p.h.Close()
	}
	for _, f := range []*os.File{p.target, p.orig} {
		if f != nil {
			_ = f.Close()
		}
	}
	return nil
}

// cleanup removes the proxier's interface, and with it its addresses,
// and for the proxier without a service-proxy-name (the default one) the
// blackhole routes of the service CIDRs.
func cleanup(_ klog.Logger, cfg Config, opts Options) error {
	ns := vnetns.None()
	if cfg.NetNS != "" {
		f, err := os.Open(cfg.NetNS)
		if err != nil {
			return fmt.Errorf("network namespace: %w", err)
		}
		defer f.Close()
		ns = vnetns.NsHandle(f.Fd())
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	if cfg.ServiceProxyName == "" {
		routes, err := blackholeRoutes(h)
		if err != nil {
			return err
		}
		for pfx, r := range routes {
			if err := h.RouteDel(&r); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("remove the blackhole route of %s: %w", pfx, err)
			}
		}
	}
	link, err := h.LinkByName(opts.Interface)
	if errors.As(err, new(netlink.LinkNotFoundError)) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("interface %s: %w", opts.Interface, err)
	}
	if !madeByKpng(h, link) {
		return fmt.Errorf("interface %s is a %s, not the dummy interface (or bridge without ports) kpng creates: left alone", opts.Interface, link.Type())
	}
	if err := h.LinkDel(link); err != nil {
		return fmt.Errorf("remove interface %s: %w", opts.Interface, err)
	}
	return nil
}

// madeByKpng reports whether link is of a kind kpng creates: a dummy
// interface, or a bridge without ports.
func madeByKpng(h *netlink.Handle, link netlink.Link) bool {
	switch link.(type) {
	case *netlink.Dummy:
		return true
	case *netlink.Bridge:
		links, err := h.LinkList()
		if err != nil {
			return false
		}
		for _, l := range links {
			if l.Attrs().MasterIndex == link.Attrs().Index {
				return false
			}
		}
		return true
	}
	return false
}
