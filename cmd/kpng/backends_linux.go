//go:build linux

package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/backends/healthcheck"
	"sigs.k8s.io/kpng/backends/iptables"
	"sigs.k8s.io/kpng/backends/nft"
	"sigs.k8s.io/kpng/cmd/kpng/app"
	"sigs.k8s.io/kpng/localsink"
)

// platformBackends are the Linux-only backends.
func platformBackends() []app.Backend {
	return []app.Backend{nftBackend(), iptablesBackend(), userspaceBackend()}
}

// nftBackend is `to-local to-nft`: the nftables backend (backends/nft),
// which binds its own flags (nft.Config.BindFlags).
func nftBackend() app.Backend {
	return app.Backend{
		Name: "to-nft",
		Help: "program nftables over netlink (tables ip and ip6 kpng-<service-proxy-name>)",
		Bind: func(fs *flag.FlagSet) func(context.Context, app.BackendEnv) (localsink.Sink, error) {
			var cfg nft.Config
			cfg.BindFlags(fs)
			pf := bindProxierFlags(fs, "the name in the tables' name",
				"program the rules in this network namespace (a path such as /run/netns/x) instead of the current one",
				"remove the tables (ip and ip6, and the inet table of an earlier kpng) and the --forward-accept chain, wherever it is, and exit")
			forwardAccept := fs.Bool("forward-accept", false, "for a node whose filter FORWARD policy is DROP (Docker sets it): keep a chain in the iptables filter table accepting the forwarded service traffic (the --masquerade-bit mark, and the replies), jumped to first from FORWARD, checked every --check-period (kpng's nftables tables cannot override another table's drop; needs the iptables binaries)")
			forwardAcceptVariant := fs.String("forward-accept-iptables", iptables.VariantAuto, "with --forward-accept, the iptables variant to write in: auto (each variant and family whose FORWARD policy is DROP), legacy or nft")
			return func(ctx context.Context, env app.BackendEnv) (localsink.Sink, error) {
				if err := cfg.Validate(); err != nil {
					return nil, app.Usagef("to-nft %v", err)
				}
				cfg.ServiceProxyName = pf.serviceProxyName(env)
				faCfg := iptables.ForwardAcceptConfig{ServiceProxyName: cfg.ServiceProxyName, MasqueradeBit: cfg.Options.MasqueradeBit,
					NetNS: *pf.netns, Variant: *forwardAcceptVariant, CheckPeriod: cfg.CheckPeriod}
				if err := faCfg.Validate(); err != nil {
					return nil, app.Usagef("to-nft --forward-accept-iptables=%s: want auto, legacy or nft", *forwardAcceptVariant)
				}
				hcCfg := healthcheck.Config{NodePortAddresses: cfg.Options.NodePortAddresses}
				if *pf.netns != "" {
					f, err := os.Open(*pf.netns)
					if err != nil {
						return nil, fmt.Errorf("to-nft --netns: %w", err)
					}
					// The namespace stays open for the process's life.
					fd := int(f.Fd())
					cfg.Conn = nft.ConnInNetNS(fd)
					// Stale UDP conntrack entries are deleted in the same
					// namespace.
					cfg.Conntrack = func() (*netlink.Handle, error) {
						return netlink.NewHandleAt(vnetns.NsHandle(fd), unix.NETLINK_NETFILTER)
					}
					hcCfg.Listen = listenIn(vnetns.NsHandle(fd))
					hcCfg.Addresses = addressesIn(vnetns.NsHandle(fd))
					go func() { <-ctx.Done(); f.Close() }()
				}
				if *pf.cleanup {
					if err := nft.Cleanup(ctx, cfg); err != nil {
						return nil, fmt.Errorf("to-nft --cleanup: %w", err)
					}
					if err := cleanupForwardAccept(ctx, faCfg, *forwardAccept); err != nil {
						return nil, fmt.Errorf("to-nft --cleanup: %w", err)
					}
					return nil, app.ErrBackendDone
				}
				if env.Metrics != nil {
					env.Metrics.SetProxyMode("nftables")
					failures, err := env.Metrics.Counter("sync_proxy_rules_nftables_sync_failures_total", "nftables transactions that failed (kpng's rounds and the check's repairs): nothing of them applied, the next sync rewrites the table.")
					if err != nil {
						return nil, fmt.Errorf("to-nft: %w", err)
					}
					repairs, err := env.Metrics.Counter("sync_proxy_rules_nftables_repairs_total", "rewrites of the table kpng did not ask for: another program changed it (the monitor's notifications) or the periodic check found it changed.")
					if err != nil {
						return nil, fmt.Errorf("to-nft: %w", err)
					}
					cfg.AfterSync = func(res nft.SyncResult) {
						if res.Err != nil {
							failures.Inc()
						}
						if res.Repair != "" {
							repairs.Inc()
						}
					}
				}
				sink, err := nft.New(ctx, cfg)
				if err != nil {
					return nil, err
				}
				if *forwardAccept {
					fa, err := iptables.NewForwardAccept(faCfg)
					if err != nil {
						return nil, fmt.Errorf("to-nft --forward-accept: %w", err)
					}
					if _, err := fa.Start(ctx); err != nil {
						return nil, fmt.Errorf("to-nft --forward-accept: %w", err)
					}
				}
				return pf.withHealthChecks(ctx, sink, hcCfg, env)
			}
		},
	}
}

// cleanupForwardAccept removes the chain of `to-nft --forward-accept` of
// cfg, in both variants, at --cleanup: whether or not the flag is given
// again (a proxier's cleanup removes all it may have written). Without
// it, a node that cannot run the iptables binaries (no nsenter for
// --netns) has nothing to remove; with it, that is an error.
func cleanupForwardAccept(ctx context.Context, cfg iptables.ForwardAcceptConfig, asked bool) error {
	fa, err := iptables.NewForwardAccept(cfg)
	if err != nil {
		if !asked {
			klog.FromContext(ctx).V(1).Info("Not looking for a --forward-accept chain to remove", "err", err)
			return nil
		}
		return fmt.Errorf("--forward-accept: %w", err)
	}
	return fa.Cleanup(ctx)
}

// iptablesBackend is `to-local to-iptables`: the iptables backend
// (backends/iptables), which binds its own flags (iptables.Config.BindFlags).
func iptablesBackend() app.Backend {
	return app.Backend{
		Name: "to-iptables",
		Help: "program iptables and ip6tables through iptables-restore (chains KPNG-<hash of the service-proxy-name>-…)",
		Bind: func(fs *flag.FlagSet) func(context.Context, app.BackendEnv) (localsink.Sink, error) {
			var cfg iptables.Config
			cfg.BindFlags(fs)
			pf := bindProxierFlags(fs, "the name the chains' prefix is made of",
				"program the rules in this network namespace (a path such as /run/netns/x) instead of the current one (runs the binaries through nsenter)",
				"remove the chains and their jumps (of both variants with --iptables=auto) and exit")
			return func(ctx context.Context, env app.BackendEnv) (localsink.Sink, error) {
				if err := cfg.Validate(); err != nil {
					return nil, app.Usagef("to-iptables %v", err)
				}
				cfg.ServiceProxyName, cfg.NetNS = pf.serviceProxyName(env), *pf.netns
				if *pf.cleanup {
					if err := iptables.Cleanup(ctx, cfg); err != nil {
						return nil, fmt.Errorf("to-iptables --cleanup: %w", err)
					}
					return nil, app.ErrBackendDone
				}
				if env.Metrics != nil {
					env.Metrics.SetProxyMode("iptables")
					failures, err := env.Metrics.Counter("sync_proxy_rules_iptables_restore_failures_total", "iptables-restore runs that failed (that table unchanged; the next sync rewrites every chain).")
					if err != nil {
						return nil, fmt.Errorf("to-iptables: %w", err)
					}
					partialFailures, err := env.Metrics.Counter("sync_proxy_rules_iptables_partial_restore_failures_total", "iptables-restore runs of partial syncs that failed.")
					if err != nil {
						return nil, fmt.Errorf("to-iptables: %w", err)
					}
					repairs, err := env.Metrics.Counter("sync_proxy_rules_iptables_repairs_total", "full syncs kpng did not ask for: another program changed the chains or jumps (the monitor's notifications, iptables-nft), the periodic check found them changed, or the full-sync period ran out.")
					if err != nil {
						return nil, fmt.Errorf("to-iptables: %w", err)
					}
					cfg.AfterSync = func(res iptables.SyncResult) {
						if res.Repair != "" {
							repairs.Inc()
						}
						if !res.RestoreFailed {
							return
						}
						failures.Inc()
						if !res.Full {
							partialFailures.Inc()
						}
					}
				}
				var hcCfg healthcheck.Config
				if *pf.healthChecks { // opens --netns for the life of ctx
					var err error
					if hcCfg, err = healthCheckConfig(ctx, *pf.netns, cfg.Options.NodePortAddresses); err != nil {
						return nil, fmt.Errorf("to-iptables %w", err)
					}
				}
				sink, err := iptables.New(ctx, cfg)
				if err != nil {
					return nil, err
				}
				return pf.withHealthChecks(ctx, sink, hcCfg, env)
			}
		},
	}
}

// healthCheckConfig returns the health check server's configuration: it
// listens on the addresses nodePortAddrs selects (as the backend's node
// ports), in the network namespace at path (kept open until ctx ends), or
// in the current one for an empty path.
func healthCheckConfig(ctx context.Context, path string, nodePortAddrs []netip.Prefix) (healthcheck.Config, error) {
	cfg := healthcheck.Config{NodePortAddresses: nodePortAddrs}
	if path == "" {
		return cfg, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return cfg, fmt.Errorf("--netns: %w", err)
	}
	go func() { <-ctx.Done(); f.Close() }()
	cfg.Listen = listenIn(vnetns.NsHandle(f.Fd()))
	cfg.Addresses = addressesIn(vnetns.NsHandle(f.Fd()))
	return cfg, nil
}

// addressesIn returns a function listing the addresses of the network
// namespace ns (the handle stays owned by the caller).
func addressesIn(ns vnetns.NsHandle) func() ([]netip.Addr, error) {
	return func() ([]netip.Addr, error) {
		h, err := netlink.NewHandleAt(ns)
		if err != nil {
			return nil, fmt.Errorf("netlink in the --netns network namespace: %w", err)
		}
		defer h.Close()
		list, err := h.AddrList(nil, netlink.FAMILY_ALL)
		if err != nil {
			return nil, fmt.Errorf("list the addresses of the --netns network namespace: %w", err)
		}
		out := make([]netip.Addr, 0, len(list))
		for _, a := range list {
			if ip, ok := netip.AddrFromSlice(a.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
		return out, nil
	}
}

// listenIn returns a function listening in the network namespace ns (the
// handle stays owned by the caller).
func listenIn(ns vnetns.NsHandle) func(network, address string) (net.Listener, error) {
	return func(network, address string) (net.Listener, error) {
		type result struct {
			ln  net.Listener
			err error
		}
		done := make(chan result, 1)
		go func() {
			// The thread enters the namespace and is never unlocked: the
			// runtime ends it with this goroutine instead of reusing it.
			runtime.LockOSThread()
			if err := vnetns.Set(ns); err != nil {
				done <- result{err: fmt.Errorf("enter the --netns network namespace: %w", err)}
				return
			}
			ln, err := net.Listen(network, address)
			done <- result{ln, err}
		}()
		r := <-done
		return r.ln, r.err
	}
}
