package payment

import (
	"fmt"
	"strings"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment/x402"
)

// Reading is a seller's 402 read into the engine's question: the entry
// that would be paid, judged as check_before_pay judges a host with its
// pay_to, and what its signed offer says (Question.Offer, never nil).
type Reading struct {
	Question engine.Question
	Accepted Accepted
	// Offer is the seller's signed offer for the entry (nil when the 402
	// carries none).
	Offer *OfferResult

	pr     *x402.PaymentRequired
	choice x402.Choice
}

// read402 is the one reader of a seller's 402 that authorize_payment and
// the proxy (for a mapped tool that passes the 402) share: it parses the
// 402 strictly, picks the first entry the product can pay exactly, holds
// the resource the caller names to the one the 402 declares, names the
// seller's host, and checks the seller's signed offer for that entry —
// signature, signer, terms — before the engine is asked. between, when
// set, runs after the entry is chosen (authorize_payment refuses there
// what cannot settle). Every refusal is a *RefusedError.
func read402(v any, asked string, pol *guard.Config, now time.Time, between func() error) (Reading, error) {
	pr, err := x402.ParseArgument(v)
	if err != nil {
		return Reading{}, refusedf("%s; nothing was asked or signed", err)
	}
	choice, skipped := x402.Select(pr, pol.Assets)
	if len(skipped) == len(pr.Accepts) {
		var b strings.Builder
		for _, s := range skipped {
			fmt.Fprintf(&b, "; accepts[%d]: %s", s.Index, s.Reason)
		}
		return Reading{}, refusedf("no entry of the seller's accepts can be paid exactly%s; nothing was asked or signed", b.String())
	}
	if between != nil {
		if err := between(); err != nil {
			return Reading{}, err
		}
	}
	declared := pr.ResourceURL(choice)
	if asked != "" && declared != "" && !x402.SameResource(asked, declared) {
		return Reading{}, refusedf("the seller's 402 declares the resource %q, not the %q you requested (scheme, host and path must agree, and a declared query must be the one requested); nothing was asked or signed", clip(declared), clip(asked))
	}
	// Duplicates are judged on what the agent requested: the seller's
	// declaration is its own to vary. It stays a second key, since the
	// Trace records what sellers declare.
	resource, sellerResource := asked, declared
	if resource == "" {
		resource, sellerResource = declared, ""
	}
	host, err := sellerHost(asked, declared)
	if err != nil {
		return Reading{}, err
	}
	// The seller's signed offer is checked before the engine is asked:
	// the engine judges what was found (signed_offer), never the bytes.
	oc := x402.CheckOffer(pr, choice, resource, now.Unix(), pol.SellerKeyFor)
	ev, offer := offerEvidence(oc, choice.Index)
	// The question check_before_pay asks with host and pay_to: the seller's
	// host and the payee address are judged together, so that lists,
	// limits and open payments bind a seller that names a new payTo in
	// every 402.
	return Reading{
		Question: engine.Question{Counterparty: host, PayTo: choice.PayTo.Lower(), Amount: choice.Amount(), Asset: choice.Asset.Key,
			Resource: resource, SellerResource: sellerResource, Offer: ev},
		Accepted: Accepted{Index: choice.Index, Network: choice.Network, Asset: choice.Asset.Key, Amount: choice.Amount(),
			Atomic: choice.Atomic.String(), PayTo: choice.PayTo.Hex(), Host: host},
		Offer: offer, pr: pr, choice: choice,
	}, nil
}

// ReadPaid reads the seller's 402 that a paying call hands to the tool that
// pays it (the proxy's mapped tools with a paymentRequired path) into the
// question authorize_payment would ask of it, the signed offer checked the
// same way. v is the 402 as the call carries it: the object's JSON text
// (json.RawMessage) or the base64 PAYMENT-REQUIRED header value; resource
// is the URL the call names ("" when none). The proxy cannot know which
// entry the upstream tool will pay, so a 402 with more than one entry in
// accepts is refused. A refusal is a *RefusedError whose message says what
// is wrong.
func ReadPaid(v any, resource string, pol *guard.Config, now time.Time) (Reading, error) {
	rd, err := read402(v, resource, pol, now, nil)
	if err != nil {
		return Reading{}, err
	}
	if n := len(rd.pr.Accepts); n != 1 {
		return Reading{}, refusedf("the seller's 402 offers %d entries in accepts, and which one the tool pays cannot be known here; a paying call that passes a 402 is judged only on a 402 with one entry; nothing was asked or forwarded", n)
	}
	return rd, nil
}
