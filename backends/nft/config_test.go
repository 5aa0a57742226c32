//go:build linux

package nft

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

func TestConfigFlags(t *testing.T) {
	var cfg Config
	fs := flag.NewFlagSet("to-nft", flag.ContinueOnError)
	cfg.BindFlags(fs)
	if cfg.Options.MasqueradeBit != DefaultMasqueradeBit || cfg.CheckPeriod != DefaultCheckPeriod {
		t.Errorf("defaults: %+v", cfg)
	}
	err := fs.Parse([]string{"--cluster-cidr=10.0.0.0/8", "--nodeport-addresses=192.168.0.0/16", "--node-ip=10.1.2.3",
		"--masquerade-all", "--masquerade-bit=3", "--ignore-headless", "--check-period=5s"})
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	o := cfg.Options
	if len(o.ClusterCIDRs) != 1 || len(o.NodePortAddresses) != 1 || len(o.NodeIPs) != 1 || !o.MasqueradeAll ||
		o.MasqueradeBit != 3 || o.mark() != 8 || !o.IgnoreHeadless || cfg.CheckPeriod != 5*time.Second {
		t.Errorf("parsed: %+v", cfg)
	}
}

func TestConfigValidateNamesFlags(t *testing.T) {
	for _, args := range [][]string{{"--check-period=-1s"}, {"--masquerade-bit=0"}, {"--masquerade-bit=32"}, {"--node-ip=10.0.0.300"}} {
		var cfg Config
		fs := flag.NewFlagSet("to-nft", flag.ContinueOnError)
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

func TestMasqueradeMark(t *testing.T) {
	for bit, want := range map[int]uint32{0: 0x4000, 14: 0x4000, 1: 2, 31: 1 << 31} {
		if got := (Options{MasqueradeBit: bit}).mark(); got != want {
			t.Errorf("MasqueradeBit %d: mark %#x, want %#x", bit, got, want)
		}
	}
	for _, bit := range []int{-1, 32} {
		if err := (Options{MasqueradeBit: bit}).Validate(); err == nil {
			t.Errorf("MasqueradeBit %d: valid", bit)
		}
	}
}
