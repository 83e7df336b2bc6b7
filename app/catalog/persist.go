package catalog

import (
	"fmt"
	"math/big"
	"os"
	"runtime/debug"
	"syscall"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/runindex"
)

// buildVersion names the code that computed the summaries a saved index
// holds: the commit it was built from, or, for a build of changed or
// unknown sources, the executable file's identity (device, inode, size,
// modification time: a new build is a new file). Hashing the executable
// instead took 1.3 s of a loaded machine's start. A saved index of another
// build is read again from the runs.
func buildVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		rev, modified := "", true
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value != "false"
			}
		}
		if rev != "" && !modified {
			return "rev " + rev
		}
	}
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	st, err := os.Stat(exe)
	if err != nil {
		return ""
	}
	id := ""
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		id = fmt.Sprintf("%d:%d:", sys.Dev, sys.Ino)
	}
	return fmt.Sprintf("exe %s%d:%d", id, st.Size(), st.ModTime().UnixNano())
}

// Flags of a summary's booleans, as saved.
const (
	flagRolesKnown = 1 << iota
	flagPaid
	flagOutcome
	flagFaulted
	flagSettlementUnconfirmed
	flagOpen
	flagSpent
	flagReserved
	flagMoney
	flagAtomic
)

// encodeSummary writes one summary for the saved index.
func encodeSummary(e *runindex.Enc, s *Summary) {
	g := &s.Guard
	var fl uint64
	for bit, on := range [...]bool{g.RolesKnown, g.PaidConfirmed, g.OutcomeConfirmed, g.Faulted, g.SettlementUnconfirmed,
		g.Open, g.Spent, g.Reserved, g.Money != nil, g.Money != nil && g.Money.Atomic != nil} {
		if on {
			fl |= 1 << bit
		}
	}
	e.Uint(fl)
	e.Str(s.OperationID)
	e.Str(s.Template)
	e.Str(s.Completeness)
	e.Uint(uint64(len(s.MissingStages)))
	for _, m := range s.MissingStages {
		e.Str(m)
	}
	e.Int(int64(s.ExceptionCount))
	e.Str(s.LastEventAt)
	e.Str(g.RunID)
	e.Str(g.OperationID)
	e.Str(g.Template)
	e.Str(g.Completeness)
	e.Str(g.Unattributable)
	e.Str(g.FirstEventAt)
	e.Str(g.LastEventAt)
	if m := g.Money; m != nil {
		e.Uint(uint64(len(m.PayTos)))
		e.Uint(uint64(len(m.Hosts)))
		e.Uint(uint64(len(m.Resources)))
		for _, list := range [][]string{m.PayTos, m.Hosts, m.Resources} {
			for _, v := range list {
				e.Str(v)
			}
		}
		if m.Atomic != nil {
			e.Str(m.Atomic.String())
		}
		e.Str(m.Asset)
		e.Str(m.Problem)
	}
}

// moneyBox is a decoded Money with room for its lists when they are short,
// in one allocation.
type moneyBox struct {
	m    guard.Money
	room [3]string
}

// decodeSummary reads what encodeSummary wrote.
func decodeSummary(runID string, d *runindex.Dec) Summary {
	fl := d.Uint()
	s := Summary{RunID: runID, OperationID: d.Str(), Template: d.Str(), Completeness: d.Str()}
	s.MissingStages = make([]string, d.Len(1<<16))
	for i := range s.MissingStages {
		s.MissingStages[i] = d.Str()
	}
	s.ExceptionCount = int(d.Int())
	s.LastEventAt = d.Str()
	g := &s.Guard
	g.RunID, g.OperationID, g.Template, g.Completeness = d.Str(), d.Str(), d.Str(), d.Str()
	g.Unattributable, g.FirstEventAt, g.LastEventAt = d.Str(), d.Str(), d.Str()
	g.RolesKnown, g.PaidConfirmed, g.OutcomeConfirmed = fl&flagRolesKnown != 0, fl&flagPaid != 0, fl&flagOutcome != 0
	g.Faulted, g.SettlementUnconfirmed, g.Open = fl&flagFaulted != 0, fl&flagSettlementUnconfirmed != 0, fl&flagOpen != 0
	g.Spent, g.Reserved = fl&flagSpent != 0, fl&flagReserved != 0
	if fl&flagMoney != 0 {
		box := &moneyBox{}
		m := &box.m
		np, nh, nr := d.Len(1<<16), d.Len(1<<16), d.Len(1<<16)
		all := box.room[:]
		if np+nh+nr > len(all) {
			all = make([]string, np+nh+nr)
		}
		for i := range np + nh + nr {
			all[i] = d.Str()
		}
		if np > 0 {
			m.PayTos = all[:np:np]
		}
		if nh > 0 {
			m.Hosts = all[np : np+nh : np+nh]
		}
		if nr > 0 {
			m.Resources = all[np+nh : np+nh+nr : np+nh+nr]
		}
		if fl&flagAtomic != 0 {
			// Amounts repeat: one value per run for each (never changed:
			// the guard adds them into new values).
			text := d.Str()
			if a, ok := d.Memo[text].(*big.Int); ok {
				m.Atomic = a
			} else if a, ok := new(big.Int).SetString(text, 10); ok {
				d.Memo[text] = a
				m.Atomic = a
			} else {
				d.Fail("an amount that is not a number")
			}
		}
		m.Asset, m.Problem = d.Str(), d.Str()
		g.Money = m
	}
	// As summarize does: the times are not saved, they are parsed again.
	s.Guard = guard.CacheTimes(s.Guard)
	return s
}
