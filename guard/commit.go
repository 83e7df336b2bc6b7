package guard

import (
	"fmt"
	"math/big"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/ledger"
)

// Committed is what the guard's spend ledger holds that the Trace does not
// show yet (an allow's hold, an authorization signed, a forwarded paying
// call), summed by scope: the ledger's ledger.Book. Decide reads it as
// running totals, so a decision costs the same with thousands of
// commitments as with none.
type Committed interface {
	// Tally sums the commitments of a scope (ledger.Scope*) made at or
	// after from that still count at now; refs bounds the receipts named.
	Tally(scope, asset string, from, now time.Time, refs int) ledger.Tally
	// Seen says whether any commitment ever named scope (ledger.ScopePayTo
	// + address, ledger.ScopeHost + host), whether it still counts or not.
	Seen(scope string) bool
}

// CommitRun is the run id a commitment of the spend ledger carries as
// evidence (its operation id is the receipt that committed it): an amount
// held, not a run of the Trace.
const CommitRun = "ledger"

const commitRun = CommitRun

// tallied is one scope's commitments as a rule reads them.
type tallied struct {
	n, open, other int
	atomic         *big.Int
	refs, openRefs []Ref
}

func fromTally(t ledger.Tally) tallied {
	out := tallied{n: t.Count, open: t.Open, other: t.Other, atomic: t.Atomic}
	if out.atomic == nil {
		out.atomic = new(big.Int)
	}
	for _, r := range t.Refs {
		out.refs = append(out.refs, Ref{RunID: commitRun, OperationID: r})
	}
	for _, r := range t.OpenRefs {
		out.openRefs = append(out.openRefs, Ref{RunID: commitRun, OperationID: r})
	}
	return out
}

// plus and minus combine scopes (inclusion and exclusion): counts and sums
// exactly, references as far as they go.
func (a tallied) plus(b tallied) tallied {
	return tallied{n: a.n + b.n, open: a.open + b.open, other: a.other + b.other, atomic: new(big.Int).Add(a.atomic, b.atomic),
		refs: refUnion(a.refs, b.refs), openRefs: refUnion(a.openRefs, b.openRefs)}
}

func (a tallied) minus(b tallied) tallied {
	return tallied{n: a.n - b.n, open: a.open - b.open, other: a.other - b.other, atomic: new(big.Int).Sub(a.atomic, b.atomic),
		refs: without(a.refs, b.refs), openRefs: without(a.openRefs, b.openRefs)}
}

func refUnion(a, b []Ref) []Ref {
	seen := map[Ref]bool{}
	var out []Ref
	for _, r := range append(append([]Ref(nil), a...), b...) {
		if !seen[r] {
			seen[r] = true
			out = append(out, r)
		}
	}
	return out
}

func without(a, b []Ref) []Ref {
	drop := map[Ref]bool{}
	for _, r := range b {
		drop[r] = true
	}
	var out []Ref
	for _, r := range a {
		if !drop[r] {
			out = append(out, r)
		}
	}
	return out
}

// refsWith is the evidence of operations and of commitments together,
// within the bound one reason carries.
func refsWith(ops []Op, t []Ref) []Ref {
	out := refs(ops)
	for _, r := range t {
		if len(out) >= maxEvidence {
			break
		}
		out = append(out, r)
	}
	return out
}

// commitView reads the ledger for one question.
type commitView struct {
	c     Committed
	asset string
	now   time.Time
	// cp and pay are the question's counterparty and, beside a host, its
	// pay_to; kind is what attribution is judged by.
	cp   Counterparty
	pay  *Counterparty
	kind CounterpartyKind
}

func (v commitView) tally(scope string, from time.Time) tallied {
	if v.c == nil {
		return tallied{atomic: new(big.Int)}
	}
	return fromTally(v.c.Tally(scope, v.asset, from, v.now, maxEvidence))
}

// ours is the commitments with the question's counterparty: to its host or
// address, and to its pay_to beside a host (each counted once).
func (v commitView) ours(from time.Time) tallied {
	switch {
	case v.cp.Kind == KindAddress:
		return v.tally(ledger.ScopePayTo+v.cp.Value, from)
	case v.pay != nil:
		return v.tally(ledger.ScopeHost+v.cp.Value, from).plus(v.tally(ledger.ScopePayTo+v.pay.Value, from)).
			minus(v.tally(ledger.ScopeHostPayTo+v.cp.Value+" "+v.pay.Value, from))
	}
	return v.tally(ledger.ScopeHost+v.cp.Value, from)
}

// unattributable is the commitments that cannot be told to be, or not to
// be, with the counterparty: for a question judged by address, those that
// name no payee address (and not its host); for a host alone, those that
// name no host.
func (v commitView) unattributable(from time.Time) tallied {
	if v.kind == KindHost {
		return v.tally(ledger.ScopeNoHost, from)
	}
	un := v.tally(ledger.ScopeNoPayTo, from)
	if v.cp.Kind == KindHost {
		un = un.minus(v.tally(ledger.ScopeHostNoPayTo+v.cp.Value, from))
	}
	return un
}

// elsewhereOpen is, for a host alone, the open commitments declared for
// other hosts.
func (v commitView) elsewhereOpen() tallied {
	return v.tally(ledger.ScopeAnyHost, time.Time{}).minus(v.tally(ledger.ScopeHost+v.cp.Value, time.Time{}))
}

// unattributableFrom is unattributable from a time, or nothing without a
// ledger.
func (v commitView) unattributableFrom(h History, from time.Time) tallied {
	if h.Committed == nil {
		return v.tally("", from)
	}
	return v.unattributable(from)
}

// heldNote says how many of a count are held by earlier allows.
func heldNote(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(", %d of them held by earlier allows the Trace does not show paid yet", n)
}

// spentAndHeld says what was paid and what is held, apart.
func spentAndHeld(cfg *Config, total *big.Int, held tallied) string {
	if held.n == 0 {
		return cfg.FormatDefault(total) + " already paid"
	}
	paid := new(big.Int).Sub(total, held.atomic)
	return fmt.Sprintf("%s (%s paid, %s held by %s the Trace does not show paid yet)", cfg.FormatDefault(total), cfg.FormatDefault(paid), cfg.FormatDefault(held.atomic), count(held.n, "earlier allow", "earlier allows"))
}

func joinWhy(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}
