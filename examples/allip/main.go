//go:build linux

// Command kpng-allip is the "all-IP" proxier of kpng's blog post written
// in Go with nftables: all traffic for a Service's external IPs, whatever the
// protocol and port, is DNATed to a local endpoint of the Service. See
// package sigs.k8s.io/kpng/examples/allip/allip for the rules and the
// nftables tables it owns, and README.md beside this file.
//
//	kpng-allip --service-proxy-name=kpng-example [kpng's client flags]
//	kpng-allip --state=state.json   # apply a state (kpng-json output; - for stdin) once
//	kpng-allip --cleanup            # remove kpng-allip's tables
//
// It works in the network namespace it runs in, and needs CAP_NET_ADMIN.
// Stopping it leaves the rules in place (traffic keeps flowing while it
// restarts); --cleanup removes them.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"k8s.io/klog/v2"

	"sigs.k8s.io/kpng/client"
	"sigs.k8s.io/kpng/examples/allip/allip"
	"sigs.k8s.io/kpng/localsink"
	"sigs.k8s.io/kpng/model"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stderr, openHost)
	stop()
	os.Exit(code)
}

// opener returns a Proxier for the network namespace to program, and a
// function releasing it.
type opener func() (*allip.Proxier, func(), error)

// openHost opens the network namespace the process runs in.
func openHost() (*allip.Proxier, func(), error) {
	nft, err := nftables.New()
	if err != nil {
		return nil, nil, fmt.Errorf("nftables: %w", err)
	}
	ct, err := netlink.NewHandle()
	if err != nil {
		return nil, nil, fmt.Errorf("netlink: %w", err)
	}
	return &allip.Proxier{NFT: nft, Conntrack: ct}, ct.Close, nil
}

// run is main without the exit: it returns the exit status, 0 on success
// (or when ctx ends the watch), 2 on bad flags, 1 on other errors.
func run(ctx context.Context, args []string, stdin io.Reader, stderr io.Writer, open opener) int {
	name := filepath.Base(os.Args[0])
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var kf client.Flags
	kf.Bind(fs)
	cleanup := fs.Bool("cleanup", false, "remove kpng-allip's nftables tables and exit")
	statePath := fs.String("state", "", "apply the state in this file (kpng-json output, one JSON object per service; - for stdin) once and exit, instead of watching the API server")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: %s [flags]\n\nDNATs all traffic for the external IPs of the selected services to a local endpoint, with nftables.\n\n", name)
		fs.SetOutput(stderr)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "%s: %v (see --help)\n", name, err)
		return 2
	}
	defer klog.Flush()
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected argument %q\n", name, fs.Arg(0))
		return 2
	}
	if *cleanup && *statePath != "" {
		fmt.Fprintf(stderr, "%s: --cleanup and --state exclude each other\n", name)
		return 2
	}

	p, release, err := open()
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
	defer release()
	if *cleanup {
		if err := allip.Cleanup(p.NFT); err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", name, err)
			return 1
		}
		return 0
	}

	if *statePath != "" {
		items, err := readStateFile(*statePath, stdin)
		if err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", name, err)
			return 1
		}
		if err := applyState(p, items); err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", name, err)
			return 1
		}
		return 0
	}

	handler := func(items []*client.ServiceEndpoints) {
		// A failed sync keeps the previous rules; the next state retries.
		if err := applyState(p, items); err != nil {
			klog.ErrorS(err, "Sync failed; the previous rules stay until the next state")
		}
	}
	if err := kf.Run(ctx, localsink.NewFullState(handler)); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
	return 0
}

// readStateFile reads a kpng-json state from path, or from stdin for "-".
func readStateFile(path string, stdin io.Reader) ([]*model.ServiceEndpoints, error) {
	r := stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("state: %w", err)
		}
		defer f.Close()
		r = f
	}
	items, err := allip.ReadState(r)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return items, nil
}

// applyState applies one state and logs what it did.
func applyState(p *allip.Proxier, items []*model.ServiceEndpoints) error {
	res, err := p.Sync(items)
	for _, pr := range res.Problems {
		klog.InfoS("Skipped part of the state", "problem", pr.Error())
	}
	if err != nil {
		return err
	}
	rules := make([]string, len(res.Rules))
	for i, r := range res.Rules {
		rules[i] = r.String()
	}
	klog.InfoS("Applied", "services", len(items), "rules", rules, "changed", len(res.Changed), "conntrackDeleted", res.ConntrackDeleted)
	return nil
}
