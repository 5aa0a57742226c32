//go:build linux

package nft

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables"
)

// DefaultCheckPeriod is how often `to-local to-nft` checks its table
// (Config.CheckPeriod).
const DefaultCheckPeriod = 10 * time.Second

// checkChains is the number of service and endpoint chains one check
// counts the rules of, in turn: at 10,000 services (some 40,000 chains),
// each is looked at every 100 minutes with a 10-second period; the fixed
// chains, which a flush of the table or of the ruleset empties or removes
// first, are looked at every time.
const checkChains = 64

// Check looks for changes made to the tables behind the applier's back,
// since its last transaction: a table gone (nft delete table, nft flush
// ruleset), a fixed chain (base, lookup, reject, masquerading, …: the
// applier's fixed) gone or with another number of rules than the last
// transaction writing it gave it
// (nft flush table empties them all), or one of the regular chains given
// (by family and name) gone or with another number of rules than want. It returns what it
// found changed ("" when nothing), and an error when it could not look.
// Elements of maps and sets are not checked.
func (a *applier) Check(want map[chainKey]int) (string, error) {
	conn, err := a.readConn()
	if err != nil {
		return "", err
	}
	drift, err := a.check(conn, want)
	if err != nil {
		a.Close() // nothing half-read stays in the connection
	}
	return drift, err
}

func (a *applier) check(conn *nftables.Conn, want map[chainKey]int) (string, error) {
	for _, tb := range a.tables {
		tables, err := conn.ListTablesOfFamily(tb.Family)
		if err != nil {
			return "", fmt.Errorf("list tables: %w", err)
		}
		if !slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == tb.Name }) {
			return fmt.Sprintf("table %s %s is gone", tableFamily(tb).info().nft, tb.Name), nil
		}
	}
	for _, chains := range []map[chainKey]int{a.fixed, want} {
		for _, k := range slices.SortedFunc(maps.Keys(chains), compareChainKeys) {
			// The kernel lists no rule for a chain that is gone.
			tb := a.tables[k.family]
			rules, err := conn.GetRules(tb, &nftables.Chain{Name: k.name, Table: tb})
			if err != nil {
				return "", fmt.Errorf("list the rules of chain %s %s: %w", k.family.info().nft, k.name, err)
			}
			switch n := len(rules); {
			case n == 0:
				return fmt.Sprintf("chain %s of table %s was flushed or deleted (no rules instead of %d)", k.name, k.family.info().nft, chains[k]), nil
			case n != chains[k]:
				return fmt.Sprintf("chain %s of table %s has %d rules instead of %d", k.name, k.family.info().nft, n, chains[k]), nil
			}
		}
	}
	return "", nil
}

// compareChainKeys orders chains by family, then name.
func compareChainKeys(a, b chainKey) int {
	if a.family != b.family {
		return int(a.family) - int(b.family)
	}
	return strings.Compare(a.name, b.name)
}

// check checks the table once, between rounds, and rewrites it whole when
// it changed behind the sink's back or when the last full transaction
// (kpng's, or one of the check's) failed.
func (s *Sink) check() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.applied || s.inRound || s.ctx.Err() != nil {
		return // nothing applied yet (kpng's Syncs come first), or a round's Sync is due
	}
	why := ""
	if s.needFull {
		why = "the last full sync failed"
	} else {
		drift, err := s.applier.Check(s.nextChecked())
		if err != nil {
			s.logger.Error(err, "Cannot check the nftables table", "table", s.table)
			return
		}
		if drift == "" {
			return
		}
		s.logger.Info("The nftables table was changed behind kpng's back: rewriting it", "table", s.table, "change", drift)
		why = drift
	}
	s.needFull = true
	if err := s.sync(why); err != nil {
		s.logger.Error(err, "Cannot rewrite the nftables table: tried again at the next check", "table", s.table, "because", why)
	}
}

// nextChecked returns the next checkChains regular chains to check, in
// turn, with their numbers of rules.
func (s *Sink) nextChecked() map[chainKey]int {
	want := map[chainKey]int{}
	for range checkChains {
		if s.checkPos >= len(s.checkOrder) {
			s.checkOrder, s.checkPos = s.tracker.ChainNames(), 0
			if len(s.checkOrder) == 0 {
				break
			}
		}
		name := s.checkOrder[s.checkPos]
		s.checkPos++
		if k, n, ok := s.tracker.RuleCount(name); ok {
			want[k] = n
		}
		if len(want) >= len(s.checkOrder) {
			break
		}
	}
	return want
}
