package console_test

import (
	"context"
	"html"
	"strings"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/console"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/softauthn"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// The queue page lists every settlement whose seller's answer disagrees
// with the authorization it settles: the authorization, its amount and
// payee, where the settlement came from, and each finding with the field
// it names.
func TestConsoleShowsSellerFindings(t *testing.T) {
	g := newRig(t, func(c *console.Config) {
		c.Assets = func(asset string) (string, int, bool) {
			if asset == "eip155:8453/0x833589fcd6edb6e08f4c7c32d4f71b54bda02913" {
				return "USDC", 6, true
			}
			return "", 0, false
		}
	})
	ctx := context.Background()
	nonce := "0x" + strings.Repeat("ab", 32)
	payee := "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
	if _, err := g.log.RecordAuthorization(ctx, "bot", reviewlog.Authorized{DecisionReceipt: "rcpt-decision", Network: "eip155:8453",
		Token: "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", Name: "USD Coin", Version: "2", From: "0x1199c34af7b1d56a1348e1f0d8e86b6c425ac2c0",
		To: payee, Value: "250000", ValidAfter: "1", ValidBefore: "2", Nonce: nonce, Signature: "0x" + strings.Repeat("11", 65),
		Digest: "0x" + strings.Repeat("22", 32), Resource: "https://api.seller.example/data"},
		func(reviewlog.Tx) (string, error) { return "rcpt-authorization", nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := g.log.RecordSettlement(ctx, "bot", reviewlog.Settled{Nonce: nonce, AuthorizationReceipt: "rcpt-authorization", DecisionReceipt: "rcpt-decision",
		Success: true, Transaction: "0x" + strings.Repeat("33", 32), Network: "eip155:8453", Payer: "0x1199c34af7b1d56a1348e1f0d8e86b6c425ac2c0",
		Findings: []string{`amount: the Trace's settlement (run run-1, line 4) names "200000" atomic units, the authorization 250000`,
			"the seller's receipt does not verify: the signature is not 65 bytes"},
		Digest: "0x" + strings.Repeat("44", 32), Source: reviewlog.SourceTrace, HoldKept: true,
		Trace: &reviewlog.TraceRef{Run: "run-1", Operation: "op-2", Line: 4, Event: "x402.payment.responded", OccurredAt: "2026-12-05T10:00:00Z", Binding: "nonce"}},
		func(reviewlog.Tx) (string, error) { return "rcpt-settlement", nil }); err != nil {
		t.Fatal(err)
	}
	alice, _ := softauthn.New()
	b := g.browser()
	g.enrol(b, "alice", alice)
	if code, res := g.signIn(b, alice); code != 200 {
		t.Fatalf("sign in: %d %v", code, res)
	}
	_, page := b.get("")
	page = html.UnescapeString(page)
	for _, want := range []string{
		`<section aria-label="Seller findings" id="findings">`,
		`data-nonce="` + nonce + `"`,
		"<strong>0.25 USDC</strong> to",
		"Settlement read from the Trace (run run-1, operation op-2, line 4)",
		"the hold still counts as an open payment",
		`<strong class="field">amount</strong> amount: the Trace's settlement (run run-1, line 4) names "200000" atomic units`,
		`<strong class="field">finding</strong> the seller's receipt does not verify`,
		"haia-trace-mcp authorization show " + nonce,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the queue page lacks %q:\n%s", want, page)
		}
	}
}
