package server

import (
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"

	decdsa "github.com/decred/dcrd/dcrec/secp256k1/v4/ecdsa"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment/x402"
)

func signedReceipt(t *testing.T, keyHex string, terms x402.ReceiptTerms) map[string]any {
	t.Helper()
	k, err := x402.ParseKey([]byte(keyHex), nil)
	if err != nil {
		t.Fatal(err)
	}
	d := x402.ReceiptDigest(terms)
	c := decdsa.SignCompact(k, d[:], false)
	sig := append(append([]byte{}, c[1:]...), c[0])
	return map[string]any{"format": "eip712", "signature": "0x" + hex.EncodeToString(sig), "payload": map[string]any{"version": terms.Version,
		"network": terms.Network, "resourceUrl": terms.ResourceURL, "payer": terms.Payer, "issuedAt": terms.IssuedAt, "transaction": terms.Transaction}}
}

type receiptAnswer struct {
	ReceiptID     string   `json:"receipt_id"`
	Findings      []string `json:"findings"`
	SellerReceipt *struct {
		Verified bool `json:"verified"`
	} `json:"seller_receipt"`
}

// record_receipt: the settlement ends the authorization's hold as an open
// payment at once (the next payment to the seller is no longer reviewed
// for it), the seller's receipt is verified and compared, a disagreement
// is a finding, and a nonce is settled once, by its own caller.
func TestRecordReceiptSettles(t *testing.T) {
	const sellerKey = "0x7a28b5ba57c53603b0b07b56bba752f7784bf506fa95edc395f5cf6c7514fe9d"
	const strangerKey = "0x8a28b5ba57c53603b0b07b56bba752f7784bf506fa95edc395f5cf6c7514fe9d"
	k, _ := x402.ParseKey([]byte(sellerKey), nil)
	seller := x402.NewKeySigner(k).Address().Hex()
	pol, err := guard.ParseConfig([]byte(`{"reviewAbove":"1.00","maxOpenPartialPerCounterparty":0}`), "")
	if err != nil {
		t.Fatal(err)
	}
	s := newPolicyServer(t, t.TempDir(), 0, pol)
	res := "https://api.seller.example/data"
	pay := func(amount, resource string) authorizeAnswer {
		t.Helper()
		pr := paymentRequiredAt(resource, amount, seller)
		return authorize(t, s, map[string]any{"payment_required": pr, "resource": resource})
	}
	first := pay("250000", res)
	if first.Decision != "allow" {
		t.Fatalf("first: %+v", first)
	}
	// Open: the next payment to the seller is reviewed for it.
	if a, rules := hasRule(t, s, map[string]any{"payment_required": paymentRequiredAt(res+"?n=2", "260000", seller), "resource": res + "?n=2"}); a.Decision != "review" || !strings.Contains(strings.Join(rules, ","), guard.RuleOpenPartial) {
		t.Fatalf("an open authorization does not count as open: %s %v", a.Decision, rules)
	}
	settle := func(nonce, payer string, receipt map[string]any) (bool, string, receiptAnswer) {
		t.Helper()
		pr := map[string]any{"success": true, "transaction": "0x" + strings.Repeat("cd", 32), "network": "eip155:8453", "payer": payer}
		if receipt != nil {
			pr["extensions"] = map[string]any{"offer-receipt": map[string]any{"info": map[string]any{"receipt": receipt}}}
		}
		isErr, text, st := callTool(t, s, "record_receipt", map[string]any{"nonce": nonce, "payment_response": pr})
		var a receiptAnswer
		json.Unmarshal(st, &a)
		return isErr, text, a
	}
	payer := first.Authorization.Payer
	good := x402.ReceiptTerms{Version: 1, Network: "eip155:8453", ResourceURL: res, Payer: payer, IssuedAt: 1800000000}
	isErr, text, a := settle(first.Authorization.Nonce, payer, signedReceipt(t, sellerKey, good))
	if isErr || a.ReceiptID == "" || len(a.Findings) != 0 || a.SellerReceipt == nil || !a.SellerReceipt.Verified {
		t.Fatalf("settle: %v %s %+v", isErr, text, a)
	}
	// Settled: no longer open, so the next payment is allowed at once.
	second, rules := hasRule(t, s, map[string]any{"payment_required": paymentRequiredAt(res+"?n=3", "270000", seller), "resource": res + "?n=3"})
	if second.Decision != "allow" {
		t.Fatalf("a settled authorization still counts as open: %s %v", second.Decision, rules)
	}
	// Once.
	if isErr, text, _ := settle(first.Authorization.Nonce, payer, nil); !isErr || !strings.Contains(text, "was settled at") {
		t.Fatalf("a second settlement: %v %s", isErr, text)
	}
	// Unknown nonce.
	if isErr, text, _ := settle("0x"+strings.Repeat("00", 32), payer, nil); !isErr || !strings.Contains(text, "no authorization signed for you") {
		t.Fatalf("an unknown nonce: %v %s", isErr, text)
	}
	// Findings: the receipt names another payer, resource and transaction,
	// and is signed by a stranger; the settlement names another payer.
	bad := good
	bad.Payer, bad.ResourceURL, bad.Transaction = seller, "https://api.seller.example/else", "0x"+strings.Repeat("ef", 32)
	isErr, text, a = settle(second.Authorization.Nonce, seller, signedReceipt(t, strangerKey, bad))
	if isErr || a.SellerReceipt == nil || a.SellerReceipt.Verified {
		t.Fatalf("a bad receipt: %v %s %+v", isErr, text, a)
	}
	all := strings.Join(a.Findings, "\n")
	for _, w := range []string{"payer: the settlement names", "payer: the seller's receipt names", "resourceUrl:", "transaction:", "signer:"} {
		if !strings.Contains(all, w) {
			t.Errorf("no finding %q in:\n%s", w, all)
		}
	}
	if !strings.Contains(text, "5 findings recorded for a human") {
		t.Errorf("text: %s", text)
	}
}

// The seller's receipt is compared with the seller's signed offer the
// authorization paid, too: the network and the resource it signed it
// offered, and the identity that signed the offer. Each difference is a
// finding naming the field and the offer.
func TestRecordReceiptComparesTheOffer(t *testing.T) {
	const sellerKey = "0x7a28b5ba57c53603b0b07b56bba752f7784bf506fa95edc395f5cf6c7514fe9d"
	const otherKey = "0x8a28b5ba57c53603b0b07b56bba752f7784bf506fa95edc395f5cf6c7514fe9d"
	k, _ := x402.ParseKey([]byte(sellerKey), nil)
	seller := x402.NewKeySigner(k).Address().Hex()
	ok, _ := x402.ParseKey([]byte(otherKey), nil)
	other := x402.NewKeySigner(ok).Address().Hex()
	// The policy trusts a second key of the seller's: a receipt it signs
	// passes the signer rule, and still differs from the offer's signer.
	pol, err := guard.ParseConfig([]byte(`{"reviewAbove":"1.00","sellerKeys":{"api.seller.example":["`+other+`"]}}`), "")
	if err != nil {
		t.Fatal(err)
	}
	s := newPolicyServer(t, t.TempDir(), 0, pol)
	res := "https://api.seller.example/data"
	offer := x402.OfferTerms{Version: 1, ResourceURL: res, Scheme: "exact", Network: "eip155:8453",
		Asset: "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", PayTo: seller, Amount: "250000", ValidUntil: 4102444800}
	settle := func(nonce, payer string, receipt map[string]any) receiptAnswer {
		t.Helper()
		pr := map[string]any{"success": true, "transaction": "0x" + strings.Repeat("cd", 32), "network": "eip155:8453", "payer": payer,
			"extensions": map[string]any{"offer-receipt": map[string]any{"info": map[string]any{"receipt": receipt}}}}
		isErr, text, st := callTool(t, s, "record_receipt", map[string]any{"nonce": nonce, "payment_response": pr})
		if isErr {
			t.Fatalf("record_receipt: %s", text)
		}
		var a receiptAnswer
		json.Unmarshal(st, &a)
		return a
	}
	pay := func(amount string) authorizeAnswer {
		t.Helper()
		o := offer
		o.Amount = amount
		a := authorize(t, s, map[string]any{"payment_required": withSignedOffer(t, paymentRequiredAt(res, amount, seller), sellerKey, o), "resource": res})
		if a.Decision != "allow" {
			t.Fatalf("pay: %+v", a)
		}
		return a
	}
	// The offer's signer signs the receipt of the offer's terms: no finding.
	first := pay("250000")
	payer := first.Authorization.Payer
	good := x402.ReceiptTerms{Version: 1, Network: "eip155:8453", ResourceURL: res, Payer: payer, IssuedAt: 1800000000}
	if a := settle(first.Authorization.Nonce, payer, signedReceipt(t, sellerKey, good)); len(a.Findings) != 0 || !a.SellerReceipt.Verified {
		t.Fatalf("a receipt of the offer's terms: %+v", a)
	}
	// Signed by another key the policy trusts: a finding naming the
	// offer's signer; on another network: a finding naming the offer's.
	second := pay("260000")
	bad := good
	bad.Network = "eip155:84532"
	a := settle(second.Authorization.Nonce, payer, signedReceipt(t, otherKey, bad))
	all := strings.Join(a.Findings, "\n")
	for _, w := range []string{
		"signer: the seller's receipt is signed by " + other + " (EIP-712), its signed offer by " + seller,
		`network: the seller's receipt names "eip155:84532", its signed offer "eip155:8453"`,
	} {
		if !strings.Contains(all, w) {
			t.Errorf("no finding %q in:\n%s", w, all)
		}
	}
}
