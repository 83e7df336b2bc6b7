package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/strictjson"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment"
)

func (s *Server) paymentTool() toolDef {
	return toolDef{
		name:  "authorize_payment",
		title: "Authorize an x402 payment",
		description: "Pay a seller's x402 402 answer through the guard: pass the PaymentRequired you received (object, or the base64 PAYMENT-REQUIRED header). " +
			"The guard asks the same question check_before_pay asks (the seller's host and its pay_to together, amount, asset, resource) and signs an EIP-3009 authorization only on allow; " +
			"send payment.header as the header payment.header_name and retry the request. review: no signature, a human decides (poll get_review_status, then call again " +
			"with the same 402 to get the one signature the approval allows). block: no signature, ever. " +
			"When the 402 carries the seller's signed offers (extensions[\"offer-receipt\"], EIP-712 or JWS), the offer for the entry it would pay is checked before the guard is asked: " +
			"its signature, its signer (the payTo, or a key the policy's sellerKeys name; keys are never fetched), and that its terms equal the entry's payee, amount, asset, network and resource. " +
			"A mismatch, a bad signature or an untrusted signer is review, with a signed_offer reason naming the field; so is a 402 without signed offers from a seller the policy's requireSignedOffers names. " +
			"The answer's offer shows the offer, its terms and its signer.",
		readOnly: false, idempotent: false,
		handler: s.authorizePayment,
	}
}

// paymentArgs is the shape authorize_payment's arguments are read into
// exactly: each name once, spelled exactly, at every depth of the 402.
type paymentArgs struct {
	PaymentRequired json.RawMessage `json:"payment_required"`
	Resource        json.RawMessage `json:"resource"`
}

// exactPaymentArgs reads the wire bytes of authorize_payment's arguments
// as exactly as the review log is read (internal/strictjson): a member
// named twice in any object, or a name of these arguments spelled in
// another case, is refused, where a decoder would keep one of them. It
// returns the seller's 402 as its own bytes when it was sent as an object,
// so that the 402 reader sees what the agent sent, not a re-encoding of a
// decoded map; nil when it was sent otherwise. A name no argument has is
// left to newArgs, which lists the accepted ones.
func exactPaymentArgs(wire []byte) (json.RawMessage, error) {
	if len(wire) == 0 {
		return nil, nil
	}
	// First no member twice at any depth, whatever the names; then the
	// argument names exactly.
	var shape paymentArgs
	for _, v := range []any{&map[string]json.RawMessage{}, &shape} {
		if err := strictjson.Check(wire, v); err != nil {
			var se *strictjson.Error
			if !errors.As(err, &se) || se.Ambiguous {
				return nil, userErrorf("the arguments of authorize_payment cannot be read exactly: %s; nothing was asked or signed", err)
			}
			return nil, nil
		}
	}
	if err := json.Unmarshal(wire, &shape); err != nil {
		return nil, nil
	}
	if pr := bytes.TrimSpace(shape.PaymentRequired); len(pr) > 0 && pr[0] == '{' {
		return pr, nil
	}
	return nil, nil
}

func (s *Server) authorizePayment(ctx context.Context, raw any) (*mcp.CallToolResult, error) {
	wire, err := exactPaymentArgs(wireArguments(ctx))
	if err != nil {
		return nil, err
	}
	a := newArgs(raw, "payment_required", "resource")
	pr, present := a.m["payment_required"]
	switch v := pr.(type) {
	case nil:
		if !present {
			a.errs = append(a.errs, "payment_required is required")
		} else {
			a.errs = append(a.errs, "payment_required must be the seller's PaymentRequired object or the base64 value of its PAYMENT-REQUIRED header")
		}
	case string:
		if v == "" {
			a.errs = append(a.errs, "payment_required must not be empty")
		} else if len(v) > 87400 {
			a.errs = append(a.errs, "payment_required is longer than 87400 bytes")
		}
	case map[string]any:
	default:
		a.errs = append(a.errs, "payment_required must be the seller's PaymentRequired object or the base64 value of its PAYMENT-REQUIRED header")
	}
	resource := a.question(resourceArg())
	if msg := a.err(); msg != "" {
		return nil, userErrorf("%s", msg)
	}
	kept, retried := s.retriedAnswer(ctx, "authorize_payment")
	if kept != nil {
		return kept, nil
	}
	if wire != nil {
		pr = wire
	}
	res, err := s.guard.Payments.Authorize(ctx, s.callerID(ctx), payment.Request{PaymentRequired: pr, Resource: resource})
	if err != nil {
		var refused *payment.RefusedError
		if errors.As(err, &refused) {
			return nil, userErrorf("%s", refused.Message)
		}
		return nil, engineError(err)
	}
	out := structured(res, renderAuthorize(res))
	if res.Decision == guard.Review {
		return s.askToShowLink(ctx, "authorize_payment", res.ReviewID, res.ReviewURL, retried, out), nil
	}
	return out, nil
}

// resourceArg is the resource argument, as check_before_pay reads it.
func resourceArg() guard.Arg {
	arg, _ := guard.QuestionArg("resource")
	return arg
}

func renderAuthorize(res payment.Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Decision: %s for %s (%s) to %s at %s on %s",
		strings.ToUpper(res.Decision), res.Accepted.Amount, res.Accepted.Asset, res.Accepted.PayTo, res.Accepted.Host, res.Accepted.Network)
	switch {
	case res.Payment != nil:
		fmt.Fprintf(&b, ". Signed: send header %s with the value in payment.header; valid until %d (Unix time), nonce %s.\n",
			res.Payment.HeaderName, res.Authorization.ValidBefore, res.Authorization.Nonce)
	case res.Decision == "review":
		fmt.Fprintf(&b, ". Nothing was signed: review %s awaits a human; poll get_review_status and call again with the same 402 once it is approved.\n", res.ReviewID)
	default:
		b.WriteString(". Nothing was signed.\n")
	}
	for _, r := range res.Reasons {
		fmt.Fprintf(&b, "- %s: %s\n", r.Rule, r.Detail)
	}
	if res.Decision == guard.Review && res.ReviewURL != "" {
		fmt.Fprintf(&b, "A reviewer decides at %s\n", res.ReviewURL)
	}
	fmt.Fprintf(&b, "Recorded as signed receipt %s.\n", res.ReceiptID)
	return b.String()
}

// PayerAddress is the address payments are signed from, or "" when the
// server signs no payments.
func (s *Server) PayerAddress() string {
	if s.guard == nil || s.guard.Payments == nil {
		return ""
	}
	return s.guard.Payments.Payer().Hex()
}

// KeepTools serves only the named tools, so that an operator can take a
// tool away from agents (check_before_pay, where the agent should have the
// payer signer as its one way to pay). A name no tool has is an error.
func (s *Server) KeepTools(names []string) error {
	served := s.mcp.ListTools()
	for _, n := range names {
		if _, ok := served[n]; !ok {
			known := make([]string, 0, len(served))
			for k := range served {
				known = append(known, k)
			}
			slices.Sort(known)
			return fmt.Errorf("--tools names %q, which is not served here (served: %s)", n, strings.Join(known, ", "))
		}
	}
	var drop []string
	for k := range served {
		if !slices.Contains(names, k) {
			drop = append(drop, k)
		}
	}
	s.mcp.DeleteTools(drop...)
	return nil
}
