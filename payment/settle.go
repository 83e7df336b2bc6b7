package payment

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/jcs"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment/x402"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// ReceiptRequest is record_receipt's arguments: the authorization's nonce,
// and the seller's settlement answer (PAYMENT-RESPONSE) and/or its signed
// receipt.
type ReceiptRequest struct {
	Nonce           string
	PaymentResponse any
	Receipt         any
}

// ReceiptResult is record_receipt's answer.
type ReceiptResult struct {
	Nonce       string `json:"nonce"`
	ReceiptID   string `json:"receipt_id"`
	Transaction string `json:"transaction"`
	Network     string `json:"network"`
	Payer       string `json:"payer"`
	// AuthorizationReceipt and DecisionReceipt name the authorization
	// settled and the decision that allowed it.
	AuthorizationReceipt string `json:"authorization_receipt"`
	DecisionReceipt      string `json:"decision_receipt"`
	// SellerReceipt is the seller's signed receipt as checked (nil when
	// none was handed in).
	SellerReceipt *SellerReceipt `json:"seller_receipt,omitempty"`
	// Findings are where the settlement or the receipt disagree with the
	// authorization; they are recorded for a human.
	Findings []string `json:"findings"`
	// Source is where the settlement was taken from: "agent" or "trace"
	// (with Trace naming the event).
	Source string              `json:"source"`
	Trace  *reviewlog.TraceRef `json:"trace,omitempty"`
	// HoldKept: the settlement did not end the hold (one read from the
	// Trace with a finding).
	HoldKept bool `json:"hold_kept,omitempty"`
}

// SellerReceipt is the seller's signed receipt as checked.
type SellerReceipt struct {
	Verified bool                 `json:"verified"`
	Signer   *x402.ArtifactSigner `json:"signer,omitempty"`
	Terms    *x402.ReceiptTerms   `json:"terms,omitempty"`
}

// RecordReceipt reads the seller's settlement and receipt, binds them to
// the caller's authorization of the nonce, checks them against it, and
// records them: the settlement ends the authorization's hold as an open
// payment at once (it keeps counting as spend for its window). A
// disagreement is recorded as a finding, never dropped.
func (a *Authorizer) RecordReceipt(ctx context.Context, caller string, req ReceiptRequest) (ReceiptResult, error) {
	nonce := strings.ToLower(req.Nonce)
	auth, ok, err := a.cfg.Engine.Authorization(ctx, nonce)
	if err != nil {
		return ReceiptResult{}, err
	}
	if !ok || auth.Caller != caller {
		return ReceiptResult{}, refusedf("no authorization signed for you has the nonce %s; nothing was recorded", clip(req.Nonce))
	}
	if req.PaymentResponse == nil {
		return ReceiptResult{}, refusedf("payment_response is required: the seller's PAYMENT-RESPONSE (or X-PAYMENT-RESPONSE) answer, the settlement that ends the hold; nothing was recorded")
	}
	st, err := x402.ParseSettlementArgument(req.PaymentResponse)
	if err != nil {
		return ReceiptResult{}, refusedf("payment_response %s; nothing was recorded", err)
	}
	if !st.Success {
		return ReceiptResult{}, refusedf("the settlement says the payment failed (%s); the authorization keeps counting until its validBefore passes and the chain says it was never used (--chain-rpc); nothing was recorded", orNone(st.ErrorReason))
	}
	rcpt := st.Receipt
	if req.Receipt != nil {
		b, err := artifactBytes(req.Receipt)
		if err != nil {
			return ReceiptResult{}, refusedf("receipt %s; nothing was recorded", err)
		}
		r, err := x402.ParseArtifact(b, false)
		if err != nil {
			return ReceiptResult{}, refusedf("receipt %s; nothing was recorded", err)
		}
		if rcpt != nil && !sameArtifact(*rcpt, r) {
			return ReceiptResult{}, refusedf("receipt differs from the receipt the payment_response carries; hand in one of them; nothing was recorded")
		}
		rcpt = &r
	}
	return a.record(ctx, settleInput{caller: caller, auth: auth, st: st, rcpt: rcpt, source: reviewlog.SourceAgent})
}

// settleInput is one settlement to record, from either source: the agent's
// record_receipt or an event of the Trace.
type settleInput struct {
	caller string
	auth   reviewlog.AuthorizedLine
	st     x402.Settlement
	rcpt   *x402.Artifact
	source string
	trace  *reviewlog.TraceRef
	// findings were found before (the Trace event's terms against the
	// authorization's).
	findings []string
}

// record checks a settlement and its seller's receipt against the
// authorization (and the offer it paid) and records it: the one path both
// sources take. A settlement read from the Trace with any finding keeps the
// hold (HoldKept): the Trace is written by no one who signs.
func (a *Authorizer) record(ctx context.Context, in settleInput) (ReceiptResult, error) {
	auth, st, rcpt, nonce := in.auth, in.st, in.rcpt, strings.ToLower(in.auth.Nonce)
	findings := append([]string(nil), in.findings...)
	network, nerr := guard.NetworkCAIP2(st.Network)
	if nerr != nil || network != auth.Network {
		findings = append(findings, fmt.Sprintf("network: the settlement names %q, the authorization %s", clip(st.Network), auth.Network))
	}
	if !strings.EqualFold(st.Payer, auth.From) {
		findings = append(findings, fmt.Sprintf("payer: the settlement names %s, the authorization was signed by %s", st.Payer, auth.From))
	}
	res := ReceiptResult{Nonce: nonce, Transaction: strings.ToLower(st.Transaction), Network: st.Network, Payer: st.Payer,
		AuthorizationReceipt: auth.Receipt, DecisionReceipt: auth.DecisionReceipt, Source: in.source, Trace: in.trace}
	var signer string
	var artifact json.RawMessage
	if rcpt != nil {
		artifact, _ = json.Marshal(rcpt)
		pol := a.cfg.Engine.Policy().For(in.caller)
		terms, who, err := x402.VerifyReceipt(*rcpt, pol.SellerKeyFor)
		sr := &SellerReceipt{}
		res.SellerReceipt = sr
		if tt, terr := rcpt.ReceiptTerms(); terr == nil {
			sr.Terms = &tt
		}
		if err != nil {
			findings = append(findings, "the seller's receipt does not verify: "+err.Error())
		} else {
			sr.Signer = &who
			signer = who.String()
			findings = append(findings, receiptFindings(terms, who, auth, st, pol)...)
			findings = append(findings, receiptAgainstOffer(terms, who, auth)...)
			sr.Verified = len(findings) == 0
		}
	}
	if len(findings) > 32 {
		findings = append(findings[:31], fmt.Sprintf("and %d findings more", len(findings)-31))
	}
	rec := reviewlog.Settled{Nonce: nonce, AuthorizationReceipt: auth.Receipt, DecisionReceipt: auth.DecisionReceipt,
		Success: true, Transaction: res.Transaction, Network: st.Network, Payer: st.Payer, SellerReceipt: artifact, SellerReceiptSigner: signer,
		Findings: findings, Source: in.source, Trace: in.trace, HoldKept: in.source == reviewlog.SourceTrace && len(findings) > 0}
	if rec.Source == reviewlog.SourceAgent {
		// Records of the agent's settlements name no source, as they did
		// before the Trace was read: their digests stay the same.
		rec.Source = ""
	}
	digest := SettlementDigest(rec)
	rec.Digest = fmt.Sprintf("0x%x", digest)
	out, err := a.cfg.Engine.RecordSettlement(ctx, in.caller, rec, digest)
	if err != nil {
		var refused *engine.RefusedError
		if errors.As(err, &refused) {
			return ReceiptResult{}, refusedf("%s; nothing was recorded", refused.Message)
		}
		if errors.Is(err, reviewlog.ErrSettled) {
			return ReceiptResult{}, refusedf("%s; nothing was recorded", strings.TrimPrefix(err.Error(), reviewlog.ErrSettled.Error()+": "))
		}
		return ReceiptResult{}, err
	}
	res.ReceiptID = out.Receipt
	res.HoldKept = out.HoldKept
	a.trace.gen.Add(1)
	if len(findings) > 0 && a.cfg.Findings != nil {
		a.cfg.Findings(out, auth)
	}
	res.Findings = findings
	if res.Findings == nil {
		res.Findings = []string{}
	}
	return res, nil
}

// SettlementDigest is the SHA-256 of a settlement's canonical form, as
// RecordReceipt computes it: what the settlement's receipt stands for.
func SettlementDigest(s reviewlog.Settled) [32]byte {
	return sha256.Sum256(settlementBody(s))
}

// settlementBody is the canonical (JCS) form of what a settlement records.
// A settlement read from the Trace adds its source, the event it was read
// from and whether it kept the hold; the agent's keep the form they had.
func settlementBody(s reviewlog.Settled) []byte {
	m := map[string]any{"nonce": s.Nonce, "transaction": s.Transaction, "network": s.Network, "payer": s.Payer, "success": true,
		"authorization_receipt": s.AuthorizationReceipt, "decision_receipt": s.DecisionReceipt, "findings": s.Findings}
	if s.Findings == nil {
		m["findings"] = []string{}
	}
	if len(s.SellerReceipt) > 0 {
		m["seller_receipt"] = s.SellerReceipt
	}
	if s.Source != "" {
		m["source"] = s.Source
		m["trace"] = s.Trace
		m["hold_kept"] = s.HoldKept
	}
	b, _ := json.Marshal(m)
	c, err := jcs.Canonicalize(b)
	if err != nil {
		return b
	}
	return c
}

// receiptFindings compares a verified receipt with the authorization and
// the settlement, and judges its signer as an offer's is judged.
func receiptFindings(t x402.ReceiptTerms, who x402.ArtifactSigner, auth reviewlog.AuthorizedLine, st x402.Settlement, pol *guard.Config) []string {
	var out []string
	if !strings.EqualFold(t.Payer, auth.From) {
		out = append(out, fmt.Sprintf("payer: the seller's receipt names %q, the authorization was signed by %s", clip(t.Payer), auth.From))
	}
	if t.Network != auth.Network {
		out = append(out, fmt.Sprintf("network: the seller's receipt names %q, the authorization %s", clip(t.Network), auth.Network))
	}
	if auth.Resource != "" && !x402.SameResource(auth.Resource, t.ResourceURL) {
		out = append(out, fmt.Sprintf("resourceUrl: the seller's receipt is for %q, the authorization paid for %q", clip(t.ResourceURL), clip(auth.Resource)))
	}
	if t.Transaction != "" && !strings.EqualFold(t.Transaction, st.Transaction) {
		out = append(out, fmt.Sprintf("transaction: the seller's receipt names %s, the settlement %s", clip(t.Transaction), st.Transaction))
	}
	ev := guard.OfferEvidence{Carried: true, Signer: who.String(), SignerKID: who.KID, SignerThumbprint: who.Thumbprint}
	if who.Address != "" {
		ev.SignerAddress = strings.ToLower(who.Address)
	}
	host := ""
	if cp, err := guard.ParseCounterparty(auth.Resource); err == nil && cp.Kind == guard.KindHost {
		host = cp.Value
	}
	if !pol.TrustsSigner(guard.Counterparty{Kind: guard.KindHost, Value: host}, strings.ToLower(auth.To), ev) {
		out = append(out, fmt.Sprintf("signer: the seller's receipt is signed by %s, which is neither the payee nor a key the policy's sellerKeys name for %s", who.String(), orNone(host)))
	}
	return out
}

// receiptAgainstOffer compares a verified receipt with the seller's signed
// offer the authorization paid (when the 402 carried one): the receipt must
// be for the network and the resource the seller signed it offered, and be
// signed by the identity that signed the offer. The offer names no payer
// and no transaction; those are held to the authorization and the
// settlement. An offer recorded with the authorization that no longer reads
// is itself a finding: the record was altered.
func receiptAgainstOffer(t x402.ReceiptTerms, who x402.ArtifactSigner, auth reviewlog.AuthorizedLine) []string {
	if len(auth.Offer) == 0 {
		return nil
	}
	art, err := x402.ParseArtifact(auth.Offer, true)
	var ot x402.OfferTerms
	if err == nil {
		ot, err = art.OfferTerms()
	}
	if err != nil {
		return []string{"offer: the seller's signed offer recorded with the authorization cannot be read to compare the receipt with it: " + clip(err.Error())}
	}
	var out []string
	if on, err := guard.NetworkCAIP2(ot.Network); err != nil || on != t.Network {
		out = append(out, fmt.Sprintf("network: the seller's receipt names %q, its signed offer %q", clip(t.Network), clip(ot.Network)))
	}
	if !x402.SameResource(t.ResourceURL, ot.ResourceURL) {
		out = append(out, fmt.Sprintf("resourceUrl: the seller's receipt is for %q, its signed offer for %q", clip(t.ResourceURL), clip(ot.ResourceURL)))
	}
	if auth.OfferSigner != "" && who.String() != auth.OfferSigner {
		out = append(out, fmt.Sprintf("signer: the seller's receipt is signed by %s, its signed offer by %s", who.String(), clip(auth.OfferSigner)))
	}
	return out
}

func artifactBytes(v any) ([]byte, error) {
	switch x := v.(type) {
	case string:
		return []byte(x), nil
	case json.RawMessage:
		return x, nil
	case map[string]any:
		return json.Marshal(x)
	}
	return nil, fmt.Errorf("must be the seller's signed receipt object, not a %T", v)
}

func sameArtifact(a, b x402.Artifact) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

func orNone(s string) string {
	if s == "" {
		return "no reason given"
	}
	return clip(s)
}
