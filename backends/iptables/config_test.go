package iptables

import (
	"flag"
	"io"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func TestConfigFlags(t *testing.T) {
	var cfg Config
	fs := flag.NewFlagSet("to-iptables", flag.ContinueOnError)
	cfg.BindFlags(fs)
	if cfg.Options.MasqueradeBit != DefaultMasqueradeBit || cfg.CheckPeriod != DefaultCheckPeriod || cfg.Variant != VariantAuto {
		t.Errorf("defaults: %+v", cfg)
	}
	err := fs.Parse([]string{"--cluster-cidr=10.0.0.0/8", "--nodeport-addresses=192.168.0.0/16", "--node-ip=10.1.2.3",
		"--masquerade-all", "--masquerade-bit=3", "--iptables=nft", "--canary-period=5s"})
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	o := cfg.Options
	if len(o.ClusterCIDRs) != 1 || o.ClusterCIDRs[0] != netip.MustParsePrefix("10.0.0.0/8") || len(o.NodePortAddresses) != 1 ||
		len(o.NodeIPs) != 1 || !o.MasqueradeAll || o.MasqueradeBit != 3 || cfg.Variant != VariantNFT || cfg.CheckPeriod != 5*time.Second {
		t.Errorf("parsed: %+v", cfg)
	}
	if err := fs.Parse([]string{"--check-period=7s"}); err != nil || cfg.CheckPeriod != 7*time.Second {
		t.Errorf("--check-period=7s: %v, %v", err, cfg.CheckPeriod)
	}
}

func TestConfigValidateNamesFlags(t *testing.T) {
	for _, args := range [][]string{{"--iptables=xtables"}, {"--check-period=-1s"}, {"--masquerade-bit=0"}, {"--masquerade-bit=32"}, {"--cluster-cidr=10.0.0.1/8"}} {
		var cfg Config
		fs := flag.NewFlagSet("to-iptables", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		cfg.BindFlags(fs)
		err := fs.Parse(args)
		if err == nil {
			err = cfg.Validate()
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(args[0], "--"), "=")
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v, want an error naming the flag", args[0], err)
		}
	}
}
