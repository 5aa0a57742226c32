package iptables

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
)

// Runner runs the iptables binaries. The sink runs iptables-restore and
// iptables-save through it (go-iptables, which ensures the jumps from the
// built-in chains, runs its own commands): a test can record the input
// the sink sends, and answer with canned output or errors, without root.
type Runner interface {
	// Run runs the binary name with args, stdin as its input, and
	// returns its standard output; an error when it fails, with what it
	// wrote on its standard error.
	Run(ctx context.Context, name string, args []string, stdin []byte) ([]byte, error)
}

// ExecRunner runs the binaries as processes, in the network namespace at
// NetNS when it is set (through nsenter --net, from util-linux).
type ExecRunner struct {
	// NetNS is the path of a network namespace (/run/netns/x); empty:
	// the current one.
	NetNS string
	// Started, if set, is given the process ID of each process started,
	// before it is waited for (nsenter execs the binary: the same
	// process). The sink tells its own iptables-nft transactions by it.
	Started func(pid int)
}

// Run implements Runner.
func (r ExecRunner) Run(ctx context.Context, name string, args []string, stdin []byte) ([]byte, error) {
	path, argv := name, args
	if r.NetNS != "" {
		path, argv = "nsenter", append([]string{"--net=" + r.NetNS, "--", name}, args...)
	}
	cmd := exec.CommandContext(ctx, path, argv...)
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Start()
	if err == nil {
		if r.Started != nil {
			r.Started(cmd.Process.Pid)
		}
		err = cmd.Wait()
	}
	if err != nil {
		return stdout.Bytes(), fmt.Errorf("%s %s: %w: %s", path, strings.Join(argv, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// restoreInput returns the iptables-restore input that makes the
// proxier's chains of one table what t says, and deletes the chains of
// stale (chains of the proxier that t no longer has): each chain is
// declared (":NAME - [0:0]", which creates or flushes it; in name order),
// then filled;
// then the lines of inserts (the jumps from the built-in chains that are
// missing: "-I PREROUTING 1 …"); stale chains are declared too (flushed,
// so that none of them refers to another) and deleted (-X) at the end.
// With --noflush, nothing else of the table changes.
func restoreInput(table string, t *tablePlan, stale []string, inserts ...string) []byte {
	var b bytes.Buffer
	b.WriteString("*" + table + "\n")
	// The declarations go in name order: both variants keep a table's
	// chains in a list sorted by name, and inserting 10,000 hashed names
	// in their order took iptables-nft-restore three times as long
	// (11.6 s of CPU instead of 3.8 s).
	names := make([]string, 0, len(t.Chains)+len(stale))
	for _, c := range t.Chains {
		names = append(names, c.Name)
	}
	names = append(names, stale...)
	slices.Sort(names)
	for _, name := range names {
		b.WriteString(":" + name + " - [0:0]\n")
	}
	for _, c := range t.Chains {
		for _, r := range c.Rules {
			b.WriteString("-A " + c.Name + " " + r + "\n")
		}
	}
	for _, line := range inserts {
		b.WriteString(line + "\n")
	}
	for _, name := range stale {
		b.WriteString("-X " + name + "\n")
	}
	b.WriteString("COMMIT\n")
	return b.Bytes()
}

// chainsWithPrefix returns the chains declared in iptables-save output
// whose name starts with prefix, sorted.
func chainsWithPrefix(save []byte, prefix string) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(save))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, ":"+prefix) {
			continue
		}
		if name, _, ok := strings.Cut(line[1:], " "); ok {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// countRules returns the number of rules ("-A" lines) in iptables-save
// output.
func countRules(save []byte) int {
	n := 0
	for line := range bytes.SplitSeq(save, []byte("\n")) {
		if bytes.HasPrefix(line, []byte("-")) {
			n++
		}
	}
	return n
}
