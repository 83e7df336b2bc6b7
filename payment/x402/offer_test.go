package x402

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/decred/dcrd/dcrec/secp256k1/v4"
	decdsa "github.com/decred/dcrd/dcrec/secp256k1/v4/ecdsa"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/sellerkey"
)

// offerTermsFor are the terms of v2Required's one entry.
func offerTermsFor(amount, payTo string) OfferTerms {
	return OfferTerms{Version: 1, ResourceURL: "https://api.example.com/data", Scheme: "exact", Network: "eip155:8453",
		Asset: baseUSDC, PayTo: payTo, Amount: amount, ValidUntil: 2000000000}
}

// eip712Offer signs t as the extension's EIP-712 offer with k.
func eip712Offer(t testing.TB, k *secp256k1.PrivateKey, terms OfferTerms) string {
	t.Helper()
	d := OfferDigest(terms)
	c := decdsa.SignCompact(k, d[:], false)
	sig := append(append([]byte{}, c[1:]...), c[0])
	payload, _ := json.Marshal(terms)
	return fmt.Sprintf(`{"format":"eip712","acceptIndex":0,"payload":%s,"signature":"0x%s"}`, payload, hex.EncodeToString(sig))
}

// jwsOffer signs payload as a JWS compact string with alg and sign.
func jwsCompact(alg, kid string, payload []byte, sign func([]byte) []byte) string {
	h := base64.RawURLEncoding.EncodeToString([]byte(fmt.Sprintf(`{"alg":%q,"kid":%q}`, alg, kid)))
	p := base64.RawURLEncoding.EncodeToString(payload)
	return h + "." + p + "." + base64.RawURLEncoding.EncodeToString(sign([]byte(h+"."+p)))
}

func withOffers(required string, offers ...string) string {
	return strings.TrimSuffix(strings.TrimSpace(required), "}") + `,"extensions":{"offer-receipt":{"info":{"offers":[` + strings.Join(offers, ",") + `]}}}}`
}

func p256JWK(pub *ecdsa.PublicKey) string {
	b := func(n []byte) string { return base64.RawURLEncoding.EncodeToString(n) }
	raw, _ := pub.Bytes()
	x, y := raw[1:33], raw[33:]
	return fmt.Sprintf(`{"kty":"EC","crv":"P-256","x":%q,"y":%q}`, b(x), b(y))
}

func TestCheckOffer(t *testing.T) {
	seller := testSigner(t)
	k, _ := ParseKey([]byte(testKeyHex), nil)
	sellerAddr := seller.Address().Hex()
	good := offerTermsFor("250000", payee)

	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p256Sign := func(in []byte) []byte {
		h := sha256.Sum256(in)
		r, s, _ := ecdsa.Sign(rand.Reader, p256, h[:])
		out := make([]byte, 64)
		r.FillBytes(out[:32])
		s.FillBytes(out[32:])
		return out
	}
	jwk, err := sellerkey.ParseJWK([]byte(p256JWK(&p256.PublicKey)))
	if err != nil {
		t.Fatal(err)
	}
	const webKID = "did:web:api.example.com#key-1"
	lookup := func(kid string) (sellerkey.Key, bool) { return jwk, kid == webKID }

	k1Sign := func(in []byte) []byte {
		h := sha256.Sum256(in)
		sig := decdsa.SignCompact(k, h[:], false)
		return sig[1:]
	}
	k1JWK := func() string {
		pub := k.PubKey().SerializeUncompressed()
		return fmt.Sprintf(`{"kty":"EC","crv":"secp256k1","x":%q,"y":%q}`, base64.RawURLEncoding.EncodeToString(pub[1:33]), base64.RawURLEncoding.EncodeToString(pub[33:]))
	}()
	k1KID := "did:jwk:" + base64.RawURLEncoding.EncodeToString([]byte(k1JWK)) + "#0"
	edPub, edPriv, _ := ed25519.GenerateKey(rand.Reader)
	edKID := "did:jwk:" + base64.RawURLEncoding.EncodeToString([]byte(fmt.Sprintf(`{"kty":"OKP","crv":"Ed25519","x":%q}`, base64.RawURLEncoding.EncodeToString(edPub))))

	jcs := func(o OfferTerms) []byte {
		// The JCS form: members sorted by name, no white space.
		return []byte(fmt.Sprintf(`{"amount":%q,"asset":%q,"network":%q,"payTo":%q,"resourceUrl":%q,"scheme":%q,"validUntil":%d,"version":%d}`,
			o.Amount, o.Asset, o.Network, o.PayTo, o.ResourceURL, o.Scheme, o.ValidUntil, o.Version))
	}
	jws := func(alg, kid string, o OfferTerms, sign func([]byte) []byte) string {
		return fmt.Sprintf(`{"format":"jws","acceptIndex":0,"signature":%q}`, jwsCompact(alg, kid, jcs(o), sign))
	}
	with := func(f func(*OfferTerms)) OfferTerms { o := good; f(&o); return o }

	tamperedPayload := strings.Replace(eip712Offer(t, k, good), `"amount":"250000"`, `"amount":"250001"`, 1)
	badSig := eip712Offer(t, k, good)
	badSig = badSig[:len(badSig)-6] + "00" + badSig[len(badSig)-4:]
	jwsGood := jws("ES256", webKID, good, p256Sign)
	parts := strings.Split(jwsCompact("ES256", webKID, jcs(good), p256Sign), ".")
	swapped := strings.Join([]string{parts[0], base64.RawURLEncoding.EncodeToString(jcs(with(func(o *OfferTerms) { o.ValidUntil = 2000000001 }))), parts[2]}, ".")

	cases := []struct {
		name     string
		required string
		resource string
		want     string // "" verified; else a word the problem names
		signer   string
	}{
		{"eip712 verified", withOffers(v2Required("250000", payee), eip712Offer(t, k, good)), "", "", sellerAddr},
		{"no offers", v2Required("250000", payee), "", "-", ""},
		{"the entry asks more than signed", withOffers(v2Required("300000", payee), eip712Offer(t, k, good)), "", "amount", ""},
		{"another payee", withOffers(v2Required("250000", sellerAddr), eip712Offer(t, k, good)), "", "payTo", ""},
		{"another asset", withOffers(v2Required("250000", payee), eip712Offer(t, k, with(func(o *OfferTerms) { o.Asset = payee }))), "", "asset", ""},
		{"another network", withOffers(v2Required("250000", payee), eip712Offer(t, k, with(func(o *OfferTerms) { o.Network = "eip155:1" }))), "", "network", ""},
		{"another scheme", withOffers(v2Required("250000", payee), eip712Offer(t, k, with(func(o *OfferTerms) { o.Scheme = "upto" }))), "", "scheme", ""},
		{"another resource", withOffers(v2Required("250000", payee), eip712Offer(t, k, with(func(o *OfferTerms) { o.ResourceURL = "https://api.example.com/other" }))), "", "resourceUrl", ""},
		{"the requested resource differs", withOffers(v2Required("250000", payee), eip712Offer(t, k, good)), "https://api.example.com/other", "resourceUrl", ""},
		{"expired", withOffers(v2Required("250000", payee), eip712Offer(t, k, with(func(o *OfferTerms) { o.ValidUntil = 1000 }))), "", "validUntil", ""},
		// EIP-712 recovers some address from any signature: an edited
		// payload or signature names another signer, never the seller's
		// (the policy's trust check then refuses it).
		{"payload edited after signing", withOffers(v2Required("250001", payee), tamperedPayload), "", "", "!" + sellerAddr},
		{"signature bytes edited", withOffers(v2Required("250000", payee), badSig), "", "", "!" + sellerAddr},
		{"jws ES256 with a named key", withOffers(v2Required("250000", payee), jwsGood), "", "", webKID},
		{"jws with an unknown did:web key", withOffers(v2Required("250000", payee), jws("ES256", "did:web:other.example#k", good, p256Sign)), "", "not known", ""},
		{"jws alg not the key's", withOffers(v2Required("250000", payee), jws("ES256K", webKID, good, p256Sign)), "", "alg", ""},
		{"jws payload swapped", withOffers(v2Required("250000", payee), fmt.Sprintf(`{"format":"jws","acceptIndex":0,"signature":%q}`, swapped)), "", "signature", ""},
		{"jws ES256K did:jwk", withOffers(v2Required("250000", payee), jws("ES256K", k1KID, good, k1Sign)), "", "", k1KID},
		{"jws EdDSA did:jwk", withOffers(v2Required("250000", payee), jws("EdDSA", edKID, good, func(in []byte) []byte { return ed25519.Sign(edPriv, in) })), "", "", edKID},
		{"jws none", withOffers(v2Required("250000", payee), jws("none", webKID, good, func([]byte) []byte { return nil })), "", "alg", ""},
		{"offers not a list", strings.TrimSuffix(strings.TrimSpace(v2Required("250000", payee)), "}") + `,"extensions":{"offer-receipt":{"info":{"offers":{}}}}}`, "", "cannot be read", ""},
		{"an unknown member", withOffers(v2Required("250000", payee), `{"format":"eip712","payload":{},"signature":"0x","extra":1}`), "", "cannot be read", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pr, err := Parse([]byte(tc.required))
			if err != nil {
				t.Fatal(err)
			}
			c, skipped := Select(pr, guard.DefaultConfig().Assets)
			if skipped != nil {
				t.Fatalf("skipped: %+v", skipped)
			}
			res := tc.resource
			if res == "" {
				res = "https://api.example.com/data"
			}
			oc := CheckOffer(pr, c, res, 1700000000, lookup)
			switch tc.want {
			case "-":
				if oc.Carried || oc.Problem != "" {
					t.Fatalf("no offers: %+v", oc)
				}
			case "":
				if oc.Problem != "" || oc.Signer == nil {
					t.Fatalf("want verified, got %q", oc.Problem)
				}
				got := oc.Signer.Address + oc.Signer.KID
				if not, ok := strings.CutPrefix(tc.signer, "!"); ok {
					if got == not {
						t.Fatalf("an edited offer still names the seller %s", got)
					}
				} else if got != tc.signer {
					t.Fatalf("signer %q, want %q", got, tc.signer)
				}
			default:
				if !oc.Carried || !strings.Contains(oc.Problem, tc.want) {
					t.Fatalf("problem %q, want it to name %q", oc.Problem, tc.want)
				}
			}
		})
	}
}

// The EIP-712 digests of the extension's offer and receipt, as viem's
// hashTypedData computes them (the values below were printed by
// @x402/extensions 2.27.0's hashOfferTypedData / hashReceiptTypedData for
// these payloads).
func TestOfferAndReceiptDigestVectors(t *testing.T) {
	o := OfferTerms{Version: 1, ResourceURL: "https://api.example.com/premium-data", Scheme: "exact", Network: "eip155:8453",
		Asset: "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", PayTo: "0x209693Bc6afc0C5328bA36FaF03C514EF312287C", Amount: "10000", ValidUntil: 1703123516}
	r := ReceiptTerms{Version: 1, Network: "eip155:8453", ResourceURL: "https://api.example.com/premium-data",
		Payer: "0x857b06519E91e3A54538791bDbb0E22373e36b66", IssuedAt: 1703123456}
	od, rd := OfferDigest(o), ReceiptDigest(r)
	if got := "0x" + hex.EncodeToString(od[:]); got != offerDigestVector {
		t.Errorf("offer digest %s, want %s", got, offerDigestVector)
	}
	if got := "0x" + hex.EncodeToString(rd[:]); got != receiptDigestVector {
		t.Errorf("receipt digest %s, want %s", got, receiptDigestVector)
	}
}

func TestParseArtifactIsStrict(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"format":"eip712","signature":"0x00"}`, "payload"},
		{`{"format":"jws","payload":{},"signature":"a.b.c"}`, "must not carry a payload"},
		{`{"format":"pgp","signature":"x"}`, "not eip712 or jws"},
		{`{"format":"jws","signature":"a.b.c","format":"jws"}`, "twice"},
		{`{"format":"jws","signature":""}`, "non-empty"},
		{`{"format":"jws","signature":"a.b.c","acceptIndex":-1}`, "acceptIndex"},
		{`{"format":"jws","signature":"a.b.c","Format":"x"}`, "does not define"},
	} {
		if _, err := ParseArtifact([]byte(tc.in), true); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.in, err, tc.want)
		}
	}
	// A receipt has no acceptIndex.
	if _, err := ParseArtifact([]byte(`{"format":"jws","signature":"a.b.c","acceptIndex":0}`), false); err == nil {
		t.Error("a receipt with acceptIndex was accepted")
	}
}

// FuzzOffers: whatever a seller's 402 carries under extensions, reading
// and checking its offers never panics, and an offer is never verified
// without a signature that verifies.
func FuzzOffers(f *testing.F) {
	k, _ := ParseKey([]byte(testKeyHex), nil)
	f.Add([]byte(withOffers(v2Required("250000", payee), eip712Offer(f, k, offerTermsFor("250000", payee)))))
	f.Add([]byte(withOffers(v2Required("250000", payee), `{"format":"jws","signature":"eyJhbGciOiJFUzI1NksiLCJraWQiOiJkaWQ6d2ViOmEifQ.eyJ2ZXJzaW9uIjoxfQ.c2ln"}`)))
	f.Add([]byte(withOffers(v2Required("1", payee), `{"format":"eip712","payload":{"version":1e400},"signature":"0x"}`)))
	f.Add([]byte(`{"x402Version":2,"resource":{"url":"https://a.example/"},"accepts":[{}],"extensions":{"offer-receipt":{"info":{"offers":[null]}}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		pr, err := Parse(data)
		if err != nil {
			return
		}
		for _, a := range pr.Offers.List {
			_, _ = a.ReceiptTerms()
			_, _, _ = VerifyReceipt(a, nil)
		}
		c, skipped := Select(pr, guard.DefaultConfig().Assets)
		if len(skipped) == len(pr.Accepts) {
			return
		}
		oc := CheckOffer(pr, c, "", 1700000000, nil)
		if oc.Problem == "" && oc.Carried && oc.Signer == nil {
			t.Fatalf("an offer passed without a verified signer: %+v", oc)
		}
	})
}

// FuzzArtifact: a receipt or offer handed in by an agent never panics
// the reader.
func FuzzArtifact(f *testing.F) {
	f.Add([]byte(`{"format":"eip712","payload":{"version":1,"network":"eip155:8453","resourceUrl":"https://a.example/","payer":"0x00","issuedAt":1},"signature":"0x00"}`))
	f.Add([]byte(`{"format":"jws","signature":"e30.e30.e30"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, offer := range []bool{true, false} {
			a, err := ParseArtifact(data, offer)
			if err != nil {
				continue
			}
			_, _, _ = VerifyOffer(a, nil)
			_, _, _ = VerifyReceipt(a, nil)
		}
	})
}

const (
	offerDigestVector   = "0x080c2947f96376213d3de762c32b1f56ba5869acdeb87c7a44b7be5d33d397ea"
	receiptDigestVector = "0x060dbcfb87035bac821d6baa07fdab2ec109e6f06deaa00e037c2c1f4fbe6f8b"
)

// FuzzSettlement: a PAYMENT-RESPONSE handed in by an agent never panics
// the reader, and a success always names a transaction hash and a payer.
func FuzzSettlement(f *testing.F) {
	f.Add(`{"success":true,"transaction":"0x` + strings.Repeat("ab", 32) + `","network":"eip155:8453","payer":"` + payee + `"}`)
	f.Add(`{"success":true,"transaction":"0x` + strings.Repeat("ab", 32) + `","network":"base","payer":"` + payee + `","extensions":{"offer-receipt":{"info":{"receipt":{"format":"jws","signature":"e30.e30.e30"}}}}}`)
	f.Add(base64.StdEncoding.EncodeToString([]byte(`{"success":false,"errorReason":"insufficient_funds","transaction":"","network":"base"}`)))
	f.Fuzz(func(t *testing.T, s string) {
		st, err := ParseSettlementArgument(s)
		if err != nil {
			return
		}
		if st.Success && (!txHashRE.MatchString(st.Transaction) || st.Payer == "") {
			t.Fatalf("a success without a transaction or payer: %+v", st)
		}
		if st.Receipt != nil {
			_, _, _ = VerifyReceipt(*st.Receipt, nil)
		}
	})
}
