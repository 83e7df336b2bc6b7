package console_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/console"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/softauthn"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/passkey"
)

// rig is a console over a real file store, with a server key sealing the
// guard's receipts and a trusted reviewers file on disk.
type rig struct {
	t         *testing.T
	log       *reviewlog.Log
	chains    *reviewlog.Chains
	reviewers string
	srv       *httptest.Server
	base      string // http://localhost:PORT/console/
	origin    string
	rpID      string
}

func newRig(t *testing.T) *rig {
	t.Helper()
	dir := t.TempDir()
	root, err := confined.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	reviewers := filepath.Join(t.TempDir(), "reviewers.json")
	pks := func() (reviewlog.Passkeys, error) {
		pk, err := reviewlog.LoadPasskeys(reviewers)
		if os.IsNotExist(err) || (err != nil && strings.Contains(err.Error(), "no such file")) {
			return reviewlog.Passkeys{}, nil
		}
		return pk, err
	}
	log := reviewlog.Open(root, reviewlog.Options{Reviewers: func() (reviewlog.Reviewers, error) { return reviewlog.Reviewers{}, nil }, Passkeys: pks})
	chains := &reviewlog.Chains{Signer: noa.NewKeySigner(key), Tenant: "t1"}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	u, _ := url.Parse("http://localhost:" + port + "/console/")
	c, err := console.New(console.Config{URL: u, Log: log, Passkeys: pks,
		Decider: engine.PasskeyDecider{Log: log, Chains: chains, Passkeys: pks}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(c.Handler())
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return &rig{t: t, log: log, chains: chains, reviewers: reviewers, srv: srv, base: u.String(), origin: "http://localhost:" + port, rpID: "localhost"}
}

// ask opens (or answers from) a review for question n as the engine does.
func (g *rig) ask(n int) reviewlog.AskOutcome {
	g.t.Helper()
	ctx := context.Background()
	q := guard.Question{Counterparty: "0xabc", Amount: fmt.Sprintf("0.%02d", n), Asset: "USDC", Template: "x402-buyer"}
	ph := fmt.Sprintf("hmac-sha256:%064x", n)
	out, err := g.log.Ask(ctx, reviewlog.AskRequest{Caller: "agent-1", Question: q, ParamsHash: ph, Decision: guard.Review,
		Reasons: []guard.Reason{{Rule: "open_payments", Detail: "an open paid operation"}}, ApprovalTTL: time.Hour, RejectionHold: time.Hour,
		MaxPending: 50, Tenant: "t1"},
		func(tx reviewlog.Tx, out reviewlog.AskOutcome) error {
			if out.Kind == reviewlog.AskOpened {
				d, err := reviewlog.TermsDraft(out.Review, tx.At)
				if err != nil {
					return err
				}
				if _, err := g.chains.Append(ctx, tx.Store, d); err != nil {
					return err
				}
			}
			verdict := noa.VerdictDeferred
			var rule *string
			switch out.Kind {
			case reviewlog.AskApproved:
				r := reviewlog.RuleHumanApproved
				verdict, rule = noa.VerdictAllowed, &r
			case reviewlog.AskRejected:
				verdict = noa.VerdictBlocked
			}
			_, err := g.chains.Append(ctx, tx.Store, noa.Draft{TS: tx.At, Agent: noa.Agent{ID: "agent-1", Principal: noa.PrincipalService},
				Action:     noa.Action{ID: reviewlog.ActionID(out.Review.ID), Canonical: reviewlog.ActionCanonical, RiskClass: "IRREVERSIBLE", ParamsHash: ph},
				Governance: noa.Governance{Mode: reviewlog.GovernanceMode, Verdict: verdict, RuleID: rule}})
			return err
		})
	if err != nil {
		g.t.Fatal(err)
	}
	return out
}

// browser is a client with a cookie jar that sends the console's Origin
// and its CSRF token, as the page's script does.
type browser struct {
	g      *rig
	c      *http.Client
	csrf   string
	origin string
	noCSRF bool
}

func (g *rig) browser() *browser {
	jar, _ := cookiejar.New(nil)
	b := &browser{g: g, c: &http.Client{Jar: jar}, origin: g.origin}
	b.get("")
	u, _ := url.Parse(g.base)
	for _, ck := range jar.Cookies(u) {
		if ck.Name == "haia_console_csrf" {
			b.csrf = ck.Value
		}
	}
	if b.csrf == "" {
		g.t.Fatal("the console set no CSRF cookie")
	}
	return b
}

func (b *browser) get(path string) (int, string) {
	b.g.t.Helper()
	resp, err := b.c.Get(b.g.base + path)
	if err != nil {
		b.g.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func (b *browser) post(path string, v any) (int, map[string]any) {
	b.g.t.Helper()
	data, _ := json.Marshal(v)
	req, _ := http.NewRequest("POST", b.g.base+path, bytes.NewReader(data))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Origin", b.origin)
	if !b.noCSRF {
		req.Header.Set("X-CSRF-Token", b.csrf)
	}
	resp, err := b.c.Do(req)
	if err != nil {
		b.g.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

func challengeOf(t *testing.T, opts map[string]any) []byte {
	t.Helper()
	pk, _ := opts["publicKey"].(map[string]any)
	s, _ := pk["challenge"].(string)
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) == 0 {
		t.Fatalf("no challenge in %v", opts)
	}
	return b
}

// enrol runs the enrolment ceremony through the console and, as the
// operator's command does, writes the collected credential into the file.
func (g *rig) enrol(b *browser, who string, a *softauthn.Authenticator) passkey.Credential {
	g.t.Helper()
	tok, err := console.NewEnrolToken(who, time.Now())
	if err != nil {
		g.t.Fatal(err)
	}
	if code, page := b.get("enrol?t=" + url.QueryEscape(tok)); code != 200 || !strings.Contains(page, "Register passkey") {
		g.t.Fatalf("enrol page: %d %s", code, page)
	}
	code, opts := b.post("api/enrol/begin", map[string]string{"token": tok})
	if code != 200 {
		g.t.Fatalf("enrol begin: %d %v", code, opts)
	}
	att, err := a.Attestation(g.rpID, g.origin, challengeOf(g.t, opts))
	if err != nil {
		g.t.Fatal(err)
	}
	code, res := b.post("api/enrol/finish", map[string]any{"token": tok, "credential": json.RawMessage(att)})
	if code != 200 {
		g.t.Fatalf("enrol finish: %d %v", code, res)
	}
	want, _ := passkey.Fingerprint(base64.RawURLEncoding.EncodeToString(a.COSEKey()))
	if res["fingerprint"] != want {
		g.t.Fatalf("fingerprint %v, want %s", res["fingerprint"], want)
	}
	// The operator's command collects it with the link's secret, once.
	collect := func() (int, map[string]any) {
		resp, err := http.Post(g.base+"api/enrol/collect", "application/json", strings.NewReader(fmt.Sprintf(`{"token":%q}`, tok)))
		if err != nil {
			g.t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	code, got := collect()
	if code != 200 {
		g.t.Fatalf("collect: %d %v", code, got)
	}
	if code, _ := collect(); code != http.StatusGone {
		g.t.Fatalf("second collect: %d, want 410", code)
	}
	raw, _ := json.Marshal(got["credential"])
	var cred passkey.Credential
	if err := json.Unmarshal(raw, &cred); err != nil {
		g.t.Fatal(err)
	}
	if cred.ID != a.CredentialID() || cred.Origin != g.origin || cred.RPID != g.rpID {
		g.t.Fatalf("collected %+v", cred)
	}
	if _, err := reviewlog.AddPasskey(g.reviewers, who, cred); err != nil {
		g.t.Fatal(err)
	}
	return cred
}

func (g *rig) signIn(b *browser, a *softauthn.Authenticator) (int, map[string]any) {
	g.t.Helper()
	code, opts := b.post("api/login/begin", map[string]any{})
	if code != 200 {
		g.t.Fatalf("login begin: %d %v", code, opts)
	}
	x, err := a.Assert(g.rpID, g.origin, challengeOf(g.t, opts))
	if err != nil {
		g.t.Fatal(err)
	}
	j, _ := x.JSON()
	return b.post("api/login/finish", map[string]any{"credential": json.RawMessage(j)})
}

// decide asks the decision's options and signs them with a.
func (g *rig) decide(b *browser, id, decision, note string, a *softauthn.Authenticator) (softauthn.Assertion, int, map[string]any) {
	g.t.Helper()
	code, opts := b.post("api/reviews/"+id+"/begin", map[string]string{"decision": decision, "note": note})
	if code != 200 {
		g.t.Fatalf("decide begin: %d %v", code, opts)
	}
	x, err := a.Assert(g.rpID, g.origin, challengeOf(g.t, opts))
	if err != nil {
		g.t.Fatal(err)
	}
	code, res := g.finish(b, id, decision, note, x)
	return x, code, res
}

func (g *rig) finish(b *browser, id, decision, note string, x softauthn.Assertion) (int, map[string]any) {
	j, _ := x.JSON()
	return b.post("api/reviews/"+id+"/finish", map[string]any{"decision": decision, "note": note, "credential": json.RawMessage(j)})
}

func (g *rig) receipts() int {
	g.t.Helper()
	rep, err := g.log.Audit(context.Background(), g.keyring())
	if err != nil {
		g.t.Fatal(err)
	}
	return rep.Receipts
}

func (g *rig) keyring() noa.Keyring {
	kr := noa.Keyring{}
	kr.Add(g.chains.Signer.KeyID(), g.chains.Signer.PublicKey())
	return kr
}

func TestConsoleEnrolSignInDecide(t *testing.T) {
	g := newRig(t)
	alice, _ := softauthn.New()
	mallory, _ := softauthn.New()
	b := g.browser()
	g.enrol(b, "alice", alice)

	r1 := g.ask(1).Review
	r2 := g.ask(2).Review

	// Not signed in: the queue is the sign-in page, decisions are refused.
	if code, page := b.get(""); code != 200 || !strings.Contains(page, "Sign in with passkey") {
		t.Fatalf("sign-in page: %d", code)
	}
	if code, _ := b.post("api/reviews/"+r1.ID+"/begin", map[string]string{"decision": "approved"}); code != http.StatusUnauthorized {
		t.Fatalf("decide without session: %d", code)
	}
	// A passkey not in the file cannot sign in.
	if code, res := g.signIn(b, mallory); code != http.StatusForbidden {
		t.Fatalf("unknown passkey signed in: %d %v", code, res)
	}
	// CSRF and Origin are checked on every state change.
	nocsrf := *b
	nocsrf.noCSRF = true
	if code, res := nocsrf.post("api/login/begin", map[string]any{}); code != http.StatusForbidden || !strings.Contains(fmt.Sprint(res["error"]), "CSRF") {
		t.Fatalf("missing CSRF: %d %v", code, res)
	}
	evil := *b
	evil.origin = "http://evil.example"
	if code, res := evil.post("api/login/begin", map[string]any{}); code != http.StatusForbidden || !strings.Contains(fmt.Sprint(res["error"]), "Origin") {
		t.Fatalf("foreign Origin: %d %v", code, res)
	}

	if code, res := g.signIn(b, alice); code != 200 || res["reviewer"] != "alice" {
		t.Fatalf("sign in: %d %v", code, res)
	}
	code, page := b.get("")
	if code != 200 || !strings.Contains(page, r1.ID) || !strings.Contains(page, r2.ID) {
		t.Fatalf("queue: %d %s", code, page)
	}
	if strings.Index(page, r2.ID) > strings.Index(page, r1.ID) {
		t.Fatal("the queue is not newest first")
	}
	code, page = b.get("reviews/" + r1.ID)
	for _, want := range []string{">Approve<", ">Reject<", `<label for="note">Note</label>`, r1.TermsHash, "open_payments"} {
		if code != 200 || !strings.Contains(page, want) {
			t.Fatalf("review page lacks %q (%d)", want, code)
		}
	}

	before := g.receipts()
	// A session alone decides nothing: an assertion over another challenge
	// (a sign-in's) is refused and writes nothing.
	_, lopts := b.post("api/login/begin", map[string]any{})
	x, _ := alice.Assert(g.rpID, g.origin, challengeOf(t, lopts))
	if code, res := g.finish(b, r1.ID, "approved", "ok", x); code != http.StatusForbidden {
		t.Fatalf("assertion over another challenge: %d %v", code, res)
	}
	// Wrong origin in the client data.
	code, opts := b.post("api/reviews/"+r1.ID+"/begin", map[string]string{"decision": "approved", "note": "ok"})
	if code != 200 {
		t.Fatal(code)
	}
	x, _ = alice.Assert(g.rpID, "http://localhost:1", challengeOf(t, opts))
	if code, res := g.finish(b, r1.ID, "approved", "ok", x); code != http.StatusForbidden || !strings.Contains(fmt.Sprint(res["error"]), "origin") {
		t.Fatalf("wrong origin: %d %v", code, res)
	}
	// Forged: mallory signs alice's challenge under alice's credential id.
	x, _ = mallory.Assert(g.rpID, g.origin, challengeOf(t, opts))
	x.CredentialID = alice.CredentialID()
	if code, res := g.finish(b, r1.ID, "approved", "ok", x); code != http.StatusForbidden {
		t.Fatalf("forged: %d %v", code, res)
	}
	// The note or decision changed after signing.
	x, _ = alice.Assert(g.rpID, g.origin, challengeOf(t, opts))
	if code, res := g.finish(b, r1.ID, "approved", "ok, and more", x); code != http.StatusForbidden {
		t.Fatalf("edited note: %d %v", code, res)
	}
	if code, res := g.finish(b, r1.ID, "rejected", "ok", x); code != http.StatusForbidden {
		t.Fatalf("flipped decision: %d %v", code, res)
	}
	if n := g.receipts(); n != before {
		t.Fatalf("refused decisions wrote %d receipts", n-before)
	}
	// Re-targeted: the valid assertion for r1 sent for r2.
	if code, res := g.finish(b, r2.ID, "approved", "ok", x); code != http.StatusForbidden {
		t.Fatalf("re-targeted: %d %v", code, res)
	}
	// The real one.
	if code, res := g.finish(b, r1.ID, "approved", "ok", x); code != 200 || res["status"] != "approved" || res["decided_by"] != "alice" {
		t.Fatalf("approve: %d %v", code, res)
	}
	// Replayed: refused, nothing written.
	after := g.receipts()
	if code, res := g.finish(b, r1.ID, "approved", "ok", x); code != http.StatusConflict {
		t.Fatalf("replay: %d %v", code, res)
	}
	if n := g.receipts(); n != after {
		t.Fatal("a replay wrote a receipt")
	}
	rv, _, err := g.log.Verified(context.Background(), r1.ID)
	if err != nil || rv.Status != reviewlog.Approved || rv.DecidedBy != "alice" || rv.DecidedWith != reviewlog.DecidedWithPasskey || rv.Tampered {
		t.Fatalf("verified r1: %+v %v", rv, err)
	}
	if v2, _, _ := g.log.Verified(context.Background(), r2.ID); v2.Status != reviewlog.Pending {
		t.Fatalf("r2 is %s", v2.Status)
	}
	// The agent's identical question is honoured once.
	if k := g.ask(1).Kind; k != reviewlog.AskApproved {
		t.Fatalf("identical question after approval: %s", k)
	}
	if k := g.ask(1).Kind; k == reviewlog.AskApproved {
		t.Fatal("the approval was honoured twice")
	}
	// Reject r2.
	if _, code, res := g.decide(b, r2.ID, "rejected", "no", alice); code != 200 || res["status"] != "rejected" {
		t.Fatalf("reject: %d %v", code, res)
	}
	// The audit agrees, and every chain verifies with the NOA verifier.
	rep, err := g.log.Audit(context.Background(), g.keyring())
	if err != nil || len(rep.Findings) != 0 || rep.Malformed {
		t.Fatalf("audit: %+v %v", rep, err)
	}
	// Removing alice's passkey from the file: her decisions no longer
	// count, and her session reads nothing.
	if n, err := reviewlog.RemovePasskeys(g.reviewers, "alice", ""); err != nil || n != 1 {
		t.Fatalf("remove: %d %v", n, err)
	}
	if rv, _, _ := g.log.Verified(context.Background(), r1.ID); rv.Status == reviewlog.Approved {
		t.Fatal("an approval by a removed passkey still counts")
	}
	if _, page := b.get(""); !strings.Contains(page, "Sign in with passkey") {
		t.Fatal("a removed reviewer's session still reads the queue")
	}
}

func TestConsoleHeadersAndCookies(t *testing.T) {
	g := newRig(t)
	resp, err := http.Get(g.base)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	csp := resp.Header.Get("Content-Security-Policy")
	for _, want := range []string{"default-src 'none'", "script-src 'self'", "frame-ancestors 'none'"} {
		if !strings.Contains(csp, want) {
			t.Fatalf("CSP %q lacks %q", csp, want)
		}
	}
	if strings.Contains(csp, "unsafe-inline") {
		t.Fatal("CSP allows inline script")
	}
	var saw bool
	for _, ck := range resp.Cookies() {
		if ck.Name == "haia_console_csrf" {
			saw = true
			if !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Secure {
				t.Fatalf("csrf cookie %+v", ck)
			}
		}
	}
	if !saw {
		t.Fatal("no CSRF cookie")
	}
	// The sign-in endpoints are rate limited.
	b := g.browser()
	limited := false
	for range 40 {
		if code, _ := b.post("api/login/begin", map[string]any{}); code == http.StatusTooManyRequests {
			limited = true
			break
		}
	}
	if !limited {
		t.Fatal("40 sign-in attempts in a row were never limited")
	}
	// Plain http off loopback is refused.
	u, _ := url.Parse("http://reviews.example.com/console/")
	if _, err := console.New(console.Config{URL: u, Log: g.log, Passkeys: func() (reviewlog.Passkeys, error) { return nil, nil },
		Decider: engine.PasskeyDecider{Log: g.log, Chains: g.chains}}); err == nil || !strings.Contains(err.Error(), "TLS") {
		t.Fatalf("plain http off loopback: %v", err)
	}
}
