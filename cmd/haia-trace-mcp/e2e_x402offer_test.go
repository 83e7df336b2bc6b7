package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/payment/x402"
)

// TestX402OnChainSignedOffers: sellers built with @x402/core's resource
// server and @x402/extensions' offer-receipt issuers — one signing EIP-712
// with its payee key, one a JWS (ES256, did:jwk) — on the local chain. The
// product verifies each signed offer before paying, pays, takes the
// settlement with the seller's signed receipt, and exports the dossier;
// dossier verify and the official package's own verification functions
// accept it; a 402 asking more than the offer signs is review; an edited
// offer or receipt in the dossier is refused by both.
func TestX402OnChainSignedOffers(t *testing.T) {
	h := startChainHarness(t, e2ePayerAddr)
	tokenKey := h.Network + "/" + strings.ToLower(h.Token)
	root := sampleRoot(t)
	key := filepath.Join(t.TempDir(), "signing-key.pem")
	payerKey := writeSecret(t, "payer.key", "0x"+e2ePayerKey+"\n")
	cfg := writeSecret(t, "guard.json", fmt.Sprintf(`{"assets":{%q:{"symbol":"hUSD","decimals":6}},"defaultAsset":%q,
		"reviewAbove":"1.00","maxOpenPartialPerCounterparty":5,"maxAuthorizationSeconds":60,"requireSignedOffers":true,
		"sellerKeys":{"127.0.0.1":[%q]}}`, tokenKey, tokenKey, h.JWSKid))
	cs := mcpSession(t, nil, "--dir", root, "--key-file", key, "--guard-config", cfg, "--payer-key", payerKey)
	client := &http.Client{Timeout: time.Minute}
	get := func(path, header string) (int, http.Header, []byte) {
		req, _ := http.NewRequest(http.MethodGet, h.URL+path, nil)
		if header != "" {
			req.Header.Set("PAYMENT-SIGNATURE", header)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, body
	}
	official := func(kind string, artifact json.RawMessage) (bool, string) {
		var out struct {
			OK     bool   `json:"ok"`
			Signer string `json:"signer"`
			Error  string `json:"error"`
		}
		h.post(t, "/control/verify-artifact", map[string]any{"kind": kind, "artifact": artifact}, &out)
		return out.OK, out.Signer + out.Error
	}
	keyring := filepath.Join(root, "guard", "keyring.json")
	for _, path := range []string{"/offer712", "/offerjws"} {
		t.Run(path, func(t *testing.T) {
			status, hdr, body := get(path, "")
			required := hdr.Get("PAYMENT-REQUIRED")
			if status != http.StatusPaymentRequired || required == "" {
				t.Fatalf("GET %s: %d %s", path, status, body)
			}
			// The seller asks more than it signed: review, naming amount.
			raw, _ := base64.StdEncoding.DecodeString(required)
			var pr map[string]any
			json.Unmarshal(raw, &pr)
			pr["accepts"].([]any)[0].(map[string]any)["amount"] = "260000"
			var a authorizeAnswer
			decodeStructured(t, callTool(t, cs, "authorize_payment", map[string]any{"payment_required": pr, "resource": h.URL + path}), &a)
			if a.Decision != "review" || !strings.Contains(fmt.Sprint(a.Reasons), "amount: the offer signs") {
				t.Fatalf("an entry asking more than the signed offer: %s %+v", a.Decision, a.Reasons)
			}
			// The offer as signed: allow.
			decodeStructured(t, callTool(t, cs, "authorize_payment", map[string]any{"payment_required": required, "resource": h.URL + path}), &a)
			if a.Decision != "allow" || !strings.Contains(fmt.Sprint(a.Reasons), "signed_offer") {
				t.Fatalf("a signed offer: %s %+v", a.Decision, a.Reasons)
			}
			status, hdr, body = get(path, a.Payment.Header)
			response := hdr.Get("PAYMENT-RESPONSE")
			if status != http.StatusOK || response == "" {
				t.Fatalf("GET %s paid: %d %s", path, status, body)
			}
			var rec struct {
				Findings      []string `json:"findings"`
				SellerReceipt *struct {
					Verified bool `json:"verified"`
				} `json:"seller_receipt"`
			}
			decodeStructured(t, callTool(t, cs, "record_receipt", map[string]any{"nonce": a.Authorization.Nonce, "payment_response": response}), &rec)
			if len(rec.Findings) != 0 || rec.SellerReceipt == nil || !rec.SellerReceipt.Verified {
				t.Fatalf("record_receipt: %+v", rec)
			}
			file := filepath.Join(t.TempDir(), "dossier.json")
			if out, errOut, code := runCLI(t, "dossier", "export", a.Authorization.Nonce, "--dir", root, "--key-file", key, "--out", file); code != 0 {
				t.Fatalf("export: %d %s %s", code, out, errOut)
			}
			out, errOut, code := runCLI(t, "dossier", "verify", file, "--keyring", keyring)
			if code != 0 || !strings.Contains(out, "VALID      seller offer") || !strings.Contains(out, "VALID      seller receipt") ||
				!strings.Contains(out, "VALID      offer seal") || !strings.Contains(out, "signs this digest and the offer seal") {
				t.Fatalf("dossier verify: %d\n%s%s", code, out, errOut)
			}
			sealedOfferSwaps(t, file, keyring, func(validUntil int64) json.RawMessage {
				// The seller signs a fresh offer on every 402 (a new
				// validUntil): another validly signed offer of the same
				// seller, for the same entry, with other terms.
				for range 40 {
					_, hdr, _ := get(path, "")
					raw, _ := base64.StdEncoding.DecodeString(hdr.Get("PAYMENT-REQUIRED"))
					var pr struct {
						Extensions struct {
							OfferReceipt struct {
								Info struct {
									Offers []json.RawMessage `json:"offers"`
								} `json:"info"`
							} `json:"offer-receipt"`
						} `json:"extensions"`
					}
					if json.Unmarshal(raw, &pr) != nil || len(pr.Extensions.OfferReceipt.Info.Offers) == 0 {
						t.Fatalf("a second 402 carries no offer: %s", raw)
					}
					o := pr.Extensions.OfferReceipt.Info.Offers[0]
					if art, err := x402.ParseArtifact(o, true); err == nil {
						if tm, err := art.OfferTerms(); err == nil && tm.ValidUntil != validUntil {
							return o
						}
					}
					time.Sleep(250 * time.Millisecond)
				}
				t.Fatal("the seller signed no offer with other terms in 10 s")
				return nil
			})
			// The official package verifies the dossier's offer and receipt.
			var d struct {
				Authorization struct {
					Offer json.RawMessage `json:"offer"`
				} `json:"authorization"`
				Settlement struct {
					SellerReceipt json.RawMessage `json:"seller_receipt"`
				} `json:"settlement"`
			}
			data, _ := os.ReadFile(file)
			json.Unmarshal(data, &d)
			for kind, art := range map[string]json.RawMessage{"offer": d.Authorization.Offer, "receipt": d.Settlement.SellerReceipt} {
				if ok, why := official(kind, art); !ok {
					t.Fatalf("@x402/extensions refuses the dossier's %s: %s", kind, why)
				}
			}
			// An edited offer: both refuse it.
			var compact bytes.Buffer
			json.Compact(&compact, d.Authorization.Offer)
			d.Authorization.Offer = compact.Bytes()
			edited := strings.Replace(string(d.Authorization.Offer), `"amount":"250000"`, `"amount":"250001"`, 1)
			if path == "/offerjws" {
				// The JWS carries its payload: edit the signature's payload part.
				var art struct{ Signature string }
				json.Unmarshal(d.Authorization.Offer, &art)
				parts := strings.Split(art.Signature, ".")
				p, _ := base64.RawURLEncoding.DecodeString(parts[1])
				parts[1] = base64.RawURLEncoding.EncodeToString([]byte(strings.Replace(string(p), `"amount":"250000"`, `"amount":"250001"`, 1)))
				edited = strings.Replace(string(d.Authorization.Offer), art.Signature, strings.Join(parts, "."), 1)
			}
			if edited == string(d.Authorization.Offer) {
				t.Fatal("nothing edited")
			}
			if ok, signer := official("offer", json.RawMessage(edited)); ok && strings.EqualFold(signer, h.Seller) {
				t.Fatalf("@x402/extensions accepts an edited offer as the seller's")
			}
			tampered := filepath.Join(t.TempDir(), "tampered.json")
			var whole map[string]any
			json.Unmarshal(data, &whole)
			whole["authorization"].(map[string]any)["offer"] = json.RawMessage(edited)
			os.WriteFile(tampered, mustJSON(whole), 0o600)
			if out, _, code := runCLI(t, "dossier", "verify", tampered, "--keyring", keyring); code != 2 && code != 3 {
				t.Fatalf("an edited offer in the dossier: %d\n%s", code, out)
			}
		})
	}
}

// sealedOfferSwaps edits an honest dossier of an authorization whose
// receipt sealed the seller's offer, and checks that dossier verify
// refuses each edit with a TAMPERED offer seal link naming the field: the
// offer swapped for another the same seller signed for the same entry
// with other terms (another(validUntil) returns it), another signer
// recorded, the offer dropped, the seal dropped.
func sealedOfferSwaps(t *testing.T, file, keyring string, another func(validUntil int64) json.RawMessage) {
	t.Helper()
	orig, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Authorization struct {
			Offer json.RawMessage `json:"offer"`
		} `json:"authorization"`
	}
	json.Unmarshal(orig, &d)
	art, err := x402.ParseArtifact(d.Authorization.Offer, true)
	if err != nil {
		t.Fatal(err)
	}
	terms, _, err := x402.VerifyOffer(art, nil)
	if err != nil {
		t.Fatal(err)
	}
	edit := func(f func(a map[string]any)) []byte {
		var m map[string]any
		json.Unmarshal(orig, &m)
		f(m["authorization"].(map[string]any))
		return mustJSON(m)
	}
	swapped := another(terms.ValidUntil)
	for _, tc := range []struct {
		name, field string
		file        []byte
	}{
		{"another signed offer of the seller", "offer: the file's offer hashes to", edit(func(a map[string]any) { a["offer"] = swapped })},
		{"another signer", "offer_signer: the file records", edit(func(a map[string]any) {
			a["offer_signer"] = "0x1111111111111111111111111111111111111111 (EIP-712)"
		})},
		{"the offer dropped", "offer: receipt", edit(func(a map[string]any) { delete(a, "offer"); delete(a, "offer_signer") })},
		{"the seal dropped", "offer_seal: receipt", edit(func(a map[string]any) { delete(a, "offer_seal") })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "d.json")
			if err := os.WriteFile(p, tc.file, 0o600); err != nil {
				t.Fatal(err)
			}
			out, _, code := runCLI(t, "dossier", "verify", p, "--keyring", keyring)
			named := false
			for _, l := range strings.Split(out, "\n") {
				named = named || (strings.HasPrefix(l, "TAMPERED   offer seal ") && strings.Contains(l, tc.field))
			}
			if code != 2 || !named {
				t.Fatalf("exit %d, want 2 with a TAMPERED offer seal naming %q:\n%s", code, tc.field, out)
			}
		})
	}
}
