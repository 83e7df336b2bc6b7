package guard

import (
	"errors"
	"fmt"
	"math/big"
	"strings"
)

// DefaultTemplate is the one default template: the template the read tools
// assemble receipts under, and a question is judged under, when none is
// named (see Config.QuestionTemplate for a policy that does not read
// history under it).
const DefaultTemplate = "x402-buyer"

// RawRequest is a check_before_pay question as a caller sends it.
type RawRequest struct {
	Counterparty string `json:"counterparty"`
	Amount       string `json:"amount"`
	Asset        string `json:"asset,omitempty"`
	Template     string `json:"template,omitempty"`
	// Resource is the URL about to be paid for (optional); the
	// duplicate_payment rule compares it with the history's.
	Resource string `json:"resource,omitempty"`
	// PayTo is the payee address of the seller's 402 (optional), beside a
	// host or URL counterparty: the guard then checks both.
	PayTo string `json:"pay_to,omitempty"`
	// SellerResource is the resource a seller's 402 declares, beside the
	// Resource the agent requested (authorize_payment): duplicate_payment
	// compares both with history, which records what sellers declared.
	// It is not an argument of check_before_pay.
	SellerResource string `json:"-"`
	// Offer is what the seller's 402 says about its signed offer
	// (authorize_payment and the proxy; nil otherwise).
	Offer *OfferEvidence `json:"-"`
}

// Request is a parsed question. A counterparty that cannot be read is an
// error (there is nothing to judge); an amount or asset that cannot be read
// is kept, with its error, because SPEC §6 rule 4 turns it into a review.
type Request struct {
	Counterparty Counterparty
	// AmountText and AssetText are the caller's words, kept for the log.
	AmountText string
	AssetText  string
	Template   string
	// Asset is the resolved asset; AssetErr says why there is none.
	Asset    Asset
	AssetErr error
	// Atomic is the amount in atomic units of Asset; AmountErr says why it
	// could not be read.
	Atomic    *big.Int
	AmountErr error
	// Resource is the canonical URL of the resource (CanonicalResource), or
	// "" when the caller named none.
	Resource string
	// PayTo is the canonical payee address the caller named beside a host,
	// or "".
	PayTo string
	// SellerResource is the canonical resource the seller's 402 declares
	// where it differs from Resource, or "": a second key for
	// duplicate_payment, never the question's identity.
	SellerResource string
	// Offer is the seller's signed offer as the payment reader found it.
	Offer *OfferEvidence
}

// ErrRequest marks a request that cannot be judged at all.
var ErrRequest = errors.New("bad request")

// ParseRequest reads a question against the policy's asset registry.
func ParseRequest(raw RawRequest, cfg *Config) (Request, error) {
	cp, err := ParseCounterparty(raw.Counterparty)
	if err != nil {
		return Request{}, fmt.Errorf("%w: counterparty: %w", ErrRequest, err)
	}
	if err := raw.checkText(); err != nil {
		return Request{}, err
	}
	tmpl := raw.Template
	if tmpl == "" {
		tmpl = cfg.QuestionTemplate()
	}
	req := Request{Counterparty: cp, AmountText: raw.Amount, AssetText: raw.Asset, Template: tmpl, Offer: raw.Offer}
	if raw.Resource != "" {
		if req.Resource, err = CanonicalResource(raw.Resource, false); err != nil {
			return Request{}, fmt.Errorf("%w: resource: %w", ErrRequest, err)
		}
	}
	if raw.SellerResource != "" {
		if req.SellerResource, err = CanonicalResource(raw.SellerResource, false); err != nil {
			return Request{}, fmt.Errorf("%w: the resource the seller declares: %w", ErrRequest, err)
		}
		if req.SellerResource == req.Resource {
			req.SellerResource = ""
		}
	}
	if raw.PayTo != "" {
		if req.PayTo, err = PayToAddress(raw.PayTo); err != nil {
			return Request{}, fmt.Errorf("%w: pay_to: %w (pay_to is the payee address of the seller's 402: 0x and 40 hex digits)", ErrRequest, err)
		}
		if cp.Kind == KindAddress {
			if req.PayTo != cp.Value {
				return Request{}, fmt.Errorf("%w: pay_to %s differs from the counterparty %s, which is already an address; pay_to goes beside a host or URL", ErrRequest, req.PayTo, cp.Value)
			}
			req.PayTo = ""
		}
	}
	req.Asset, req.AssetErr = cfg.Assets.Resolve(raw.Asset, cfg.DefaultAsset)
	decimals := maxDecimals
	if req.AssetErr == nil {
		decimals = req.Asset.Decimals
	}
	req.Atomic, req.AmountErr = ParseAmount(raw.Amount, decimals)
	if req.AssetErr != nil {
		req.Atomic = nil // no decimals to read it in
	}
	return req, nil
}

// Question is the identity of a request for the review log: the normalised
// counterparty, the amount in canonical display form (or the caller's text
// when it cannot be read) and the asset key (or the caller's text).
type Question struct {
	Counterparty string `json:"counterparty"`
	Amount       string `json:"amount"`
	Asset        string `json:"asset"`
	Template     string `json:"template,omitempty"`
	// PayTo is the payee address beside a host, or "".
	PayTo string `json:"pay_to,omitempty"`
}

// Question gives the request's identity for idempotency and for the log.
func (r Request) Question() Question {
	q := Question{Counterparty: r.Counterparty.Value, Amount: r.AmountText, Asset: r.AssetText, Template: r.Template, PayTo: r.PayTo}
	if r.AssetErr == nil {
		q.Asset = r.Asset.Key
		if r.Atomic != nil {
			q.Amount = FormatAmount(r.Atomic, r.Asset.Decimals)
		}
	}
	return q
}

// shortErr strips the sentinel prefix so a reason reads as a sentence.
func shortErr(err error) string {
	s := err.Error()
	for _, p := range []string{ErrAmount.Error() + ": ", ErrAsset.Error() + ": "} {
		s = strings.TrimPrefix(s, p)
	}
	return s
}
