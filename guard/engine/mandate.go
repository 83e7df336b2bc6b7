package engine

import (
	"context"
	"fmt"
	"math/big"
	"strings"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/mandate"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// RuleMandate names the reason of an allow a mandate gave.
const RuleMandate = "mandate"

// DefaultTenant is the tenant a store's records are for when the server
// names none (the --tenant flag's default).
const DefaultTenant = "haia-trace-mcp"

// mandateTenant is the tenant whose mandates this engine honours.
func (e *Engine) mandateTenant() string {
	if t := e.cfg.Chains.Tenant; t != "" {
		return t
	}
	return DefaultTenant
}

// amountOnly says whether dec is a review that only an amount rule asks
// for: every reason but the history line is review_above. A block, a
// list, a limit, velocity, a duplicate, an open payment, a history that
// cannot be read or attributed, what the ledger cannot verify — any other
// reason keeps the review.
func amountOnly(dec guard.Decision) bool {
	if dec.Decision != guard.Review || len(dec.Reasons) < 2 {
		return false
	}
	for _, r := range dec.Reasons[:len(dec.Reasons)-1] {
		if r.Rule != guard.RuleReviewAbove {
			return false
		}
	}
	return true
}

// mandateUse is a mandate an allow is given under, with what is left of
// it after the allow.
type mandateUse struct {
	m     *mandate.Mandate
	left  *big.Int
	count int // -1: no count
}

// Mandates reads the store's mandate records as the engine trusts them.
func (e *Engine) Mandates(ctx context.Context, r reviewlog.Reader) (mandate.Set, error) {
	lines, err := r.Mandates(ctx)
	if err != nil {
		return mandate.Set{}, fmt.Errorf("read the mandate records: %w", err)
	}
	trust, err := e.cfg.Log.MandateTrust()
	if err != nil {
		return mandate.Set{}, err
	}
	set := mandate.Read(lines, e.mandateTenant(), trust, &e.mandateSigs)
	// The records only grow: fewer than this process read before is a
	// record removed (a revocation, most likely).
	for {
		seen := e.mandateLines.Load()
		if int64(len(lines)) < seen {
			set.Findings = append(set.Findings, fmt.Sprintf("the store holds %d mandate records, fewer than the %d this process read before: records were removed", len(lines), seen))
			break
		}
		if e.mandateLines.CompareAndSwap(seen, int64(len(lines))) {
			break
		}
	}
	return set, nil
}

// MandateSpent is what the spend ledger charged to a mandate.
func (e *Engine) MandateSpent(id string) mandate.Spent {
	u := e.book.Mandate(id)
	return mandate.Spent{Count: u.Count, Atomic: u.Atomic}
}

// fitMandate finds a live mandate that covers req for caller, from inside
// the decision's section (w, the Book caught up): the first to expire of
// those that do. When none does, why says what the mandates of this payee
// lack ("" when it has none).
func (e *Engine) fitMandate(ctx context.Context, w reviewlog.Reader, req guard.Request, caller string, pol *guard.Config, now time.Time) (*mandateUse, string) {
	use := mandate.Use{Tenant: e.mandateTenant(), Caller: caller, Atomic: req.Atomic, At: now}
	switch req.Counterparty.Kind {
	case guard.KindAddress:
		use.PayTo = req.Counterparty.Value
	case guard.KindHost:
		use.Host, use.PayTo = req.Counterparty.Value, req.PayTo
	}
	if use.PayTo == "" || req.AssetErr != nil || req.AmountErr != nil || req.Atomic == nil {
		return nil, ""
	}
	use.Asset = req.Asset.Key
	set, err := e.Mandates(ctx, w)
	if err != nil {
		e.cfg.Logger.Error("mandates not read; none is honoured", "err", err)
		return nil, "the mandate records cannot be read, so none is honoured"
	}
	if len(set.Findings) > 0 {
		// Which mandates stand cannot be known: a grant edited is no
		// longer this payee's, a revocation removed stands no more.
		e.mandateFindings(set.Findings)
		return nil, fmt.Sprintf("the mandate records do not verify (%s), so no mandate is honoured", set.Findings[0])
	}
	var why []string
	for _, m := range set.Sorted() {
		if !strings.EqualFold(m.Grant.PayTo, use.PayTo) {
			continue
		}
		spent := e.MandateSpent(m.Grant.ID)
		if r := m.Refuses(use, spent); r != "" {
			why = append(why, fmt.Sprintf("mandate %s does not cover it (%s)", m.Grant.ID, r))
			continue
		}
		// The two-person rule as the policy now says it: a mandate up to
		// an amount past a quorum threshold needs as many signatures.
		if need := pol.ApprovalsFor(m.Grant.Max(), m.Grant.Asset == pol.DefaultAsset.Key); len(m.Signers) < need {
			why = append(why, fmt.Sprintf("mandate %s does not cover it (signed by %d of the %d reviewers the quorum asks for a mandate up to %s)",
				m.Grant.ID, len(m.Signers), need, displayAmount(m.Grant.Max(), pol)))
			continue
		}
		after := mandate.Spent{Count: spent.Count + 1, Atomic: new(big.Int).Add(spent.Atomic, req.Atomic)}
		left, count := m.Left(after)
		return &mandateUse{m: m, left: left, count: count}, ""
	}
	return nil, strings.Join(why, "; ")
}

// mandateFindings logs what of the mandate records did not verify.
func (e *Engine) mandateFindings(fs []string) {
	for _, f := range fs {
		e.cfg.Logger.Error("mandate records integrity", "finding", f)
		if e.cfg.OnIntegrity != nil {
			e.cfg.OnIntegrity()
		}
	}
}

// withMandate turns a review only an amount rule asked for into the
// allow mu gives; the history line stays last.
func withMandate(dec *guard.Decision, mu *mandateUse, pol *guard.Config) {
	money := func(a *big.Int) string { return displayAmount(a, pol) }
	g := &mu.m.Grant
	left := money(mu.left) + " left"
	if mu.count >= 0 {
		left = money(mu.left) + " and " + plural(mu.count, "payment", "payments") + " left"
	}
	detail := fmt.Sprintf("mandate %s: %s after this one (signed by %s; up to %s a payment to %s", g.ID, left, strings.Join(mu.m.Signers, " and "), money(g.Max()), g.PayTo)
	if g.Host != "" {
		detail += " for " + g.Host
	}
	if g.Agent != "" {
		detail += " by " + g.Agent
	}
	detail += ", until " + g.Expires + ")"
	hist := dec.Reasons[len(dec.Reasons)-1]
	dec.Decision = guard.Allow
	dec.Reasons = []guard.Reason{{Rule: RuleMandate, Detail: detail}, hist}
}

// notCovered adds to the amount rule's reason why the payee's mandates
// do not cover the question.
func notCovered(dec *guard.Decision, why string) {
	for i := range dec.Reasons {
		if dec.Reasons[i].Rule == guard.RuleReviewAbove {
			dec.Reasons[i].Detail += "; " + why
			return
		}
	}
}

// displayAmount writes atomic units of the policy's default asset as a
// person reads them ("3.00 USDC").
func displayAmount(a *big.Int, pol *guard.Config) string {
	return guard.FormatDisplay(a, pol.DefaultAsset.Decimals) + " " + pol.DefaultAsset.Symbol
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// ReadMandates reads the mandate records of log's store as the log's
// trusted reviewers make them stand for tenant ("" is DefaultTenant): for
// a command that holds no engine (mandate list, show, audit).
func ReadMandates(ctx context.Context, log *reviewlog.Log, tenant string) (mandate.Set, error) {
	if tenant == "" {
		tenant = DefaultTenant
	}
	trust, err := log.MandateTrust()
	if err != nil {
		return mandate.Set{}, err
	}
	var set mandate.Set
	err = log.Store().View(ctx, func(r reviewlog.Reader) error {
		lines, err := r.Mandates(ctx)
		if err != nil {
			return fmt.Errorf("read the mandate records: %w", err)
		}
		set = mandate.Read(lines, tenant, trust, nil)
		return nil
	})
	return set, err
}

// MandatesNow reads the mandate records as the next question would, and
// catches the spend ledger up, so that MandateSpent says what each one
// has paid.
func (e *Engine) MandatesNow(ctx context.Context) (mandate.Set, error) {
	var set mandate.Set
	err := e.cfg.Log.Store().View(ctx, func(r reviewlog.Reader) error {
		if err := e.catchUp(ctx, r); err != nil {
			return err
		}
		var err error
		set, err = e.Mandates(ctx, r)
		return err
	})
	return set, err
}
