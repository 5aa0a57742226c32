//go:build linux

package iptables

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"

	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/backends/periodic"
)

// ForwardAccept keeps, for a proxier that is not this package's (the nft
// backend's: an accept in its own nftables table cannot override the
// drop of another table's base chain), a chain in the iptables filter
// tables (ForwardAcceptChain) that accepts the forwarded packets the
// proxier marked for masquerading and the replies and related packets of
// accepted connections, and a jump to it inserted first in filter
// FORWARD: on a node whose FORWARD policy is DROP (Docker sets it), the
// proxier's service traffic is forwarded, as kube-proxy's KUBE-FORWARD
// does in its iptables mode. It writes through the iptables binaries,
// never nftables directly: iptables-nft refuses a table holding
// expressions it did not write.
type ForwardAccept struct {
	cfg   ForwardAcceptConfig
	chain string
	rules []string
	// lookPath finds a binary (exec.LookPath); legacyFilter reports
	// whether the legacy filter table of family f exists in cfg.NetNS
	// (listing it with -t filter would create it). Fakes in unit tests.
	lookPath     func(string) (string, error)
	legacyFilter func(f family) (bool, error)
	// mu serializes Ensure and Cleanup.
	mu sync.Mutex
}

// NewForwardAccept returns the ForwardAccept of cfg, after validating it.
// Nothing is written before Ensure or Start.
func NewForwardAccept(cfg ForwardAcceptConfig) (*ForwardAccept, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Variant == "" {
		cfg.Variant = VariantAuto
	}
	if cfg.Runner == nil {
		if _, err := exec.LookPath("nsenter"); err != nil && cfg.NetNS != "" {
			return nil, fmt.Errorf("forward accept: network namespace %s needs nsenter (util-linux): %w", cfg.NetNS, err)
		}
		cfg.Runner = ExecRunner{NetNS: cfg.NetNS}
	}
	fa := &ForwardAccept{
		cfg:      cfg,
		chain:    ForwardAcceptChain(cfg.ServiceProxyName),
		rules:    forwardAcceptRules(cfg.MasqueradeBit),
		lookPath: exec.LookPath,
	}
	fa.legacyFilter = fa.legacyFilterExists
	return fa, nil
}

// Chain returns the name of the chain (ForwardAcceptChain).
func (fa *ForwardAccept) Chain() string { return fa.chain }

// target is one variant and family's filter table.
type target struct {
	variant string
	family  family
}

// String returns "nft IPv4".
func (t target) String() string { return t.variant + " " + t.family.String() }

// Ensure checks the chain and its jump once in each variant and family
// the config names (VariantAuto: those whose FORWARD policy is DROP or
// that hold them already) and writes, in each, what differs or is
// missing, with one iptables-restore --noflush. It returns the targets
// it wrote ("nft IPv4: the jump from FORWARD is missing") and the errors
// of those it could not check or write (the others are written anyway).
// With VariantAuto, a variant whose binaries are missing is left out;
// none at all is an error.
func (fa *ForwardAccept) Ensure(ctx context.Context) (repaired []string, err error) {
	fa.mu.Lock()
	defer fa.mu.Unlock()
	var errs []error
	checked := 0
	for _, v := range fa.variants() {
		for _, f := range families {
			t := target{v, f}
			if !fa.installed(t) {
				if fa.cfg.Variant != VariantAuto {
					errs = append(errs, fmt.Errorf("forward accept (%s): %s not found", t, binary(v, f, "-restore")))
				}
				continue
			}
			checked++
			st, ok, err := fa.read(ctx, t, fa.cfg.Variant != VariantAuto)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if !ok {
				continue // a legacy table that does not exist
			}
			if fa.cfg.Variant == VariantAuto && st.Policy != "DROP" && !st.Chain && len(st.Jumps) == 0 {
				continue
			}
			in, why := forwardAcceptRepair(st, fa.chain, fa.cfg.ServiceProxyName, fa.rules)
			if in == nil {
				continue
			}
			if _, err := fa.cfg.Runner.Run(ctx, binary(v, f, "-restore"), []string{"--noflush", "--wait"}, in); err != nil {
				errs = append(errs, fmt.Errorf("forward accept (%s): write chain %s and its jump from filter FORWARD (%s): %w", t, fa.chain, why, err))
				continue
			}
			repaired = append(repaired, t.String()+": "+why)
		}
	}
	if checked == 0 && len(errs) == 0 {
		errs = append(errs, fmt.Errorf("forward accept: no iptables binaries found (%s, %s)", binary(VariantNFT, ipv4, "-restore"), binary(VariantLegacy, ipv4, "-restore")))
	}
	return repaired, errors.Join(errs...)
}

// Start ensures the chain and its jump now, and returns the first
// Ensure's error, if any, having started nothing; otherwise it checks
// them again every CheckPeriod until ctx ends, from a goroutine of its
// own, whose end closes the channel returned (at once when CheckPeriod is
// 0). It logs (klog.FromContext(ctx)) what it writes and, in the checks,
// what fails.
func (fa *ForwardAccept) Start(ctx context.Context) (<-chan struct{}, error) {
	logger := klog.FromContext(ctx)
	repaired, err := fa.Ensure(ctx)
	for _, r := range repaired {
		logger.Info("Accepting the forwarded service traffic in the iptables filter table", "chain", fa.chain, "where", r)
	}
	if err != nil {
		return nil, err
	}
	return periodic.Start(ctx, fa.cfg.CheckPeriod, func() {
		repaired, err := fa.Ensure(ctx)
		for _, r := range repaired {
			logger.Info("The iptables chain accepting forwarded service traffic was changed: written again", "chain", fa.chain, "where", r)
		}
		if err != nil && ctx.Err() == nil {
			logger.Error(err, "Cannot keep the iptables chain accepting forwarded service traffic: tried again at the next check", "chain", fa.chain)
		}
	}), nil
}

// Cleanup removes the chain and its jumps from the filter tables of both
// variants and families, whatever the config's Variant, as the proxier's
// --cleanup does; a variant whose binaries are missing, or whose legacy
// table does not exist, has nothing to remove. It logs through ctx's
// logger.
func (fa *ForwardAccept) Cleanup(ctx context.Context) error {
	fa.mu.Lock()
	defer fa.mu.Unlock()
	var errs []error
	removed := 0
	for _, v := range []string{VariantLegacy, VariantNFT} {
		for _, f := range families {
			t := target{v, f}
			if !fa.installed(t) {
				continue
			}
			st, ok, err := fa.read(ctx, t, false)
			if err != nil {
				errs = append(errs, fmt.Errorf("forward accept cleanup: %w", err))
				continue
			}
			in := forwardAcceptRemoval(st, fa.chain)
			if !ok || in == nil {
				continue
			}
			if _, err := fa.cfg.Runner.Run(ctx, binary(v, f, "-restore"), []string{"--noflush", "--wait"}, in); err != nil {
				errs = append(errs, fmt.Errorf("forward accept cleanup (%s): delete chain %s and its jumps from filter FORWARD: %w", t, fa.chain, err))
				continue
			}
			removed++
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if removed > 0 {
		klog.FromContext(ctx).Info("Removed the iptables chain accepting forwarded service traffic", "chain", fa.chain, "tables", removed)
	}
	return nil
}

// variants returns the variants Ensure looks at.
func (fa *ForwardAccept) variants() []string {
	if fa.cfg.Variant == VariantAuto {
		return []string{VariantLegacy, VariantNFT}
	}
	return []string{fa.cfg.Variant}
}

// installed reports whether the -save and -restore binaries of t are
// found.
func (fa *ForwardAccept) installed(t target) bool {
	for _, tool := range []string{"-save", "-restore"} {
		if _, err := fa.lookPath(binary(t.variant, t.family, tool)); err != nil {
			return false
		}
	}
	return true
}

// read lists the filter table of t and returns what it holds of the
// chain; ok is false for a legacy table that does not exist (not listed:
// iptables-legacy-save -t filter would create it), unless create.
func (fa *ForwardAccept) read(ctx context.Context, t target, create bool) (st filterState, ok bool, err error) {
	if t.variant == VariantLegacy && !create {
		exists, err := fa.legacyFilter(t.family)
		if err != nil {
			return st, false, fmt.Errorf("forward accept (%s): %w", t, err)
		}
		if !exists {
			return st, false, nil
		}
	}
	out, err := fa.cfg.Runner.Run(ctx, binary(t.variant, t.family, "-save"), []string{"-t", "filter"}, nil)
	if err != nil {
		return st, false, fmt.Errorf("forward accept (%s): list the filter table: %w", t, err)
	}
	return parseFilter(out, fa.chain), true, nil
}

// legacyFilterExists reports whether the legacy (xtables) filter table of
// family f exists in cfg.NetNS: whether the kernel lists it in
// /proc/net/ip_tables_names (ip6_tables_names), read from a thread in
// that namespace. A kernel without legacy iptables has no such file.
func (fa *ForwardAccept) legacyFilterExists(f family) (bool, error) {
	name := "/proc/thread-self/net/ip_tables_names"
	if f == ipv6 {
		name = "/proc/thread-self/net/ip6_tables_names"
	}
	var exists bool
	err := inNetNS(fa.cfg.NetNS, func() error {
		b, err := os.ReadFile(name)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("the legacy tables of %s: %w", f, err)
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if strings.TrimSpace(line) == "filter" {
				exists = true
			}
		}
		return nil
	})
	return exists, err
}
