package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/haia-trace-mcp/haia-trace-mcp/ledger"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// RuleSettlementRecorded is the rule id of the receipt that records a
// seller's settlement of a signed authorization.
const RuleSettlementRecorded = "x402_settlement_recorded"

// RecordSettlement records the seller's settlement of the authorization
// whose decision receipt is s.DecisionReceipt, in one locked section: a
// receipt in the decision chain (action x402.settlement.recorded, the
// settlement's digest hashed as paramsHash, the nonce in its id), a sealed
// ledger release with outcome settled (the authorization keeps counting as
// spend for its window and no longer as an open payment), and the settled
// line. A second settlement of the nonce is refused.
func (e *Engine) RecordSettlement(ctx context.Context, caller string, s reviewlog.Settled, digest [32]byte) (reviewlog.Settled, error) {
	if caller == "" {
		return reviewlog.Settled{}, errors.New("engine: no caller identity")
	}
	if err := e.ensureLedger(ctx); err != nil {
		return reviewlog.Settled{}, e.notRecorded("start the spend ledger", err)
	}
	rule := RuleSettlementRecorded
	var raw *ledger.Raw
	out, err := e.cfg.Log.RecordSettlement(ctx, caller, s, func(tx reviewlog.Tx) (string, error) {
		raw = nil
		if err := e.catchUp(ctx, tx.Store); err != nil {
			return "", err
		}
		en, counting, ok := e.book.Get(s.DecisionReceipt)
		switch {
		case ok && en.Kind != ledger.KindAuthorization:
			return "", &RefusedError{Message: fmt.Sprintf("receipt %s is not a signed authorization's", s.DecisionReceipt)}
		case ok && en.Caller != caller:
			return "", &RefusedError{Message: "the authorization was signed for another caller"}
		case ok && en.Nonce != "" && !strings.EqualFold(en.Nonce, s.Nonce):
			return "", &RefusedError{Message: fmt.Sprintf("the ledger's authorization of receipt %s has another nonce", s.DecisionReceipt)}
		}
		r, err := e.cfg.Chains.Append(ctx, tx.Store, noa.Draft{
			TS:    tx.At,
			Agent: noa.Agent{ID: caller, Principal: noa.PrincipalService},
			Action: noa.Action{ID: "x402-settlement:" + s.Nonce, Canonical: reviewlog.CanonicalSettlementRecorded,
				RiskClass: "IRREVERSIBLE", ParamsHash: AuthorizationParamsHash(digest), Reversible: false},
			Governance: noa.Governance{Mode: governanceMode, Verdict: noa.VerdictAllowed, RuleID: &rule},
		})
		if err != nil {
			return "", err
		}
		// Only a hold that still counts as open is closed: one the Trace
		// already shows, or one past its window, needs nothing; a
		// settlement that keeps it (HoldKept) closes nothing.
		if ok && counting && en.Open && !s.HoldKept {
			rw, err := e.appendEntry(ctx, tx.Store, ledger.Entry{Kind: ledger.KindRelease, At: ledger.FormatTime(tx.At), Receipt: r.ID, Caller: caller,
				Tenant: e.cfg.Chains.Tenant, Target: s.DecisionReceipt, Outcome: ledger.OutcomeSettled})
			if err != nil {
				return "", err
			}
			raw = &rw
		}
		return r.ID, nil
	})
	if err != nil {
		var refused *RefusedError
		if errors.As(err, &refused) || errors.Is(err, reviewlog.ErrSettled) {
			return reviewlog.Settled{}, err
		}
		return reviewlog.Settled{}, e.notRecorded("record the settlement", err)
	}
	if raw != nil {
		e.committed(*raw)
	}
	e.cfg.Logger.Info("settlement recorded", "source", out.SourceName(), "hold_kept", out.HoldKept, "nonce", out.Nonce, "transaction", out.Transaction, "receipt_id", out.Receipt, "findings", len(out.Findings), "caller", caller)
	return out, nil
}

// Authorization finds the signed authorization of nonce in the review log.
func (e *Engine) Authorization(ctx context.Context, nonce string) (reviewlog.AuthorizedLine, bool, error) {
	all, err := e.cfg.Log.Authorizations(ctx)
	if err != nil {
		return reviewlog.AuthorizedLine{}, false, err
	}
	for _, a := range all {
		if strings.EqualFold(a.Nonce, nonce) {
			return a, true, nil
		}
	}
	return reviewlog.AuthorizedLine{}, false, nil
}

// Authorizations reads every signed authorization of the review log.
func (e *Engine) Authorizations(ctx context.Context) ([]reviewlog.AuthorizedLine, error) {
	return e.cfg.Log.Authorizations(ctx)
}

// Settlements reads every settlement recorded in the review log.
func (e *Engine) Settlements(ctx context.Context) ([]reviewlog.SettledLine, error) {
	return e.cfg.Log.Settlements(ctx)
}

// RecordAmbiguity records a settlement of the Trace bound to no one
// authorization, once per ambiguity (recorded false: the log holds it).
func (e *Engine) RecordAmbiguity(ctx context.Context, a reviewlog.Ambiguity) (bool, error) {
	return e.cfg.Log.RecordAmbiguity(ctx, a)
}
