package server

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/haia-trace-mcp/haia-trace-mcp/payment"
)

func (s *Server) receiptTool() toolDef {
	return toolDef{
		name:  "record_receipt",
		title: "Record a seller's settlement and receipt",
		description: "After a paid request: hand in the seller's settlement answer (the PAYMENT-RESPONSE or X-PAYMENT-RESPONSE header, or its JSON) and, if it came apart, " +
			"its signed receipt, with the nonce of the authorization authorize_payment signed. The settlement ends the authorization's hold as an open payment at once " +
			"(it keeps counting as spend); the seller's receipt is verified and compared with the authorization and the seller's signed offer, and any disagreement is recorded for a human. " +
			"Once per authorization: one the server already read from the Trace (the recorder's settlement events) is refused, naming its receipt.",
		readOnly: false, idempotent: false,
		handler: s.recordReceipt,
	}
}

func (s *Server) recordReceipt(ctx context.Context, raw any) (*mcp.CallToolResult, error) {
	a := newArgs(raw, "nonce", "payment_response", "receipt")
	nonce, _ := a.m["nonce"].(string)
	if _, ok := a.m["nonce"]; !ok {
		a.errs = append(a.errs, "nonce is required (authorization.nonce of authorize_payment's answer)")
	} else if len(nonce) != 66 || !strings.HasPrefix(nonce, "0x") || strings.Trim(strings.ToLower(nonce[2:]), "0123456789abcdef") != "" {
		a.errs = append(a.errs, "nonce must be 0x and 64 hex digits")
	}
	for _, k := range []string{"payment_response", "receipt"} {
		v, present := a.m[k]
		switch x := v.(type) {
		case nil:
			if k == "payment_response" || present {
				a.errs = append(a.errs, k+" must be the seller's JSON object or its base64 header value")
			}
		case string:
			if x == "" || len(x) > 43700 {
				a.errs = append(a.errs, k+" must be a non-empty string of at most 43700 bytes")
			}
		case map[string]any:
		default:
			a.errs = append(a.errs, k+" must be the seller's JSON object or its base64 header value")
		}
	}
	if msg := a.err(); msg != "" {
		return nil, userErrorf("%s", msg)
	}
	res, err := s.guard.Payments.RecordReceipt(ctx, s.callerID(ctx), payment.ReceiptRequest{Nonce: nonce, PaymentResponse: a.m["payment_response"], Receipt: a.m["receipt"]})
	if err != nil {
		var refused *payment.RefusedError
		if errors.As(err, &refused) {
			return nil, userErrorf("%s", refused.Message)
		}
		return nil, engineError(err)
	}
	return structured(res, renderReceipt(res)), nil
}

func renderReceipt(r payment.ReceiptResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Settlement recorded for authorization %s: transaction %s on %s, paid by %s. The hold no longer counts as an open payment.\n", r.Nonce, r.Transaction, r.Network, r.Payer)
	switch sr := r.SellerReceipt; {
	case sr == nil:
		b.WriteString("No signed receipt from the seller.\n")
	case sr.Verified:
		fmt.Fprintf(&b, "The seller's receipt verifies, signed by %s.\n", sr.Signer)
	}
	if n := len(r.Findings); n > 0 {
		fmt.Fprintf(&b, "%d %s recorded for a human:\n", n, plural(n, "finding", "findings"))
		for _, f := range r.Findings {
			fmt.Fprintf(&b, "- %s\n", f)
		}
	}
	fmt.Fprintf(&b, "Recorded as signed receipt %s.\n", r.ReceiptID)
	return b.String()
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
