package guard

import (
	"encoding/base64"
	"strings"
	"testing"
)

// A P-256 public key (RFC 7515 appendix A.3's).
const testJWK = `{"kty":"EC","crv":"P-256","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}`

func TestSignedOfferRule(t *testing.T) {
	payTo := strings.ToLower(addrB)
	other := "0xc0c0000000000000000000000000000000000003"
	kid := "did:web:api.example.com#key-1"
	keys := `"sellerKeys":{"api.example.com":["` + other + `",{"kid":"` + kid + `","jwk":` + testJWK + `}]}`
	tp := mustConfig(t, `{`+keys+`}`).SellerKeys[1].Key.Thumbprint
	tests := []struct {
		name   string
		cfg    string
		ev     *OfferEvidence
		want   string
		detail string
	}{
		{"no 402: nothing said", `{"requireSignedOffers":true}`, nil, Allow, ""},
		{"no offer, none required", `{}`, &OfferEvidence{}, Allow, ""},
		{"no offer, required of all", `{"requireSignedOffers":true}`, &OfferEvidence{}, Review, "requires a signed offer from api.example.com"},
		{"no offer, required of this host", `{"requireSignedOffers":["api.example.com"]}`, &OfferEvidence{}, Review, "requires"},
		{"no offer, required of its payee", `{"requireSignedOffers":["` + addrB + `"]}`, &OfferEvidence{}, Review, "requires"},
		{"no offer, required of another", `{"requireSignedOffers":["other.example"]}`, &OfferEvidence{}, Allow, ""},
		{"a problem is review", `{}`, &OfferEvidence{Carried: true, Problem: "amount: the offer signs \"1\""}, Review, "amount"},
		{"signed by the payee", `{}`, &OfferEvidence{Carried: true, Signer: payTo, SignerAddress: payTo}, Allow, "trusted"},
		{"signed by a stranger", `{}`, &OfferEvidence{Carried: true, Signer: other, SignerAddress: other}, Review, "neither the payTo"},
		{"signed by a named address", `{` + keys + `}`, &OfferEvidence{Carried: true, Signer: other, SignerAddress: other}, Allow, "trusted"},
		{"signed by a named JWS key", `{` + keys + `}`, &OfferEvidence{Carried: true, Signer: kid, SignerKID: kid, SignerThumbprint: tp}, Allow, "trusted"},
		{"a named kid with another key", `{` + keys + `}`, &OfferEvidence{Carried: true, Signer: kid, SignerKID: kid, SignerThumbprint: "x"}, Review, "neither"},
		{"a key named for another host", `{"sellerKeys":{"other.example":["` + other + `"]}}`, &OfferEvidence{Carried: true, Signer: other, SignerAddress: other}, Review, "neither"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := mustConfig(t, tc.cfg)
			req, err := ParseRequest(RawRequest{Counterparty: "api.example.com", PayTo: addrB, Amount: "0.25", Offer: tc.ev}, cfg)
			if err != nil {
				t.Fatal(err)
			}
			d := Decide(req, History{Runs: 1}, cfg, fixedNow)
			if d.Decision != tc.want {
				t.Fatalf("decision %s, want %s: %+v", d.Decision, tc.want, d.Reasons)
			}
			found := false
			for _, r := range d.Reasons {
				if r.Rule == RuleSignedOffer {
					found = true
					if !strings.Contains(r.Detail, tc.detail) {
						t.Fatalf("detail %q, want %q", r.Detail, tc.detail)
					}
				}
			}
			if found != (tc.detail != "") {
				t.Fatalf("signed_offer reason present %v: %+v", found, d.Reasons)
			}
		})
	}
}

func TestSignedOfferPolicyKeys(t *testing.T) {
	didJWK := "did:jwk:" + base64.RawURLEncoding.EncodeToString([]byte(testJWK))
	c := mustConfig(t, `{"sellerKeys":{"api.example.com":["`+didJWK+`"]},
		"tenants":{"acme":{"requireSignedOffers":true,"sellerKeys":{"api.example.com":["`+addrA+`"]}}}}`)
	if c.RequireSignedOffers || len(c.SellerKeys) != 1 {
		t.Fatalf("file layer: %+v", c)
	}
	acme := c.ForTenant("acme")
	if !acme.RequireSignedOffers || len(acme.SellerKeys) != 2 || len(c.SellerKeys) != 1 {
		t.Fatalf("tenant layer: require %v, %d keys (file keeps %d)", acme.RequireSignedOffers, len(acme.SellerKeys), len(c.SellerKeys))
	}
	if _, ok := c.SellerKeyFor(didJWK); !ok {
		t.Fatal("a did:jwk key is not found by its kid")
	}
	for _, tc := range []struct{ cfg, want string }{
		{`{"sellerKeys":{"api.example.com":["did:web:api.example.com#k"]}}`, "carries no key"},
		{`{"sellerKeys":{"api.example.com":[{"kid":"k","jwk":` + strings.Replace(testJWK, `"kty"`, `"d":"AA","kty"`, 1) + `}]}}`, "private key"},
		{`{"sellerKeys":{"api.example.com":[{"kid":"k"}]}}`, "both kid and jwk"},
		{`{"sellerKeys":{"api.example.com":["0x12"]}}`, "sellerKeys"},
		{`{"sellerKeys":{"api.example.com":[]}}`, "between 1 and 16"},
		{`{"sellerKeys":{"http://":["` + addrA + `"]}}`, "sellerKeys"},
		{`{"requireSignedOffers":"yes"}`, "true, false or a list"},
		{`{"sellerKeys":{"api.example.com":[{"kid":"k","jwk":{"kty":"RSA","crv":"x"}}]}}`, "is not read"},
	} {
		if _, err := ParseConfig([]byte(tc.cfg), ""); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.cfg, err, tc.want)
		}
	}
}
