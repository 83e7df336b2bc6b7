package engine

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// RuleAuthorizationSigned is the rule id of the receipt that records a
// signed authorization.
const RuleAuthorizationSigned = "x402_authorization_signed"

// RuleAuthorizationOfferSealed is the rule id of the receipt that records
// a signed authorization together with the seller's offer it accepted
// (reviewlog.OfferSeal): its paramsHash is AuthorizationSealedParamsHash,
// and whoever reads the authorization must find that offer beside it.
const RuleAuthorizationOfferSealed = "x402_authorization_signed_offer_sealed"

// offerSealLabel domain-separates the sealed paramsHash from every other
// hash the server signs.
const offerSealLabel = "haia-trace-mcp/offer-seal/v1\x00"

// AuthorizationSealedParamsHash is the paramsHash of the receipt of an
// authorization recorded with a seller's offer: SHA-256 of the label
// "haia-trace-mcp/offer-seal/v1" and a zero byte, the 32-byte EIP-712
// digest, then the seal's offer digest, format, signer and key, each as a
// 4-byte big-endian length and its UTF-8 bytes.
func AuthorizationSealedParamsHash(digest [32]byte, s reviewlog.OfferSeal) string {
	h := sha256.New()
	h.Write([]byte(offerSealLabel))
	h.Write(digest[:])
	for _, f := range []string{s.Offer, s.Format, s.Signer, s.Key} {
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(f)))
		h.Write(n[:])
		h.Write([]byte(f))
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// SealsOffer says whether an authorization's receipt seals a seller's
// offer (its rule is RuleAuthorizationOfferSealed).
func SealsOffer(rc noa.Receipt) bool {
	return rc.Governance.RuleID != nil && *rc.Governance.RuleID == RuleAuthorizationOfferSealed
}

// AuthorizationReceiptParamsHash is the paramsHash the receipt of a must
// carry: the sealed one when a carries an offer seal.
func AuthorizationReceiptParamsHash(digest [32]byte, a reviewlog.Authorized) string {
	if a.OfferSeal != nil {
		return AuthorizationSealedParamsHash(digest, *a.OfferSeal)
	}
	return AuthorizationParamsHash(digest)
}

// AuthorizationParamsHash is the paramsHash of an authorization's receipt:
// SHA-256 of its 32-byte EIP-712 digest, so anyone holding the signed
// authorization can recompute it, and the receipt names exactly one.
func AuthorizationParamsHash(digest [32]byte) string {
	h := sha256.Sum256(digest[:])
	return "sha256:" + hex.EncodeToString(h[:])
}

// Signing is what an allow's authorization is signed for, inside the
// section that allowed it (AuthorizationTerms.Sign).
type Signing struct {
	// DecisionReceipt is the allow's receipt, which the nonce derives from.
	DecisionReceipt string
	// ReviewID is the review whose approval the allow uses ("" none).
	ReviewID string
}

// SignFunc signs the authorization an allow commits and gives its record
// (its Receipt left for the engine to fill) and its EIP-712 digest. It runs
// holding the allow's locks and must not block for long: the x402 signer
// answers in a fraction of a millisecond.
type SignFunc func(ctx context.Context, s Signing) (reviewlog.Authorized, [32]byte, error)

// signFailed is a SignFunc's failure, told apart from the store's.
type signFailed struct{ err error }

func (e *signFailed) Error() string { return "sign the authorization: " + e.err.Error() }
func (e *signFailed) Unwrap() error { return e.err }

// authorizationDraft is the receipt of a signed authorization: action
// x402.authorization.signed, its EIP-712 digest's hash as paramsHash (the
// sealed one with an offer seal), the nonce as action id.
func authorizationDraft(caller string, a reviewlog.Authorized, digest [32]byte, ts time.Time) noa.Draft {
	rule := RuleAuthorizationSigned
	if a.OfferSeal != nil {
		rule = RuleAuthorizationOfferSealed
	}
	return noa.Draft{
		TS:    ts,
		Agent: noa.Agent{ID: caller, Principal: noa.PrincipalService},
		Action: noa.Action{ID: "x402-authorization:" + a.Nonce, Canonical: reviewlog.CanonicalAuthorizationSigned,
			RiskClass: "IRREVERSIBLE", ParamsHash: AuthorizationReceiptParamsHash(digest, a), Reversible: false},
		Governance: noa.Governance{Mode: governanceMode, Verdict: noa.VerdictAllowed, RuleID: &rule},
	}
}

// RecordAuthorization signs a receipt for an authorization into the
// decision chain (action x402.authorization.signed, its EIP-712 digest's
// hash as paramsHash, the nonce as action id) and appends the
// authorization's terms to the review log, in one locked section. When a
// carries an offer seal, the receipt seals it too (rule
// RuleAuthorizationOfferSealed, paramsHash AuthorizationSealedParamsHash). Until it
// returns without error, the signature must not be given to anyone.
// authorize_payment does not use it: its authorization is recorded in the
// section of the allow it pays (AuthorizationTerms.Sign), the same receipt
// and line without a second section.
func (e *Engine) RecordAuthorization(ctx context.Context, caller string, a reviewlog.Authorized, digest [32]byte) (reviewlog.Authorized, error) {
	if caller == "" {
		return reviewlog.Authorized{}, errors.New("engine: no caller identity")
	}
	out, err := e.cfg.Log.RecordAuthorization(ctx, caller, a, func(tx reviewlog.Tx) (string, error) {
		r, err := e.cfg.Chains.Append(ctx, tx.Store, authorizationDraft(caller, a, digest, e.cfg.Now()))
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
