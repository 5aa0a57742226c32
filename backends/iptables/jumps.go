package iptables

import (
	"bytes"
	"strings"
)

// jump is a rule in a built-in chain sending packets to one of the
// proxier's chains.
type jump struct {
	Table, From, To string
	// Match comes before the target (filter jumps: new connections only).
	Match []string
}

// rule returns the rule's specification, as go-iptables takes it.
func (j jump) rule(serviceProxyName string) []string {
	spec := append([]string{"-m", "comment", "--comment", "kpng " + nameSafe(serviceProxyName)}, j.Match...)
	return append(spec, "-j", j.To)
}

// insertLine returns the iptables-restore line inserting the jump first
// in its built-in chain.
func (j jump) insertLine(serviceProxyName string) string {
	spec := j.rule(serviceProxyName)
	spec[3] = `"` + spec[3] + `"`
	return "-I " + j.From + " 1 " + strings.Join(spec, " ")
}

// missingJumps returns the jumps of js from the built-in chains of table
// that its iptables-save output lacks: a jump is there when a rule of its
// built-in chain targets its chain (only the proxier's rules do).
func missingJumps(save []byte, table string, js []jump) []jump {
	var out []jump
	for _, j := range js {
		if j.Table != table {
			continue
		}
		found := false
		for line := range bytes.SplitSeq(save, []byte("\n")) {
			if bytes.HasPrefix(line, []byte("-A "+j.From+" ")) && bytes.HasSuffix(bytes.TrimSpace(line), []byte(" -j "+j.To)) {
				found = true
				break
			}
		}
		if !found {
			out = append(out, j)
		}
	}
	return out
}

// jumps are the rules from the built-in chains to the proxier's (prefix)
// chains: nat PREROUTING and OUTPUT to SERVICES (DNAT), POSTROUTING to
// POSTROUTING (masquerading); filter INPUT and OUTPUT to SERVICES
// (reject, drop) for new connections; filter FORWARD to FORWARD, which
// sends new connections to SERVICES first, then accepts service traffic
// where the FORWARD policy is DROP (one jump: two, each inserted first
// when missing, could end in either order, accepting before rejecting).
func jumps(prefix string) []jump {
	newOnly := []string{"-m", "conntrack", "--ctstate", "NEW"}
	return []jump{
		{Table: "nat", From: "PREROUTING", To: prefix + chainServices},
		{Table: "nat", From: "OUTPUT", To: prefix + chainServices},
		{Table: "nat", From: "POSTROUTING", To: prefix + chainPostrouting},
		{Table: "filter", From: "INPUT", To: prefix + chainServices, Match: newOnly},
		{Table: "filter", From: "FORWARD", To: prefix + chainForward},
		{Table: "filter", From: "OUTPUT", To: prefix + chainServices, Match: newOnly},
	}
}

// formerJumps are the jumps earlier versions inserted and this one does
// not: Cleanup removes them too (filter FORWARD went to SERVICES before
// FORWARD's chain did it).
func formerJumps(prefix string) []jump {
	return []jump{{Table: "filter", From: "FORWARD", To: prefix + chainServices, Match: []string{"-m", "conntrack", "--ctstate", "NEW"}}}
}
