package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/sellerkey"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment/x402"
)

// es256Seller is a seller's P-256 key for JWS (ES256) offers and receipts.
type es256Seller struct{ k *ecdsa.PrivateKey }

func newES256Seller(t *testing.T) es256Seller {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return es256Seller{k}
}

func (s es256Seller) jwk() string {
	raw, _ := s.k.PublicKey.Bytes()
	b := base64.RawURLEncoding.EncodeToString
	return fmt.Sprintf(`{"kty":"EC","crv":"P-256","x":%q,"y":%q}`, b(raw[1:33]), b(raw[33:]))
}

// compact signs payload (its JCS form) as a JWS compact string under kid.
func (s es256Seller) compact(t *testing.T, kid string, payload []byte) string {
	t.Helper()
	h := base64.RawURLEncoding.EncodeToString([]byte(fmt.Sprintf(`{"alg":"ES256","kid":%q}`, kid)))
	p := base64.RawURLEncoding.EncodeToString(payload)
	d := sha256.Sum256([]byte(h + "." + p))
	r, sv, err := ecdsa.Sign(rand.Reader, s.k, d[:])
	if err != nil {
		t.Fatal(err)
	}
	sig := make([]byte, 64)
	r.FillBytes(sig[:32])
	sv.FillBytes(sig[32:])
	return h + "." + p + "." + base64.RawURLEncoding.EncodeToString(sig)
}

// TestDossierCarriesPinnedDIDWebKey: a seller signs its offer and its
// receipt as JWS (ES256) under a did:web key identifier, which the
// operator pinned in the policy's sellerKeys. The real binary authorizes
// and records them; dossier export carries the pinned public key bound to
// its kid, and dossier verify checks both signatures against it offline —
// VALID, saying the key was pinned by the operator's policy and not
// resolved — and refuses a dossier whose carried key or JWS was edited.
func TestDossierCarriesPinnedDIDWebKey(t *testing.T) {
	root := sampleRoot(t)
	key := filepath.Join(t.TempDir(), "signing-key.pem")
	payerKey := writeSecret(t, "payer.key", "0x"+e2ePayerKey+"\n")
	seller := newES256Seller(t)
	const kid = "did:web:api.seller.example#key-1"
	cfg := writeSecret(t, "guard.json", `{"reviewAbove":"100","requireSignedOffers":true,"sellerKeys":{"api.seller.example":[{"kid":"`+kid+`","jwk":`+seller.jwk()+`}]}}`)
	cs := mcpSession(t, nil, "--dir", root, "--key-file", key, "--guard-config", cfg, "--payer-key", payerKey)
	k, _ := x402.ParseKey([]byte(e2eSellerKey), nil)
	payTo := x402.NewKeySigner(k).Address().Hex()
	res := "https://api.seller.example/data"
	offerJCS := fmt.Sprintf(`{"amount":"2500000","asset":"0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913","network":"eip155:8453","payTo":%q,"resourceUrl":%q,"scheme":"exact","validUntil":4102444800,"version":1}`, payTo, res)
	pr := e2ePaymentRequired("2500000", payTo)
	pr["extensions"] = map[string]any{"offer-receipt": map[string]any{"info": map[string]any{"offers": []any{map[string]any{
		"format": "jws", "acceptIndex": 0, "signature": seller.compact(t, kid, []byte(offerJCS))}}}}}
	allow := authorizeCall(t, cs, pr)
	if allow.Decision != "allow" {
		t.Fatalf("an offer signed with the pinned did:web key: %+v", allow)
	}
	tx := "0x" + strings.Repeat("7c", 32)
	receiptJCS := fmt.Sprintf(`{"issuedAt":1800000000,"network":"eip155:8453","payer":%q,"resourceUrl":%q,"transaction":%q,"version":1}`, e2ePayerAddr, res, tx)
	settlement := map[string]any{"success": true, "transaction": tx, "network": "eip155:8453", "payer": e2ePayerAddr,
		"extensions": map[string]any{"offer-receipt": map[string]any{"info": map[string]any{"receipt": map[string]any{
			"format": "jws", "signature": seller.compact(t, kid, []byte(receiptJCS))}}}}}
	var rec struct {
		Findings []string `json:"findings"`
	}
	decodeStructured(t, callTool(t, cs, "record_receipt", map[string]any{"nonce": allow.Authorization.Nonce, "payment_response": settlement}), &rec)
	if len(rec.Findings) != 0 {
		t.Fatalf("findings: %v", rec.Findings)
	}

	file := filepath.Join(t.TempDir(), "dossier.json")
	if out, errOut, code := runCLI(t, "dossier", "export", allow.Authorization.Nonce, "--dir", root, "--key-file", key, "--out", file); code != 0 || errOut != "" {
		t.Fatalf("export: %d %s %s", code, out, errOut)
	}
	orig, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		SellerKeys []struct {
			KID    string          `json:"kid"`
			JWK    json.RawMessage `json:"jwk"`
			Source string          `json:"source"`
		} `json:"seller_keys"`
	}
	if err := json.Unmarshal(orig, &d); err != nil || len(d.SellerKeys) != 1 || d.SellerKeys[0].KID != kid || !strings.Contains(d.SellerKeys[0].Source, "pinned by the operator's policy") {
		t.Fatalf("the dossier does not carry the one pinned key: %v %+v", err, d.SellerKeys)
	}
	keyring := filepath.Join(root, "guard", "keyring.json")
	out, errOut, code := runCLI(t, "dossier", "verify", file, "--keyring", keyring)
	if code != 0 {
		t.Fatalf("verify: %d\n%s%s", code, out, errOut)
	}
	t.Logf("dossier verify:\n%s", out)
	for _, link := range []string{"seller offer", "seller receipt"} {
		line := ""
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "VALID      "+link+" ") {
				line = l
			}
		}
		if !strings.Contains(line, kid) || !strings.Contains(line, "pinned by the operator's policy (sellerKeys)") || !strings.Contains(line, "not resolved") {
			t.Errorf("the %s line does not say the key was pinned, not resolved: %q\n%s", link, line, out)
		}
	}

	if !strings.Contains(out, "VALID      offer seal") {
		t.Errorf("no VALID offer seal:\n%s", out)
	}
	other := newES256Seller(t)
	otherKey, err := sellerkey.ParseJWK([]byte(other.jwk()))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	json.Unmarshal(orig, &m)
	offer := m["authorization"].(map[string]any)["offer"].(map[string]any)
	sig := offer["signature"].(string)
	edit := func(f func(m map[string]any)) []byte {
		var m map[string]any
		json.Unmarshal(orig, &m)
		f(m)
		b, _ := json.Marshal(m)
		return b
	}
	keyAt := func(m map[string]any) map[string]any { return m["seller_keys"].([]any)[0].(map[string]any) }
	for _, tc := range []struct {
		name   string
		file   []byte
		code   int
		saying string
	}{
		{"another key carried", edit(func(m map[string]any) { keyAt(m)["jwk"] = json.RawMessage(other.jwk()) }), 2, "TAMPERED   seller offer"},
		{"the key's x edited", edit(func(m map[string]any) {
			var j map[string]any
			json.Unmarshal([]byte(seller.jwk()), &j)
			x := j["x"].(string)
			j["x"] = x[:5] + map[bool]string{true: "A", false: "B"}[x[5] != 'A'] + x[6:]
			keyAt(m)["jwk"] = j
		}), 2, "TAMPERED"},
		{"the offer's JWS signature edited", edit(func(m map[string]any) {
			o := m["authorization"].(map[string]any)["offer"].(map[string]any)
			o["signature"] = sig[:len(sig)-6] + map[bool]string{true: "AAAA", false: "BBBB"}[!strings.HasSuffix(sig[:len(sig)-2], "AAAA")] + sig[len(sig)-2:]
		}), 2, "TAMPERED   seller offer"},
		{"the offer's JWS re-signed with another key", edit(func(m map[string]any) {
			m["authorization"].(map[string]any)["offer"].(map[string]any)["signature"] = other.compact(t, kid, []byte(offerJCS))
		}), 2, "TAMPERED   seller offer"},
		{"a key of another source", edit(func(m map[string]any) { keyAt(m)["source"] = "resolved from did:web" }), 3, "MALFORMED"},
		{"no key carried", edit(func(m map[string]any) { delete(m, "seller_keys") }), 1, "UNVERIFIED seller offer"},
		// The receipt sealed the pinned key's thumbprint: another key
		// carried is named, and so is a whole other offer, signer and key
		// under the same kid (which verifies on its own).
		{"another key carried, against the seal", edit(func(m map[string]any) { keyAt(m)["jwk"] = json.RawMessage(other.jwk()) }), 2,
			"TAMPERED   offer seal                 pinned key: the file carries key " + otherKey.Thumbprint},
		{"the offer, its signer and its pinned key all another's", edit(func(m map[string]any) {
			a := m["authorization"].(map[string]any)
			a["offer"].(map[string]any)["signature"] = other.compact(t, kid, []byte(offerJCS))
			a["offer_signer"] = fmt.Sprintf("%s (JWS ES256, key %s)", kid, otherKey.Thumbprint)
			keyAt(m)["jwk"] = json.RawMessage(other.jwk())
		}), 2, "TAMPERED   offer seal                 pinned key: the file carries key " + otherKey.Thumbprint},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "d.json")
			if err := os.WriteFile(p, tc.file, 0o600); err != nil {
				t.Fatal(err)
			}
			out, _, code := runCLI(t, "dossier", "verify", p, "--keyring", keyring)
			if code != tc.code || !strings.Contains(out, tc.saying) {
				t.Fatalf("exit %d, want %d saying %q:\n%s", code, tc.code, tc.saying, out)
			}
			if strings.HasPrefix(tc.name, "the offer, its signer") {
				for _, f := range []string{"TAMPERED   offer seal                 offer: the file's offer hashes to", "TAMPERED   offer seal                 offer_signer: the file records"} {
					if !strings.Contains(out, f) {
						t.Errorf("not named: %q\n%s", f, out)
					}
				}
			}
		})
	}
}
