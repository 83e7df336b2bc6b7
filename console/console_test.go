package console_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/console"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/softauthn"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/filestore"
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
	enrolKey  []byte // signs the rig's enrolment links, as the operator's command does
	// approvals is the quorum the rig's questions are asked under (0: one).
	approvals int
	// amountAtomic completes the terms of the questions asked next ("":
	// none).
	amountAtomic string
	// dir is the store's root.
	dir string
}

func newRig(t *testing.T, opts ...func(*console.Config)) *rig {
	t.Helper()
	return newReplicas(t, 1, opts...)
}

// newReplicas is a rig of n consoles, each with its own review log over
// the one store (as replicas are), behind one address that sends each
// request to the next console in turn.
func newReplicas(t *testing.T, n int, opts ...func(*console.Config)) *rig {
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
	openLog := func() *reviewlog.Log {
		// The reviewers' own keys, as the server reads them (none unless a
		// test adds one).
		keys := func() (reviewlog.Reviewers, error) {
			rs, err := reviewlog.LoadReviewers(reviewers)
			if os.IsNotExist(err) || (err != nil && strings.Contains(err.Error(), "no such file")) {
				return reviewlog.Reviewers{}, nil
			}
			return rs, err
		}
		return reviewlog.OpenStore(filestore.New(root), reviewlog.Options{Reviewers: keys, Passkeys: pks})
	}
	log := openLog()
	chains := &reviewlog.Chains{Signer: noa.NewKeySigner(key), Tenant: "t1"}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	u, _ := url.Parse("http://localhost:" + port + "/console/")
	enrolKey := console.EnrolKey([]byte("the rig's guard key"))
	var handlers []http.Handler
	for i := range n {
		l := log
		if i > 0 {
			l = openLog()
		}
		cfg := console.Config{URL: u, Log: l, Passkeys: pks,
			Decider:      engine.PasskeyDecider{Log: l, Chains: &reviewlog.Chains{Signer: chains.Signer, Tenant: "t1"}, Passkeys: pks},
			PollInterval: 20 * time.Millisecond, EnrolKey: enrolKey}
		for _, o := range opts {
			o(&cfg)
		}
		c, err := console.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		ran := make(chan struct{})
		go func() { c.Run(ctx); close(ran) }()
		t.Cleanup(func() { cancel(); <-ran })
		handlers = append(handlers, c.Handler())
	}
	var next atomic.Uint64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handlers[int(next.Add(1)-1)%len(handlers)].ServeHTTP(w, r)
	}))
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return &rig{t: t, log: log, chains: chains, reviewers: reviewers, srv: srv, base: u.String(), origin: "http://localhost:" + port, rpID: "localhost", enrolKey: enrolKey, dir: dir}
}

// ask opens (or answers from) a review for question n as the engine does.
func (g *rig) ask(n int) reviewlog.AskOutcome {
	g.t.Helper()
	q := guard.Question{Counterparty: "0xabc", Amount: fmt.Sprintf("0.%02d", n), Asset: "USDC", Template: "x402-buyer"}
	return g.askAs("agent-1", q, []guard.Reason{{Rule: "open_payments", Detail: "an open paid operation"}}, n)
}

// askAs is ask for caller's question q with reasons.
func (g *rig) askAs(caller string, q guard.Question, reasons []guard.Reason, n int) reviewlog.AskOutcome {
	g.t.Helper()
	ctx := context.Background()
	ph := fmt.Sprintf("hmac-sha256:%064x", n)
	out, err := engine.Ask(ctx, g.log, engine.AskRequest{Caller: caller, Question: q, ParamsHash: ph, Decision: guard.Review,
		Reasons: reasons, ApprovalTTL: time.Hour, RejectionHold: time.Hour,
		MaxPending: 50, Tenant: "t1", Approvals: g.approvals, AmountAtomic: g.amountAtomic},
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
			_, err := g.chains.Append(ctx, tx.Store, noa.Draft{TS: tx.At, Agent: noa.Agent{ID: caller, Principal: noa.PrincipalService},
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
	// header is sent with every request (a proxy's X-Forwarded-For).
	header http.Header
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
	req, _ := http.NewRequest("GET", b.g.base+path, nil)
	for k, v := range b.header {
		req.Header[k] = v
	}
	resp, err := b.c.Do(req)
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
	for k, v := range b.header {
		req.Header[k] = v
	}
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
	tok, err := console.NewEnrolToken(g.enrolKey, who, time.Now())
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
	for _, want := range []string{">Approve<", ">Reject<", `<label for="note">Note</label>`, r1.TermsHash, "open payments"} {
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
	// The sign-in endpoints are rate limited (a sign-in's begin holds
	// nothing and is not).
	b := g.browser()
	limited := false
	for range 40 {
		if code, _ := b.post("api/login/finish", map[string]any{"credential": map[string]any{}}); code == http.StatusTooManyRequests {
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
	// A tenant's console lives under t/<tenant>/; a tenant that is no slug is refused.
	lu, _ := url.Parse("http://localhost:8787/console/")
	for _, tc := range []struct{ tenant, want string }{{"acme", "http://localhost:8787/console/t/acme/reviews/r1"}, {"../globex", ""}, {"a/b", ""}} {
		c, err := console.New(console.Config{URL: lu, Tenant: tc.tenant, Log: g.log, Passkeys: func() (reviewlog.Passkeys, error) { return nil, nil },
			Decider: engine.PasskeyDecider{Log: g.log, Chains: g.chains}})
		if tc.want == "" {
			if err == nil {
				t.Errorf("tenant %q was accepted", tc.tenant)
			}
			continue
		}
		if err != nil {
			t.Errorf("tenant %q: %v", tc.tenant, err)
		} else if got := c.ReviewURL("r1"); got != tc.want {
			t.Errorf("tenant %q: review URL %q, want %q", tc.tenant, got, tc.want)
		}
	}
}

// TestConsoleRefusesClonedPasskey: an authenticator whose signature
// counter does not grow past what the console and the chains saw is a
// clone; it can neither sign in nor decide, and nothing is written.
func TestConsoleRefusesClonedPasskey(t *testing.T) {
	g := newRig(t)
	alice, _ := softauthn.New()
	b := g.browser()
	g.enrol(b, "alice", alice)
	r1 := g.ask(1).Review
	r2 := g.ask(2).Review
	if code, res := g.signIn(b, alice); code != 200 {
		t.Fatalf("sign in: %d %v", code, res)
	}
	if _, code, res := g.decide(b, r1.ID, "approved", "ok", alice); code != 200 {
		t.Fatalf("approve: %d %v", code, res)
	}
	// The copy of alice's key, with its counter where it was when copied
	// (before her last two signatures).
	clone := *alice
	clone.Counter = alice.Counter - 2
	cb := g.browser()
	code, res := g.signIn(cb, &clone)
	if code != http.StatusForbidden || !strings.Contains(fmt.Sprint(res["error"]), "cloned") {
		t.Fatalf("a cloned passkey signed in: %d %v", code, res)
	}
	// The clone's assertion sent through alice's session is refused too,
	// and writes nothing.
	before := g.receipts()
	_, code, res = g.decide(b, r2.ID, "approved", "", &clone)
	if code != http.StatusForbidden || !strings.Contains(fmt.Sprint(res["error"]), "cloned") {
		t.Fatalf("a cloned passkey decided: %d %v", code, res)
	}
	if n := g.receipts(); n != before {
		t.Fatalf("a refused clone wrote %d receipts", n-before)
	}
	// A fresh console (a restart, another replica) reads the last counter
	// from the chains: the clone is still refused.
	d := engine.PasskeyDecider{Log: g.log, Chains: g.chains, Passkeys: func() (reviewlog.Passkeys, error) { return reviewlog.LoadPasskeys(g.reviewers) }}
	dh, _ := reviewlog.DecisionHash(r2.TermsHash, "approved", "")
	ch, _ := passkey.Challenge(dh)
	clone.Counter = 0
	x, _ := clone.Assert(g.rpID, g.origin, ch)
	if _, err := d.Decide(context.Background(), r2.ID, "approved", "", asPasskey(x)); err == nil || !strings.Contains(err.Error(), "cloned") {
		t.Fatalf("decider without the console's memory: %v", err)
	}
	// Alice's own authenticator goes on.
	if _, code, res := g.decide(b, r2.ID, "rejected", "no", alice); code != 200 {
		t.Fatalf("alice after the clone was refused: %d %v", code, res)
	}
	rep, err := g.log.Audit(context.Background(), g.keyring())
	if err != nil || len(rep.Findings) != 0 {
		t.Fatalf("audit: %+v %v", rep, err)
	}
}

// TestAuditFindsCounterThatDidNotGrow: a chain holding two decisions by
// one passkey whose counters do not grow (as a server without the check,
// or a forged line signed by a clone, would leave) is a finding.
func TestAuditFindsCounterThatDidNotGrow(t *testing.T) {
	g := newRig(t)
	alice, _ := softauthn.New()
	b := g.browser()
	g.enrol(b, "alice", alice)
	ctx := context.Background()
	for n := 1; n <= 2; n++ {
		r := g.ask(n).Review
		alice.Counter = 5 // both assertions carry counter 6
		_, err := g.log.DecideReview(ctx, r.ID, reviewlog.Approved, "", "alice", func(tx reviewlog.Tx) error {
			ph, err := reviewlog.DecisionParamsHash(tx.Review, tx.Review.Status)
			if err != nil {
				return err
			}
			ch, _ := passkey.Challenge(ph)
			x, err := alice.Assert(g.rpID, g.origin, ch)
			if err != nil {
				return err
			}
			draft, err := engine.HumanDecisionDraft(tx.Review)
			if err != nil {
				return err
			}
			model := passkey.EncodeModel(asPasskey(x))
			draft.Agent.Model = &model
			_, err = g.chains.Append(ctx, tx.Store, draft)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	rep, err := g.log.Audit(ctx, g.keyring())
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Findings) != 1 || !strings.Contains(rep.Findings[0], "signature counter 6, not above the 6") || !strings.Contains(rep.Findings[0], "cloned") {
		t.Fatalf("audit findings: %q", rep.Findings)
	}
}

// invisible reports a rune no console page may carry raw: controls (but
// the layout's \n \r \t), bidi controls, zero-width and tag characters,
// written out independently of termsafe.
func invisible(r rune) bool {
	switch {
	case r == '\n', r == '\r', r == '\t':
		return false
	case r < 0x20, r >= 0x7f && r <= 0x9f:
		return true
	case r == 0x061c, r == 0x200e, r == 0x200f, r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	case r >= 0x200b && r <= 0x200d, r == 0x2060, r == 0xfeff, r == 0x00ad, r == 0x180e, r == 0x2028, r == 0x2029:
		return true
	case r >= 0xe0000 && r <= 0xe007f:
		return true
	}
	return false
}

// TestConsolePagesShowNoInvisibleCharacters: what an agent wrote (its
// caller name, the resource, a reason's detail) and what a reviewer wrote
// (a note) reach the page with every bidi control and invisible character
// shown as a visible escape.
func TestConsolePagesShowNoInvisibleCharacters(t *testing.T) {
	g := newRig(t)
	alice, _ := softauthn.New()
	b := g.browser()
	g.enrol(b, "alice", alice)
	q := guard.Question{Counterparty: "0xabc", Amount: "0.05", Asset: "USDC", Template: "x402-buyer"}
	r := g.askAs("agent\u2066-1\u2069", q, []guard.Reason{{Rule: "open_payments", Detail: "pay\u200b now\u00ad\U000e0041"}}, 7).Review
	other := g.ask(8).Review
	if code, res := g.signIn(b, alice); code != 200 {
		t.Fatalf("sign in: %d %v", code, res)
	}
	if _, code, res := g.decide(b, other.ID, "approved", "fine\u202e by me\u200d", alice); code != 200 {
		t.Fatalf("approve: %d %v", code, res)
	}
	for _, path := range []string{"", "reviews/" + r.ID, "reviews/" + other.ID} {
		code, page := b.get(path)
		if code != 200 {
			t.Fatalf("%s: %d", path, code)
		}
		checkNoInline(t, path, page)
		for i, ru := range page {
			if invisible(ru) {
				t.Fatalf("page %q holds %U at byte %d: …%s…", path, ru, i, page[max(0, i-40):min(len(page), i+40)])
			}
		}
		switch path {
		case "reviews/" + r.ID:
			for _, want := range []string{`agent\u2066-1\u2069`, `pay\u200b now\u00ad\U000e0041`} {
				if !strings.Contains(page, want) {
					t.Fatalf("review page lacks the visible %q", want)
				}
			}
		case "reviews/" + other.ID:
			if !strings.Contains(page, `fine\u202e by me\u200d`) {
				t.Fatal("the note's bidi control is not shown escaped")
			}
		}
	}
}

var (
	scriptTag   = regexp.MustCompile(`(?i)<script\b[^>]*>`)
	emptyScript = regexp.MustCompile(`(?i)<script\b[^>]*></script>`)
	inlineEvent = regexp.MustCompile(`(?i)<[^>]+\son[a-z]+\s*=`)
	inlineStyle = regexp.MustCompile(`(?i)<style\b|<[^>]+\sstyle\s*=`)
)

// checkNoInline fails when a page carries script or style the CSP would
// have to allow inline: every script is the embedded one by src, no event
// handler attribute, no style element or attribute, no javascript: URL.
func checkNoInline(t *testing.T, path, page string) {
	t.Helper()
	for _, tag := range scriptTag.FindAllString(page, -1) {
		if !strings.Contains(tag, ` src="/console/assets/console.js"`) {
			t.Errorf("page %q has a script that is not the embedded file: %s", path, tag)
		}
	}
	if len(emptyScript.FindAllString(page, -1)) != strings.Count(strings.ToLower(page), "<script") {
		t.Errorf("page %q has a script element with content", path)
	}
	if m := inlineEvent.FindString(page); m != "" {
		t.Errorf("page %q has an inline event handler: %s", path, m)
	}
	if m := inlineStyle.FindString(page); m != "" {
		t.Errorf("page %q has inline style: %s", path, m)
	}
	if strings.Contains(strings.ToLower(page), "javascript:") {
		t.Errorf("page %q has a javascript: URL", path)
	}
}

// TestConsoleStateChangesNeedCSRFAndOrigin: every POST a browser makes is
// refused without the page's CSRF token, with another token, without an
// Origin or from another origin, and nothing is written.
func TestConsoleStateChangesNeedCSRFAndOrigin(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(req *http.Request)
		want   string
	}{
		{"no CSRF header", func(req *http.Request) { req.Header.Del("X-CSRF-Token") }, "CSRF"},
		{"another CSRF token", func(req *http.Request) { req.Header.Set("X-CSRF-Token", strings.Repeat("A", 43)) }, "CSRF"},
		{"no Origin", func(req *http.Request) { req.Header.Del("Origin") }, "Origin"},
		{"foreign Origin", func(req *http.Request) { req.Header.Set("Origin", "http://evil.example") }, "Origin"},
		{"sibling port", func(req *http.Request) { req.Header.Set("Origin", "http://localhost:1") }, "Origin"},
		{"null Origin", func(req *http.Request) { req.Header.Set("Origin", "null") }, "Origin"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// A rig each: the sign-in endpoints' rate limit is per client.
			g := newRig(t)
			alice, _ := softauthn.New()
			b := g.browser()
			g.enrol(b, "alice", alice)
			r := g.ask(1).Review
			if code, res := g.signIn(b, alice); code != 200 {
				t.Fatalf("sign in: %d %v", code, res)
			}
			before := g.receipts()
			for _, p := range []string{"api/login/begin", "api/login/finish", "api/logout", "api/enrol/begin", "api/enrol/finish",
				"api/reviews/" + r.ID + "/begin", "api/reviews/" + r.ID + "/finish"} {
				req, _ := http.NewRequest("POST", g.base+p, strings.NewReader(`{"decision":"approved","note":""}`))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Origin", g.origin)
				req.Header.Set("X-CSRF-Token", b.csrf)
				c.mutate(req)
				resp, err := b.c.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				var out map[string]string
				_ = json.NewDecoder(resp.Body).Decode(&out)
				resp.Body.Close()
				if resp.StatusCode != http.StatusForbidden || !strings.Contains(out["error"], c.want) {
					t.Errorf("POST %s: %d %v", p, resp.StatusCode, out)
				}
			}
			// A GET never changes state: the decision endpoints are POST only.
			if code, _ := b.get("api/reviews/" + r.ID + "/finish"); code != http.StatusMethodNotAllowed {
				t.Errorf("GET of a decision endpoint: %d", code)
			}
			if n := g.receipts(); n != before {
				t.Fatalf("refused requests wrote %d receipts", n-before)
			}
			// The session survived: the refused logout did nothing.
			if _, page := b.get(""); strings.Contains(page, "Sign in with passkey") {
				t.Fatal("a refused logout signed the reviewer out")
			}
		})
	}
}

// TestConsoleLiveQueue: a signed-in reviewer's event stream sends the
// queue at once and again when a review opens or is decided; without a
// session there is no stream.
func TestConsoleLiveQueue(t *testing.T) {
	g := newRig(t)
	alice, _ := softauthn.New()
	b := g.browser()
	g.enrol(b, "alice", alice)
	if code, _ := b.get("api/events"); code != http.StatusUnauthorized {
		t.Fatalf("events without a session: %d", code)
	}
	r1 := g.ask(1).Review
	if code, res := g.signIn(b, alice); code != 200 {
		t.Fatalf("sign in: %d %v", code, res)
	}
	if _, page := b.get(""); !strings.Contains(page, `<div id="queue" data-live="/console/api/events">`) {
		t.Fatal("the queue page does not ask for the live queue")
	}
	resp, err := b.c.Get(g.base + "api/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "default-src 'none'") {
		t.Fatalf("events: %d %v", resp.StatusCode, resp.Header)
	}
	events := make(chan string, 16)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		var ev strings.Builder
		for sc.Scan() {
			line := sc.Text()
			if line == "" {
				if ev.Len() > 0 {
					events <- ev.String()
				}
				ev.Reset()
				continue
			}
			ev.WriteString(line + "\n")
		}
	}()
	next := func(want, notWant string) string {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			select {
			case ev, ok := <-events:
				if !ok {
					t.Fatalf("the stream ended before %q", want)
				}
				if strings.HasPrefix(ev, "event: queue\n") && strings.Contains(ev, want) && (notWant == "" || !strings.Contains(ev, notWant)) {
					return ev
				}
			case <-deadline:
				t.Fatalf("no queue event with %q", want)
			}
		}
	}
	ev := next(r1.ID, "")
	for _, line := range strings.Split(strings.TrimSuffix(ev, "\n"), "\n")[1:] {
		if !strings.HasPrefix(line, "data: ") {
			t.Fatalf("event line %q", line)
		}
	}
	// A review opens: the stream sends the queue with it, newest first.
	r2 := g.ask(2).Review
	ev = next(r2.ID, "")
	if strings.Index(ev, r2.ID) > strings.Index(ev, r1.ID) {
		t.Fatal("the live queue is not newest first")
	}
	// A decision moves r1 to the decided table.
	if _, code, res := g.decide(b, r1.ID, "approved", "", alice); code != 200 {
		t.Fatalf("approve: %d %v", code, res)
	}
	ev = next("passkey (WebAuthn assertion in the receipt)", "")
	if !strings.Contains(ev, "Decided reviews") {
		t.Fatalf("after the decision: %s", ev)
	}
	// Signing out ends what the stream may show: it closes.
	if code, _ := b.post("api/logout", map[string]any{}); code != 200 {
		t.Fatal(code)
	}
	g.ask(3)
	deadline := time.After(10 * time.Second)
	for {
		select {
		case _, ok := <-events:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("the stream went on after sign-out")
		}
	}
}

// TestConsoleReviewTimeline: a review page draws the guard's recent
// payments as inline SVG, one titled bar each, with no script or style
// inline; a history that cannot be read is said, not hidden.
func TestConsoleReviewTimeline(t *testing.T) {
	t0 := time.Now().Add(-3 * time.Hour).UTC()
	ops := []guard.Op{
		{RunID: "run-1", OperationID: "op-a", FirstEventAt: t0.Format(time.RFC3339Nano), Money: &guard.Money{PayTos: []string{"0xabc"}, Atomic: big.NewInt(100000), Asset: "x:usdc"}},
		{RunID: "run-1", OperationID: "op-b\u202e", FirstEventAt: t0.Add(time.Hour).Format(time.RFC3339Nano), Open: true, Money: &guard.Money{PayTos: []string{"0xdef"}, Atomic: big.NewInt(300000), Asset: "x:usdc"}},
	}
	var broken atomic.Bool
	g := newRig(t, func(c *console.Config) {
		c.History = func(context.Context) (guard.History, error) {
			if broken.Load() {
				return guard.History{}, errors.New("the index is unreadable")
			}
			return guard.History{Ops: ops}, nil
		}
		c.Assets = func(a string) (string, int, bool) { return "USDC", 6, a == "x:usdc" }
	})
	alice, _ := softauthn.New()
	b := g.browser()
	g.enrol(b, "alice", alice)
	r := g.ask(1).Review
	if code, res := g.signIn(b, alice); code != 200 {
		t.Fatalf("sign in: %d %v", code, res)
	}
	code, page := b.get("reviews/" + r.ID)
	if code != 200 {
		t.Fatal(code)
	}
	checkNoInline(t, "review", page)
	svg := page[strings.Index(page, "<svg"):]
	svg = svg[:strings.Index(svg, "</svg>")]
	for _, want := range []string{`<svg class="timeline" role="img" aria-labelledby="chart-title chart-desc" viewBox="0 0 640 160"`,
		`<title id="chart-title">Recent payments in the guard&#39;s history</title>`,
		`2 payments from`, `; 1 open, faulted or reserved; 1 to this review&#39;s host.`,
		`<rect class="paid same" `, `: 0.10 USDC, settled, to this review&#39;s host (run-1/op-a)</title></rect>`,
		`<rect class="open" `, `: 0.30 USDC, open (paid, outcome not confirmed) (run-1/op-b\u202e)</title>`,
		`<line class="opened" `} {
		if !strings.Contains(svg, want) {
			t.Fatalf("the chart lacks %q:\n%s", want, svg)
		}
	}
	if n := strings.Count(svg, "<rect "); n != 2 {
		t.Fatalf("%d bars", n)
	}
	broken.Store(true)
	if _, page := b.get("reviews/" + r.ID); strings.Contains(page, "<svg") || !strings.Contains(page, "The guard&#39;s history cannot be read now") {
		t.Fatal("an unreadable history is not said")
	}
}

// TestConsoleSessionsAcrossReplicas: two consoles given one session key,
// behind one address taking turns: a sign-in begun on one finishes on the
// other, the session reads the queue on both, and a decision is made
// through either. A cookie edited to name another reviewer, or one made
// with another key, is no session.
func TestConsoleSessionsAcrossReplicas(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	g := newReplicas(t, 2, func(c *console.Config) { c.SessionKey = key })
	alice, _ := softauthn.New()
	b := g.browser()
	// Enrolment is held by the replica that served the link (the
	// operator's command collects from it): enrol on a console of one,
	// then trust the credential in the replicas' reviewers file.
	one := newRig(t, func(c *console.Config) { c.SessionKey = key })
	cred := one.enrol(one.browser(), "alice", alice)
	if _, err := reviewlog.AddPasskey(g.reviewers, "alice", passkey.Credential{ID: cred.ID, PublicKey: cred.PublicKey, RPID: g.rpID, Origin: g.origin}); err != nil {
		t.Fatal(err)
	}
	r := g.ask(1).Review
	for i := range 3 { // begin and finish land on different replicas
		if code, res := g.signIn(b, alice); code != 200 {
			t.Fatalf("sign in %d across replicas: %d %v", i, code, res)
		}
	}
	for i := range 4 {
		if code, page := b.get(""); code != 200 || !strings.Contains(page, r.ID) {
			t.Fatalf("queue %d on a replica: %d", i, code)
		}
	}
	if _, code, res := g.decide(b, r.ID, "approved", "", alice); code != 200 {
		t.Fatalf("decide across replicas: %d %v", code, res)
	}
	// An edited cookie: the payload names bob, the MAC is alice's.
	u, _ := url.Parse(g.base)
	var session *http.Cookie
	for _, ck := range b.c.Jar.Cookies(u) {
		if ck.Name == "haia_console" {
			session = ck
		}
	}
	if session == nil {
		t.Fatal("no session cookie")
	}
	payload, mac, _ := strings.Cut(session.Value, ".")
	raw, _ := base64.RawURLEncoding.DecodeString(payload)
	forged := strings.Replace(string(raw), `"r":"alice"`, `"r":"bob"`, 1)
	for name, v := range map[string]string{
		"edited payload": base64.RawURLEncoding.EncodeToString([]byte(forged)) + "." + mac,
		"no MAC":         payload,
		"another key":    otherKeyCookie(t, one, alice),
	} {
		req, _ := http.NewRequest("GET", g.base, nil)
		req.AddCookie(&http.Cookie{Name: "haia_console", Value: v})
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(body), "Sign in with passkey") {
			t.Errorf("%s: the cookie was taken as a session", name)
		}
	}
	// A sign-in challenge of another key is not this console's.
	code, opts := newRig(t).browser().post("api/login/begin", map[string]any{})
	if code != 200 {
		t.Fatal(code)
	}
	x, _ := alice.Assert(g.rpID, g.origin, challengeOf(t, opts))
	j, _ := x.JSON()
	if code, res := b.post("api/login/finish", map[string]any{"credential": json.RawMessage(j)}); code != http.StatusForbidden {
		t.Fatalf("a challenge of another console: %d %v", code, res)
	}
}

// otherKeyCookie signs in on a console with a random session key and
// returns its session cookie.
func otherKeyCookie(t *testing.T, _ *rig, a *softauthn.Authenticator) string {
	t.Helper()
	o := newRig(t)
	ob := o.browser()
	o.enrol(ob, "alice", a)
	if code, res := o.signIn(ob, a); code != 200 {
		t.Fatalf("sign in: %d %v", code, res)
	}
	u, _ := url.Parse(o.base)
	for _, ck := range ob.c.Jar.Cookies(u) {
		if ck.Name == "haia_console" {
			return ck.Value
		}
	}
	t.Fatal("no session cookie")
	return ""
}

func TestIsConsolePath(t *testing.T) {
	for _, tc := range []struct {
		path string
		want bool
	}{
		{"/console/", true},
		{"/x/console/", true},
		{"/console/t/acme/", true},
		{"/console/t/acme", false},
		{"/console/t/../", false},
		{"/console/t//", false},
		{"/console/t/a%2Fb/", false},
		{"/console/t/acme/reviews/", false},
		{"/", false},
	} {
		if got := console.IsConsolePath(tc.path); got != tc.want {
			t.Errorf("IsConsolePath(%q) = %v, want %v", tc.path, got, tc.want)
		}
	}
}

// asPasskey is a softauthn assertion as the passkey package holds it.
func asPasskey(x softauthn.Assertion) passkey.Assertion {
	return passkey.Assertion{CredentialID: x.CredentialID, AuthenticatorData: x.AuthenticatorData, ClientDataJSON: x.ClientDataJSON, Signature: x.Signature}
}
