package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/ledger"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// The ledger is the engine's record of what it committed: each allow, each
// authorization it answered for, each forwarded paying call is an entry,
// sealed with the params key and linked into its lane, written before the
// decision's receipt (so that no receipt of a commitment exists without
// its entry) and read back by every process through its Book. A decision
// reads the Book's running totals; it never walks the entries.

// horizon is the longest window any question under p (and its agents'
// policies) reads: what a Book keeps, and how long a spend counts.
func horizon(p *guard.Config) time.Duration {
	h := p.ReservationTTL
	one := func(c *guard.Config) {
		for _, d := range []time.Duration{c.Limit.Window, c.DuplicateWindow, c.ReservationTTL} {
			h = max(h, d)
		}
		if c.TotalLimit != nil {
			h = max(h, c.TotalLimit.Window)
		}
		if v := c.Velocity.PerCounterparty; v != nil {
			h = max(h, v.Window)
		}
		if v := c.Velocity.Total; v != nil {
			h = max(h, v.Window)
		}
	}
	one(p)
	for _, a := range p.Agents {
		one(a)
	}
	return h
}

// catchUp reads what the store's decision chains and ledger hold past what
// this process read, from inside a locked section (or a view), and takes
// it in: first the chains' new commitment receipts, then the ledger (so
// that every receipt read has its entry committed before it: in the same
// transaction, or on files written first), then each receipt is checked
// against the Book. What does not verify becomes the Book's findings, and
// is logged once.
func (e *Engine) catchUp(ctx context.Context, r reviewlog.Reader) error {
	rs, err := e.tail.Next(ctx, r)
	if err != nil {
		return err
	}
	raws, err := r.Ledger().Since(ctx, e.book.Heads())
	if err != nil {
		return fmt.Errorf("read the spend ledger: %w", err)
	}
	found := e.book.Apply(raws)
	found = append(found, e.checkReceipts(rs)...)
	for _, f := range found {
		e.cfg.Logger.Error("spend ledger integrity", "finding", f)
		if e.cfg.OnIntegrity != nil {
			e.cfg.OnIntegrity()
		}
	}
	if n := e.book.Applied(); n-e.pruned.Load() > 4096 {
		e.pruned.Store(n)
		e.book.Prune(e.cfg.Now())
	}
	return nil
}

// checkReceipts holds each commitment receipt signed since the ledger
// started, and still inside the longest window, to the ledger: it must
// have its entry. A receipt without one is a commitment hidden from the
// ledger (its entry removed from a lane's end), and a receipt that started
// the ledger without its genesis entry is a ledger emptied or replaced.
func (e *Engine) checkReceipts(rs []reviewlog.Reserving) []string {
	var out []string
	gen, at, ok := e.book.Genesis()
	since := e.cfg.Now().Add(-e.book.Horizon())
	for _, r := range rs {
		if r.Canonical == reviewlog.CanonicalLedgerGenesis {
			if !ok || gen != r.ID {
				out = append(out, fmt.Sprintf("the decision chain's receipt %s started the spend ledger, but the ledger does not hold that start: the ledger was emptied or replaced", r.ID))
			}
			continue
		}
		if !ok || r.TS.Before(at) || r.TS.Before(since) {
			// Signed before the ledger started (its commitment was carried
			// or has lapsed), or too old to count.
			continue
		}
		if !e.book.Has(r.ID) {
			out = append(out, fmt.Sprintf("the signed receipt %s (%s of caller %q at %s) commits a payment the spend ledger holds no entry of: the entry was removed", r.ID, r.Canonical, clipText(r.Agent), r.TS.UTC().Format(time.RFC3339)))
		}
	}
	for _, f := range out {
		e.book.Finding("%s", f)
	}
	return out
}

// ensureLedger starts the store's ledger once, under the whole store's
// lock: a genesis entry, the commitments an earlier build recorded as
// reservation records that still hold (carried with their own times), and
// a signed receipt of the start in the decision chain.
func (e *Engine) ensureLedger(ctx context.Context) error {
	if _, _, ok := e.book.Genesis(); ok {
		return nil
	}
	// Most often another process started it: read the ledger first.
	if err := e.cfg.Log.Store().View(ctx, func(r reviewlog.Reader) error { return e.catchUp(ctx, r) }); err != nil {
		return err
	}
	if _, _, ok := e.book.Genesis(); ok {
		return nil
	}
	// What an earlier build reserved, read before the lock (the log's
	// reader takes it); only an earlier build writes such records.
	carried, err := e.legacy(ctx, e.cfg.Now())
	if err != nil {
		return err
	}
	var raws []ledger.Raw
	err = e.cfg.Log.StartLedger(ctx, func(tx reviewlog.Tx) (string, error) {
		if err := e.catchUp(ctx, tx.Store); err != nil {
			return "", err
		}
		if _, _, ok := e.book.Genesis(); ok {
			return "", nil
		}
		id, err := newReceiptID()
		if err != nil {
			return "", err
		}
		entries := []ledger.Entry{{Kind: ledger.KindGenesis, At: ledger.FormatTime(tx.At), Receipt: id, Caller: "haia-trace-mcp", Tenant: e.cfg.Chains.Tenant}}
		entries = append(entries, carried...)
		app := tx.Store.LedgerAppender()
		pos, prev := e.book.Next(app.Lane())
		var lines [][]byte
		for i := range entries {
			en := &entries[i]
			en.Lane, en.Seq, en.Prev = pos.Lane, pos.Seq+int64(i), prev
			line, err := en.Seal(e.cfg.ParamsKey)
			if err != nil {
				return "", err
			}
			raws = append(raws, ledger.OwnRaw(ledger.Pos{Lane: pos.Lane, Seq: en.Seq, Off: pos.Off}, line, *en))
			pos.Off += int64(len(line)) + 1
			prev = ledger.Hash(line)
			lines = append(lines, line)
		}
		first, _ := e.book.Next(app.Lane())
		if err := app.Append(ctx, first, lines); err != nil {
			return "", err
		}
		ph, err := noa.ParamsHash(e.cfg.ParamsKey, map[string]any{"ledger": "genesis", "tenant": e.cfg.Chains.Tenant})
		if err != nil {
			return "", err
		}
		// The start is signed into a chain of its own ("ledger-<kid>"),
		// beside the decisions.
		gc := *e.cfg.Chains
		gc.Name = "ledger"
		_, err = gc.Append(ctx, tx.Store, noa.Draft{ID: id, TS: tx.At, Agent: noa.Agent{ID: noa.ContinueAgent, Principal: noa.PrincipalService},
			Action:     noa.Action{ID: "ledger:genesis", Canonical: reviewlog.CanonicalLedgerGenesis, RiskClass: "IRREVERSIBLE", ParamsHash: ph, Reversible: false},
			Governance: noa.Governance{Mode: governanceMode, Verdict: noa.VerdictAllowed}})
		if err != nil {
			return "", err
		}
		return id, nil
	})
	if err != nil {
		return fmt.Errorf("start the spend ledger: %w", err)
	}
	if len(raws) > 0 {
		e.committed(raws...)
		e.cfg.Logger.Info("spend ledger started", "carried", len(raws)-1)
	}
	return nil
}

// legacy is what an earlier build's reservation records still hold, as
// ledger entries of their own times: sealed by this server's key (a
// record that does not verify is not carried, and the old build's checks
// of it no longer apply).
func (e *Engine) legacy(ctx context.Context, now time.Time) ([]ledger.Entry, error) {
	v, err := e.cfg.Log.Reservations(ctx, e.Policy().ReservationTTL)
	if err != nil {
		return nil, fmt.Errorf("read the reservation records of an earlier build: %w", err)
	}
	var out []ledger.Entry
	for _, r := range v.Held {
		if _, sealed, err := e.seals.check(e.cfg.ParamsKey, &r); !sealed || err != nil {
			continue
		}
		if rel, _ := e.released(&r); rel {
			continue
		}
		en := ledger.Entry{Kind: ledger.KindHold, At: r.At, Until: r.Until, Receipt: r.ReceiptID, Caller: r.Caller, Tenant: e.cfg.Chains.Tenant,
			PayTo: r.PayTo, Host: r.Host, Resource: r.Resource, Atomic: r.Atomic, Asset: r.Asset, Open: r.Open, Review: r.ReviewID}
		if r.Open || r.Until == "" {
			en.Kind, en.Open = ledger.KindAuthorization, true
			en.Until = ledger.FormatTime(now.Add(horizon(e.Policy())))
		}
		if _, err := ledger.ParseTime(en.At); err != nil {
			if t, perr := time.Parse(time.RFC3339Nano, en.At); perr == nil {
				en.At = ledger.FormatTime(t)
			}
		}
		if en.Until != "" {
			if _, err := ledger.ParseTime(en.Until); err != nil {
				if t, perr := time.Parse(time.RFC3339Nano, en.Until); perr == nil {
					en.Until = ledger.FormatTime(t)
				}
			}
		}
		out = append(out, en)
	}
	return out, nil
}

// withLedger is h judged with what the Book holds: the commitments the
// Trace does not show yet, as running totals, and the Book's findings as
// reservation problems (nothing is allowed while there are any).
func (e *Engine) withLedger(h guard.History, now time.Time) guard.History {
	since := now.Add(-e.book.Horizon())
	return e.withLedgerPaid(h, now, func() []ledger.Payment { return h.Payments(since) })
}

// withLedgerPaid is withLedger with the Trace's payments since the Book's
// horizon given by the caller (a replay keeps them sorted by time).
func (e *Engine) withLedgerPaid(h guard.History, now time.Time, payments func() []ledger.Payment) guard.History {
	e.book.Match(historyPrint(h), payments)
	h.Reserved = nil
	h.Committed = e.book
	h.ReservationProblems = e.book.Findings()
	return h
}

// historyPrint names one reading of history: the same slice of operations
// (the catalog keeps it while no run changed) prints the same.
func historyPrint(h guard.History) string {
	if len(h.Ops) == 0 {
		return fmt.Sprintf("empty/%d", h.Runs)
	}
	return fmt.Sprintf("%p/%d", &h.Ops[0], len(h.Ops))
}

// newReceiptID is a decision receipt's id, chosen before the receipt is
// sealed so that its ledger entry can name it and be written first.
func newReceiptID() (string, error) {
	var b [13]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("receipt id: %w", err)
	}
	return "rcpt_" + hex.EncodeToString(b[:]), nil
}

// commitment is what an allow commits, as its ledger entry (its place in
// the lane is given when it is appended).
func (e *Engine) commitment(req guard.Request, caller, receiptID string, tx reviewlog.Tx, pol *guard.Config, kind string) (ledger.Entry, error) {
	if req.Atomic == nil || req.AssetErr != nil {
		return ledger.Entry{}, errors.New("an allow whose amount cannot be read cannot be committed")
	}
	en := ledger.Entry{Kind: kind, At: ledger.FormatTime(tx.At), Receipt: receiptID, Caller: caller, Tenant: e.cfg.Chains.Tenant,
		Resource: req.Resource, Atomic: req.Atomic.String(), Asset: req.Asset.Key}
	switch req.Counterparty.Kind {
	case guard.KindAddress:
		en.PayTo = req.Counterparty.Value
	default:
		en.Host, en.PayTo = req.Counterparty.Value, req.PayTo
	}
	if tx.Kind == "used" {
		en.Review = tx.Review.ID
	}
	switch kind {
	case ledger.KindHold:
		en.Until = ledger.FormatTime(tx.At.Add(pol.ReservationTTL))
	case ledger.KindAuthorization:
		en.Open = true
		en.Until = ledger.FormatTime(tx.At.Add(max(horizon(e.Policy()), horizon(pol))))
	case ledger.KindSpend:
		en.Until = ledger.FormatTime(tx.At.Add(max(horizon(e.Policy()), horizon(pol))))
	}
	return en, nil
}

// appendEntry seals en at the end of the section's lane and appends it;
// the Book takes it in once the section commits (committed).
func (e *Engine) appendEntry(ctx context.Context, w reviewlog.Writer, en ledger.Entry) (ledger.Raw, error) {
	app := w.LedgerAppender()
	pos, prev := e.book.Next(app.Lane())
	en.Lane, en.Seq, en.Prev = pos.Lane, pos.Seq, prev
	line, err := en.Seal(e.cfg.ParamsKey)
	if err != nil {
		return ledger.Raw{}, err
	}
	if err := app.Append(ctx, pos, [][]byte{line}); err != nil {
		return ledger.Raw{}, err
	}
	return ledger.OwnRaw(pos, line, en), nil
}

// committed takes in what a section that committed appended.
func (e *Engine) committed(raws ...ledger.Raw) {
	for _, f := range e.book.Apply(raws) {
		e.cfg.Logger.Error("spend ledger integrity", "finding", f)
	}
}

// entryInfo describes a ledger entry as answers and statuses show it.
func (e *Engine) entryInfo(en ledger.Entry) *ReservationInfo {
	r := reviewlog.Reservation{ReceiptID: en.Receipt, Caller: en.Caller, Tenant: en.Tenant, PayTo: en.PayTo, Host: en.Host, Resource: en.Resource,
		Atomic: en.Atomic, Asset: en.Asset, Until: en.Until, Open: en.Open, ReviewID: en.Review}
	if en.Kind == ledger.KindAuthorization {
		// An authorization's hold shows as one that lasts until the Trace
		// shows the payment (its Until is the end of its windows).
		r.Until = ""
	}
	g, err := toGuard(r, en.At)
	if err != nil {
		return nil
	}
	if en.Kind != ledger.KindAuthorization && en.Until != "" {
		g.Until, _ = ledger.ParseTime(en.Until)
	}
	decimals := -1
	if a, ok := e.Policy().Assets.Lookup(en.Asset); ok {
		decimals = a.Decimals
	}
	if en.ValidBefore != "" {
		// The authorization can move money until then; after it, the
		// asset contract says whether it did.
		g.ValidBefore, _ = ledger.ParseTime(en.ValidBefore)
	}
	i := info(g, r, en.At, decimals)
	i.Kind = en.Kind
	i.ValidBefore = en.ValidBefore
	return i
}

// Committed lists what the Book holds that still counts now, as the
// ledger's verified entries say, with every finding.
func (e *Engine) Committed(ctx context.Context) ([]*ReservationInfo, []string, error) {
	if err := e.cfg.Log.Store().View(ctx, func(r reviewlog.Reader) error { return e.catchUp(ctx, r) }); err != nil {
		return nil, nil, err
	}
	hist, err := e.history(ctx)
	if err != nil {
		return nil, nil, err
	}
	now := e.cfg.Now()
	e.withLedger(hist, now)
	var out []*ReservationInfo
	for _, en := range e.book.Live(now) {
		if i := e.entryInfo(en); i != nil {
			out = append(out, i)
		}
	}
	return out, e.book.Findings(), nil
}

// release writes a sealed release of the commitment of receipt in the
// section, for the outcome of its outcome receipt; it says why it was not
// released when it was not.
func (e *Engine) release(ctx context.Context, w reviewlog.Writer, receipt, caller, outcome, outcomeReceipt string, at time.Time) (*ledger.Raw, string, error) {
	if err := e.catchUp(ctx, w); err != nil {
		return nil, "", err
	}
	en, counting, ok := e.book.Get(receipt)
	switch {
	case !ok:
		return nil, "the ledger holds no commitment of this receipt", nil
	case !counting:
		return nil, "", nil
	case en.Caller != caller:
		return nil, "its ledger entry names another caller", nil
	case en.Kind == ledger.KindAuthorization:
		return nil, "it is a signed authorization, which no call's outcome releases", nil
	}
	raw, err := e.appendEntry(ctx, w, ledger.Entry{Kind: ledger.KindRelease, At: ledger.FormatTime(at), Receipt: outcomeReceipt, Caller: caller,
		Tenant: e.cfg.Chains.Tenant, Target: receipt, Outcome: outcome})
	if err != nil {
		return nil, "", err
	}
	return &raw, "", nil
}
