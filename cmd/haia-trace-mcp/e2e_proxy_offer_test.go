package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/payment/x402"
)

// TestProxySignedOffers: a paying tool that passes the seller's 402 (the
// guard map's paymentRequired) is judged through the real proxy binary on
// the 402's entry, and the seller's EIP-712 signed offer for it is checked
// by the reader authorize_payment uses: the offer as signed is forwarded
// and paid once; an offer whose amount was edited, or whose signature was,
// is review naming what is wrong; a 402 without offers from a seller the
// policy's requireSignedOffers names is review, and so is a call of a tool
// that passes no 402 to that seller; nothing of those reaches the upstream.
func TestProxySignedOffers(t *testing.T) {
	gmap := `{"tools": {
	  "pay_x402": {"paymentRequired": "payment_required", "resource": "resource"},
	  "send_usdc": {"counterparty": "to", "amount": "amount", "amountUnit": "display", "asset": "USDC"}}, "unmapped": "forward"}`
	e := newProxyEnv(t, gmap, `{"reviewAbove": "100", "requireSignedOffers": ["strict.seller.example"]}`)
	e.start(t, nil, "PAY_X402=1")
	k, err := x402.ParseKey([]byte(e2eSellerKey), nil)
	if err != nil {
		t.Fatal(err)
	}
	seller := x402.NewKeySigner(k).Address().Hex()
	// offered is a 402 for url asking amount, with an offer signed over
	// the same terms, then changed by edit.
	offered := func(url, amount string, edit func(offer map[string]any)) map[string]any {
		terms := x402.OfferTerms{Version: 1, ResourceURL: url, Scheme: "exact", Network: "eip155:8453",
			Asset: "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", PayTo: seller, Amount: amount, ValidUntil: 4102444800}
		payload := map[string]any{"version": terms.Version, "resourceUrl": terms.ResourceURL, "scheme": terms.Scheme, "network": terms.Network,
			"asset": terms.Asset, "payTo": terms.PayTo, "amount": terms.Amount, "validUntil": terms.ValidUntil}
		offer := map[string]any{"format": "eip712", "acceptIndex": 0, "signature": e2eSign(t, x402.OfferDigest(terms)), "payload": payload}
		if edit != nil {
			edit(offer)
		}
		pr := e2ePaymentRequiredAt(url, amount, seller)
		pr["extensions"] = map[string]any{"offer-receipt": map[string]any{"info": map[string]any{"offers": []any{offer}}}}
		return pr
	}
	call := func(tool string, args map[string]any) (bool, string) {
		b, err := json.Marshal(args)
		if err != nil {
			t.Fatal(err)
		}
		res := e.callRaw(t, tool, string(b))
		return res.IsError, resultText(res)
	}

	// The offer as signed: forwarded once, the 402 as the agent sent it.
	url := "https://api.seller.example/good"
	if isErr, text := call("pay_x402", map[string]any{"payment_required": offered(url, "250000", nil), "resource": url}); isErr {
		t.Fatalf("a 402 whose offer the payee signed over its terms was not forwarded: %s", text)
	}
	paid := e.paid(t)
	if len(paid) != 1 || paid[0]["tool"] != "pay_x402" || !strings.Contains(string(mustJSON(paid[0]["arguments"])), "offer-receipt") {
		t.Fatalf("the upstream paid %v", paid)
	}

	for _, tc := range []struct {
		name, tool string
		args       map[string]any
		want       []string
	}{
		{"the offer's amount edited", "pay_x402", map[string]any{"resource": "https://api.seller.example/edited",
			"payment_required": offered("https://api.seller.example/edited", "250000", func(o map[string]any) {
				o["payload"].(map[string]any)["amount"] = "200000"
			})},
			[]string{"signed_offer", `amount: the offer signs "200000" atomic units, the entry asks 250000`}},
		{"the 402 asks more than the offer signs", "pay_x402", map[string]any{"resource": "https://api.seller.example/more",
			"payment_required": func() map[string]any {
				pr := offered("https://api.seller.example/more", "250000", nil)
				pr["accepts"].([]any)[0].(map[string]any)["amount"] = "900000"
				return pr
			}()},
			[]string{"signed_offer", `amount: the offer signs "250000" atomic units, the entry asks 900000`}},
		{"the offer's signature edited", "pay_x402", map[string]any{"resource": "https://api.seller.example/sig",
			"payment_required": offered("https://api.seller.example/sig", "250000", func(o map[string]any) {
				s := o["signature"].(string)
				o["signature"] = s[:10] + strings.Map(func(r rune) rune {
					if r == 'a' {
						return 'b'
					}
					return 'a'
				}, s[10:12]) + s[12:]
			})},
			[]string{"signed_offer", "which is neither the payTo nor a key the policy's sellerKeys name"}},
		{"no offers from a seller that must sign", "pay_x402", map[string]any{"resource": "https://strict.seller.example/data",
			"payment_required": e2ePaymentRequiredAt("https://strict.seller.example/data", "250000", seller)},
			[]string{"signed_offer", "the policy requires a signed offer from strict.seller.example"}},
		{"a tool that passes no 402, to a seller that must sign", "send_usdc", map[string]any{"to": "strict.seller.example", "amount": "0.25"},
			[]string{"signed_offer", "the policy requires a signed offer from strict.seller.example"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(e.paid(t))
			b, err := json.Marshal(tc.args)
			if err != nil {
				t.Fatal(err)
			}
			res := e.callRaw(t, tc.tool, string(b))
			text := resultText(res)
			if d := decisionOf(t, res); d.Decision != "review" {
				t.Fatalf("want review, got %s: %s", d.Decision, text)
			}
			for _, w := range tc.want {
				if !strings.Contains(text, w) {
					t.Fatalf("the answer does not say %q:\n%s", w, text)
				}
			}
			if n := len(e.paid(t)); n != before {
				t.Fatalf("a call answered review reached the upstream (%d payments, %d before)", n, before)
			}
		})
	}

	// Without a requirement, a 402 without offers is judged as any other.
	url = "https://api.seller.example/plain"
	if isErr, text := call("pay_x402", map[string]any{"payment_required": e2ePaymentRequiredAt(url, "250000", seller), "resource": url}); isErr {
		t.Fatalf("a 402 without offers from a seller not required to sign was not forwarded: %s", text)
	}
	// A 402 the tool would pay one of two entries of is refused: which one
	// it pays cannot be known.
	two := offered("https://api.seller.example/two", "250000", nil)
	two["accepts"] = append(two["accepts"].([]any), two["accepts"].([]any)[0])
	if isErr, text := call("pay_x402", map[string]any{"payment_required": two, "resource": "https://api.seller.example/two"}); !isErr || !strings.Contains(text, "offers 2 entries") {
		t.Fatalf("a 402 with two entries: %v %s", isErr, text)
	}
	if n := len(e.paid(t)); n != 2 {
		t.Fatalf("%d payments, want 2", n)
	}
}
