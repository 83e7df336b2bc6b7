package dossier

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment/x402"
)

func p256Key(t *testing.T) (*ecdsa.PrivateKey, string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := k.PublicKey.Bytes()
	b := base64.RawURLEncoding.EncodeToString
	return k, fmt.Sprintf(`{"kty":"EC","crv":"P-256","x":%q,"y":%q}`, b(raw[1:33]), b(raw[33:]))
}

func es256(t *testing.T, k *ecdsa.PrivateKey, kid string, payload []byte) string {
	t.Helper()
	h := base64.RawURLEncoding.EncodeToString([]byte(fmt.Sprintf(`{"alg":"ES256","kid":%q}`, kid)))
	p := base64.RawURLEncoding.EncodeToString(payload)
	d := sha256.Sum256([]byte(h + "." + p))
	r, s, err := ecdsa.Sign(rand.Reader, k, d[:])
	if err != nil {
		t.Fatal(err)
	}
	sig := make([]byte, 64)
	r.FillBytes(sig[:32])
	s.FillBytes(sig[32:])
	return h + "." + p + "." + base64.RawURLEncoding.EncodeToString(sig)
}

// TestPinnedKeysOnlyTheKeyThatVerified: export carries a pinned key only
// when it verifies the artifact as the signer recorded; a policy that no
// longer pins that key (rotated, removed) carries none and says so; a
// did:jwk identifier, which carries its own key, is never carried.
func TestPinnedKeysOnlyTheKeyThatVerified(t *testing.T) {
	seller, sellerJWK := p256Key(t)
	_, otherJWK := p256Key(t)
	const kid = "did:web:api.seller.example#key-1"
	offerJCS := `{"amount":"1","asset":"0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913","network":"eip155:8453","payTo":"0x209693Bc6afc0C5328bA36FaF03C514EF312287C","resourceUrl":"https://api.seller.example/d","scheme":"exact","validUntil":0,"version":1}`
	raw := json.RawMessage(fmt.Sprintf(`{"format":"jws","acceptIndex":0,"signature":%q}`, es256(t, seller, kid, []byte(offerJCS))))
	policy := func(jwk string) *guard.Config {
		pol, err := guard.ParseConfig([]byte(`{"sellerKeys":{"api.seller.example":[{"kid":"`+kid+`","jwk":`+jwk+`}]}}`), "")
		if err != nil {
			t.Fatal(err)
		}
		return pol
	}
	art, _ := x402.ParseArtifact(raw, true)
	_, who, err := x402.VerifyOffer(art, policy(sellerJWK).SellerKeyFor)
	if err != nil {
		t.Fatal(err)
	}
	var warned []string
	warn := func(s string) { warned = append(warned, s) }
	arts := []artifact{{what: "seller's offer", raw: raw, signer: who.String(), offer: true}}
	got := pinnedKeys(policy(sellerJWK).SellerKeysPinned, arts, warn)
	if len(got) != 1 || got[0].KID != kid || got[0].Source != KeyPinnedByPolicy || len(warned) != 0 {
		t.Fatalf("the pinned key: %+v %v", got, warned)
	}
	var jwk map[string]string
	if err := json.Unmarshal(got[0].JWK, &jwk); err != nil || jwk["d"] != "" || jwk["kty"] != "EC" {
		t.Fatalf("the carried JWK %s: %v", got[0].JWK, err)
	}
	if got := pinnedKeys(policy(otherJWK).SellerKeysPinned, arts, warn); len(got) != 0 || len(warned) != 1 || !strings.Contains(warned[0], "no longer pins") {
		t.Fatalf("a rotated key: %+v %v", got, warned)
	}
	jwkKID := "did:jwk:" + base64.RawURLEncoding.EncodeToString([]byte(sellerJWK))
	own := json.RawMessage(fmt.Sprintf(`{"format":"jws","acceptIndex":0,"signature":%q}`, es256(t, seller, jwkKID, []byte(offerJCS))))
	if got := pinnedKeys(policy(sellerJWK).SellerKeysPinned, []artifact{{what: "seller's offer", raw: own, signer: "x", offer: true}}, warn); len(got) != 0 || len(warned) != 1 {
		t.Fatalf("a did:jwk key carried: %+v %v", got, warned)
	}
}
