package server

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"

	decdsa "github.com/decred/dcrd/dcrec/secp256k1/v4/ecdsa"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment/x402"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/filestore"
)

// withSignedOffer adds the offer-receipt extension to a 402 with one
// EIP-712 offer signed by keyHex over terms.
func withSignedOffer(t *testing.T, pr map[string]any, keyHex string, terms x402.OfferTerms) map[string]any {
	t.Helper()
	k, err := x402.ParseKey([]byte(keyHex), nil)
	if err != nil {
		t.Fatal(err)
	}
	d := x402.OfferDigest(terms)
	c := decdsa.SignCompact(k, d[:], false)
	sig := append(append([]byte{}, c[1:]...), c[0])
	pr["extensions"] = map[string]any{"offer-receipt": map[string]any{"info": map[string]any{"offers": []any{map[string]any{
		"format": "eip712", "acceptIndex": 0, "signature": "0x" + hex.EncodeToString(sig),
		"payload": map[string]any{"version": terms.Version, "resourceUrl": terms.ResourceURL, "scheme": terms.Scheme, "network": terms.Network,
			"asset": terms.Asset, "payTo": terms.PayTo, "amount": terms.Amount, "validUntil": terms.ValidUntil}}}}}}
	return pr
}

// The seller's signed offer is checked before the engine is asked: a
// trusted one is recorded with its signer, one whose terms differ from the
// entry paid, or whose signer does not speak for the seller, is review;
// and the policy can require one.
func TestAuthorizePaymentChecksSignedOffers(t *testing.T) {
	const sellerKey = "0x7a28b5ba57c53603b0b07b56bba752f7784bf506fa95edc395f5cf6c7514fe9d"
	const strangerKey = "0x8a28b5ba57c53603b0b07b56bba752f7784bf506fa95edc395f5cf6c7514fe9d"
	k, _ := x402.ParseKey([]byte(sellerKey), nil)
	seller := x402.NewKeySigner(k).Address().Hex()
	terms := func(amount string) x402.OfferTerms {
		return x402.OfferTerms{Version: 1, ResourceURL: "https://api.seller.example/data", Scheme: "exact", Network: "eip155:8453",
			Asset: "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", PayTo: seller, Amount: amount, ValidUntil: 4102444800}
	}
	pol, err := guard.ParseConfig([]byte(`{"reviewAbove":"1.00","requireSignedOffers":["strict.example"]}`), "")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	s := newPolicyServer(t, dir, 0, pol)

	// Signed by the payee, terms equal: allow, the signer recorded.
	a, text := hasRuleText(t, s, map[string]any{"payment_required": withSignedOffer(t, paymentRequired("250000", seller), sellerKey, terms("250000")), "resource": "https://api.seller.example/data"})
	if a.Decision != "allow" || !strings.Contains(text, "signed_offer: the offer for accepts[0] is signed by "+seller) {
		t.Fatalf("a trusted offer: %s\n%s", a.Decision, text)
	}
	auths, err := reviewlog.OpenStore(filestore.New(openRoot(t, dir)), reviewlog.Options{}).Authorizations(context.Background())
	if err != nil || len(auths) != 1 || !strings.HasPrefix(auths[0].OfferSigner, seller) || len(auths[0].Offer) == 0 {
		t.Fatalf("the authorization does not record the offer's signer: %v %+v", err, auths)
	}

	for _, tc := range []struct {
		name, amount, key, want string
		offered                 string
	}{
		{"the 402 asks more than the offer signs", "300000", sellerKey, "amount: the offer signs \"250000\" atomic units, the entry asks 300000", "250000"},
		{"signed by a stranger", "260000", strangerKey, "neither the payTo nor a key", "260000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pr := withSignedOffer(t, paymentRequired(tc.amount, seller), tc.key, terms(tc.offered))
			a, text := hasRuleText(t, s, map[string]any{"payment_required": pr, "resource": "https://api.seller.example/data"})
			if a.Decision != "review" || a.Payment != nil || !strings.Contains(text, tc.want) {
				t.Fatalf("%s: %s", a.Decision, text)
			}
		})
	}

	// Required of strict.example: a 402 without offers is review.
	a, text = hasRuleText(t, s, map[string]any{"payment_required": paymentRequiredAt("https://strict.example/data", "270000", seller), "resource": "https://strict.example/data"})
	if a.Decision != "review" || !strings.Contains(text, "requires a signed offer from strict.example") {
		t.Fatalf("required offer: %s %s", a.Decision, text)
	}
}

func hasRuleText(t *testing.T, s *Server, args map[string]any) (authorizeAnswer, string) {
	t.Helper()
	isErr, text, st := callTool(t, s, "authorize_payment", args)
	if isErr {
		t.Fatalf("authorize_payment refused: %s", text)
	}
	var a authorizeAnswer
	if err := json.Unmarshal(st, &a); err != nil {
		t.Fatal(err)
	}
	return a, text
}
