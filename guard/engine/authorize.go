package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// RuleAuthorizationSigned is the rule id of the receipt that records a
// signed authorization.
const RuleAuthorizationSigned = "x402_authorization_signed"

// AuthorizationParamsHash is the paramsHash of an authorization's receipt:
// SHA-256 of its 32-byte EIP-712 digest, so anyone holding the signed
// authorization can recompute it, and the receipt names exactly one.
func AuthorizationParamsHash(digest [32]byte) string {
	h := sha256.Sum256(digest[:])
	return "sha256:" + hex.EncodeToString(h[:])
}

// RecordAuthorization signs a receipt for an authorization into the
// decision chain (action x402.authorization.signed, its EIP-712 digest's
// hash as paramsHash, the nonce as action id) and appends the
// authorization's terms to the review log, in one locked section. Until it
// returns without error, the signature must not be given to anyone.
func (e *Engine) RecordAuthorization(ctx context.Context, caller string, a reviewlog.Authorized, digest [32]byte) (reviewlog.Authorized, error) {
	if caller == "" {
		return reviewlog.Authorized{}, errors.New("engine: no caller identity")
	}
	rule := RuleAuthorizationSigned
	out, err := e.cfg.Log.RecordAuthorization(ctx, caller, a, func(tx reviewlog.Tx) (string, error) {
		r, err := e.cfg.Chains.Append(ctx, tx.Store, noa.Draft{
			TS:    e.cfg.Now(),
			Agent: noa.Agent{ID: caller, Principal: noa.PrincipalService},
			Action: noa.Action{ID: "x402-authorization:" + a.Nonce, Canonical: reviewlog.CanonicalAuthorizationSigned,
				RiskClass: "IRREVERSIBLE", ParamsHash: AuthorizationParamsHash(digest), Reversible: false},
			Governance: noa.Governance{Mode: governanceMode, Verdict: noa.VerdictAllowed, RuleID: &rule},
		})
		if err != nil {
			return "", err
		}
		return r.ID, nil
	})
	if err != nil {
		return reviewlog.Authorized{}, e.notRecorded("record the signed authorization", err)
	}
	e.cfg.Logger.Info("authorize_payment", "decision_receipt", out.DecisionReceipt, "receipt_id", out.Receipt, "nonce", out.Nonce, "to", out.To, "value", out.Value, "caller", caller)
	return out, nil
}
