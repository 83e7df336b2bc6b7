package console_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"strings"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/console"
	"github.com/haia-trace-mcp/haia-trace-mcp/dossier"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/sellerkey"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/softauthn"
	"github.com/haia-trace-mcp/haia-trace-mcp/payment/x402"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

const testPayerKey = "4c0883a69102937d6231471b5dbb6204fe5129617082792ae468d01a3f362318"

// authorize records, as authorize_payment does, a payment signed after
// review id was approved: the agent asks again (the approval answers,
// ALLOWED), the payer signs an EIP-3009 authorization whose nonce derives
// from that decision receipt, and its receipt is sealed into the chain.
func (g *rig) authorize(id string, n int, edit ...func(*reviewlog.Authorized)) reviewlog.Authorized {
	g.t.Helper()
	ctx := context.Background()
	if out := g.ask(n); out.Kind != reviewlog.AskApproved {
		g.t.Fatalf("asked again after the approval: %v", out.Kind)
	}
	var decision string
	g.log.Store().View(ctx, func(r reviewlog.Reader) error {
		head, err := reviewlog.ChainHead(ctx, r, g.chains.ChainID())
		if err == nil {
			decision = head.ID
		}
		return err
	})
	k, err := x402.ParseKey([]byte(testPayerKey), nil)
	if err != nil {
		g.t.Fatal(err)
	}
	payer := x402.NewKeySigner(k)
	token, _ := x402.ParseAddress("0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913")
	to, _ := x402.ParseAddress("0x00000000000000000000000000000000000abc01")
	dom := x402.Domain{Name: "USD Coin", Version: "2", ChainID: big.NewInt(8453), VerifyingContract: token}
	au := x402.Authorization{From: payer.Address(), To: to, Value: big.NewInt(int64(n) * 10000), ValidAfter: big.NewInt(0), ValidBefore: big.NewInt(4102444800), Nonce: x402.NonceFor(decision)}
	digest, err := x402.Digest(dom, au)
	if err != nil {
		g.t.Fatal(err)
	}
	sig, err := payer.SignAuthorization(ctx, dom, au)
	if err != nil {
		g.t.Fatal(err)
	}
	a := reviewlog.Authorized{DecisionReceipt: decision, ReviewID: id, Network: "eip155:8453", Token: token.Hex(), Name: dom.Name, Version: dom.Version,
		From: payer.Address().Hex(), To: to.Hex(), Value: au.Value.String(), ValidAfter: "0", ValidBefore: "4102444800",
		Nonce: "0x" + hex.EncodeToString(au.Nonce[:]), Signature: "0x" + hex.EncodeToString(sig[:]), Digest: "0x" + hex.EncodeToString(digest[:])}
	for _, e := range edit {
		e(&a)
	}
	a, err = g.log.RecordAuthorization(ctx, "agent-1", a, func(tx reviewlog.Tx) (string, error) {
		rule := engine.RuleAuthorizationSigned
		rc, err := g.chains.Append(ctx, tx.Store, noa.Draft{TS: tx.At, Agent: noa.Agent{ID: "agent-1", Principal: noa.PrincipalService},
			Action: noa.Action{ID: "x402-authorization:" + a.Nonce, Canonical: reviewlog.CanonicalAuthorizationSigned,
				RiskClass: "IRREVERSIBLE", ParamsHash: engine.AuthorizationParamsHash(digest)},
			Governance: noa.Governance{Mode: "on", Verdict: noa.VerdictAllowed, RuleID: &rule}})
		if err != nil {
			return "", err
		}
		return rc.ID, nil
	})
	if err != nil {
		g.t.Fatal(err)
	}
	return a
}

// TestConsoleDossier: a review whose approval a signed payment used links
// to that payment's dossier; the signed-in reviewer downloads it, built
// by package dossier with the chains' heads signed by the server's key,
// and it verifies VALID offline under the server's keyring. Nobody else
// gets it: not signed in, another tenant's console and its reviewer, a
// nonce of another review, all answer the same 404.
func TestConsoleDossier(t *testing.T) {
	g := newRig(t)
	alice, _ := softauthn.New()
	b := g.browser()
	g.enrol(b, "alice", alice)
	rv := g.ask(7).Review
	other := g.ask(8).Review
	if code, res := g.signIn(b, alice); code != 200 {
		t.Fatalf("sign in: %d %v", code, res)
	}
	if _, code, res := g.decide(b, rv.ID, "approved", "fine", alice); code != 200 {
		t.Fatalf("approve: %d %v", code, res)
	}
	if _, page := b.get("reviews/" + rv.ID); strings.Contains(page, "/dossier/") {
		t.Fatal("a link to a dossier before any payment was signed")
	}
	a := g.authorize(rv.ID, 7)
	path := "reviews/" + rv.ID + "/dossier/" + a.Nonce

	code, page := b.get("reviews/" + rv.ID)
	if code != 200 || !strings.Contains(page, `href="/console/`+path+`"`) || !strings.Contains(page, "Download its dossier") {
		t.Fatalf("the review page has no link to the dossier (%d):\n%s", code, page)
	}
	req, _ := http.NewRequest("GET", g.base+path, nil)
	resp, err := b.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" ||
		resp.Header.Get("Content-Disposition") != `attachment; filename="dossier-`+a.Nonce+`.json"` {
		t.Fatalf("download: %d %v\n%s", resp.StatusCode, resp.Header, body)
	}
	links := dossier.Verify(body, g.keyring(), nil)
	var lines []string
	for _, l := range links {
		lines = append(lines, l.Verdict+" "+l.Link+" "+l.Reason)
	}
	if w := dossier.Worst(links); w != dossier.Valid || !strings.Contains(strings.Join(lines, "\n"), "VALID checkpoint ") ||
		!strings.Contains(strings.Join(lines, "\n"), "VALID human decision") {
		t.Fatalf("the console's dossier verifies %s:\n%s", w, strings.Join(lines, "\n"))
	}

	// Held to the trusted reviewers file, alice's passkey decision counts
	// (its seal checked under the keyring given).
	trust, err := reviewlog.LoadReviewerTrust(g.reviewers, "")
	if err != nil {
		t.Fatal(err)
	}
	if links := dossier.Verify(body, g.keyring(), &trust); dossier.Worst(links) != dossier.Valid {
		t.Fatalf("held to the reviewers file: %+v", links)
	}

	// Nobody else gets it, and every refusal is the same 404.
	notFound := func(name string, b *browser, path string) {
		t.Helper()
		code, body := b.get(path)
		if code != http.StatusNotFound || strings.Contains(body, dossier.Format) || strings.Contains(body, a.Nonce) {
			t.Fatalf("%s: %d %s", name, code, body)
		}
	}
	notFound("not signed in", g.browser(), path)
	notFound("a nonce the review did not authorize", b, "reviews/"+other.ID+"/dossier/"+a.Nonce)
	notFound("an unknown nonce", b, "reviews/"+rv.ID+"/dossier/0x"+strings.Repeat("00", 32))
	notFound("an unknown review", b, "reviews/"+strings.Repeat("0", 32)+"/dossier/"+a.Nonce)

	// Another tenant's console: its own log and reviewers. Its reviewer
	// signed in there asks it for this tenant's dossier; alice's session
	// is not one there.
	g2 := newRig(t)
	bob, _ := softauthn.New()
	b2 := g2.browser()
	g2.enrol(b2, "bob", bob)
	if code, res := g2.signIn(b2, bob); code != 200 {
		t.Fatalf("bob signs in: %d %v", code, res)
	}
	notFound("another tenant's reviewer", b2, path)
	stolen := *b2
	stolen.c = b.c
	notFound("this tenant's session at another tenant's console", &stolen, path)
}

// TestConsoleDossierCarriesPinnedKey: the console's dossier of a payment
// whose seller signed its offer as JWS (ES256) under a did:web key
// identifier carries the key the policy in force pins for it, and verifies
// VALID offline saying the key was pinned, not resolved; without the
// policy's key it carries none and the offer is UNVERIFIED.
func TestConsoleDossierCarriesPinnedKey(t *testing.T) {
	sk, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := sk.PublicKey.Bytes()
	b64 := base64.RawURLEncoding.EncodeToString
	jwk := fmt.Sprintf(`{"kty":"EC","crv":"P-256","x":%q,"y":%q}`, b64(raw[1:33]), b64(raw[33:]))
	const kid = "did:web:api.seller.example#key-1"
	pol, err := guard.ParseConfig([]byte(`{"sellerKeys":{"api.seller.example":[{"kid":"`+kid+`","jwk":`+jwk+`}]}}`), "")
	if err != nil {
		t.Fatal(err)
	}
	offer := func(a *reviewlog.Authorized) {
		payload := fmt.Sprintf(`{"amount":%q,"asset":%q,"network":"eip155:8453","payTo":%q,"resourceUrl":"https://api.seller.example/data","scheme":"exact","validUntil":0,"version":1}`, a.Value, a.Token, a.To)
		h := b64([]byte(fmt.Sprintf(`{"alg":"ES256","kid":%q}`, kid)))
		p := b64([]byte(payload))
		d := sha256.Sum256([]byte(h + "." + p))
		r, s, err := ecdsa.Sign(rand.Reader, sk, d[:])
		if err != nil {
			t.Fatal(err)
		}
		sig := make([]byte, 64)
		r.FillBytes(sig[:32])
		s.FillBytes(sig[32:])
		a.Offer = json.RawMessage(fmt.Sprintf(`{"format":"jws","acceptIndex":0,"signature":%q}`, h+"."+p+"."+b64(sig)))
		art, err := x402.ParseArtifact(a.Offer, true)
		if err != nil {
			t.Fatal(err)
		}
		_, who, err := x402.VerifyOffer(art, pol.SellerKeyFor)
		if err != nil {
			t.Fatal(err)
		}
		a.OfferSigner = who.String()
	}
	for _, tc := range []struct {
		name    string
		keys    func(string) []sellerkey.Key
		verdict string
		saying  string
	}{
		{"the policy pins the key", pol.SellerKeysPinned, dossier.Valid, "pinned by the operator's policy (sellerKeys), not resolved from " + kid},
		{"no policy key", nil, dossier.Unverified, "not known here"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newRig(t, func(c *console.Config) { c.SellerKeys = tc.keys })
			alice, _ := softauthn.New()
			b := g.browser()
			g.enrol(b, "alice", alice)
			rv := g.ask(7).Review
			if code, res := g.signIn(b, alice); code != 200 {
				t.Fatalf("sign in: %d %v", code, res)
			}
			if _, code, res := g.decide(b, rv.ID, "approved", "fine", alice); code != 200 {
				t.Fatalf("approve: %d %v", code, res)
			}
			a := g.authorize(rv.ID, 7, offer)
			code, body := b.get("reviews/" + rv.ID + "/dossier/" + a.Nonce)
			if code != 200 {
				t.Fatalf("download: %d %s", code, body)
			}
			links := dossier.Verify([]byte(body), g.keyring(), nil)
			var lines []string
			for _, l := range links {
				lines = append(lines, l.Verdict+" "+l.Link+" "+l.Reason)
			}
			all := strings.Join(lines, "\n")
			if w := dossier.Worst(links); w != tc.verdict || !strings.Contains(all, tc.saying) {
				t.Fatalf("the console's dossier verifies %s, want %s saying %q:\n%s", w, tc.verdict, tc.saying, all)
			}
		})
	}
}
