package main

import (
	"crypto/hmac"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/notify"
)

// loopRoot holds one seller whose payment never settled, so every question
// about it is a review.
func loopRoot(t *testing.T) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), ".trace")
	rec, err := simrec.New(root, "run-1", time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if err := rec.Pay(simrec.Payment{OperationID: "op-1", URL: "https://b.example.net/x", PayTo: sellerB, Amount: "100000", Outcome: "unsettled"}); err != nil {
		t.Fatal(err)
	}
	return root
}

// webhookReceiver is a loopback receiver that checks every signature and
// counts the reviews it is told of; status is what it answers.
type webhookReceiver struct {
	mu     sync.Mutex
	seen   map[string]int
	bad    int
	status int
	srv    *httptest.Server
}

func newWebhookReceiver(t *testing.T, secret []byte, status int) *webhookReceiver {
	w := &webhookReceiver{seen: map[string]int{}, status: status}
	w.srv = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.mu.Lock()
		defer w.mu.Unlock()
		if !hmac.Equal([]byte(r.Header.Get("X-Haia-Signature")), []byte(notify.Sign(secret, body))) {
			w.bad++
			rw.WriteHeader(http.StatusUnauthorized)
			return
		}
		var m struct {
			Event  string `json:"event"`
			Review struct {
				ID string `json:"review_id"`
			} `json:"review"`
			Text string `json:"text"`
		}
		if json.Unmarshal(body, &m) != nil || m.Event != "review.opened" || m.Text == "" {
			w.bad++
		}
		w.seen[m.Review.ID]++
		rw.WriteHeader(w.status)
	}))
	t.Cleanup(w.srv.Close)
	return w
}

func (w *webhookReceiver) count(id string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seen[id]
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// humanLoop plays the loop through a connected client: review → approve →
// the identical retry is allow (human_approved) once → the next identical
// question is a review again; a second question → reject → block
// (human_rejected). It returns the review ids it opened.
func humanLoop(t *testing.T, cs *mcp.ClientSession, root string) []string {
	t.Helper()
	ask := func(amount string) checkAnswer {
		var a checkAnswer
		res := callTool(t, cs, "check_before_pay", map[string]any{"counterparty": sellerB, "amount": amount})
		decodeStructured(t, res, &a)
		checkAnswerText(t, a, resultText(res))
		return a
	}
	first := ask("0.10")
	if first.Decision != "review" || first.ReviewID == "" {
		t.Fatalf("first: %+v", first)
	}
	if out, errOut, code := runCLI(t, "review", "approve", first.ReviewID, "--note", "one payment is fine", "--dir", root); code != 0 {
		t.Fatalf("approve: %d %s %s", code, out, errOut)
	}
	var st map[string]any
	decodeStructured(t, callTool(t, cs, "get_review_status", map[string]any{"review_id": first.ReviewID}), &st)
	if st["status"] != "approved" || st["decided_by"] != "alice" {
		t.Fatalf("status after approve: %v", st)
	}
	use := ask("0.10")
	if use.Decision != "allow" || !hasRule(use, "human_approved") || use.ReviewID != first.ReviewID {
		t.Fatalf("retry after approval: %+v", use)
	}
	next := ask("0.10")
	if next.Decision != "review" || next.ReviewID == first.ReviewID {
		t.Fatalf("after the one use: %+v", next)
	}
	other := ask("0.20")
	if out, errOut, code := runCLI(t, "review", "reject", other.ReviewID, "--note", "no", "--dir", root); code != 0 {
		t.Fatalf("reject: %d %s %s", code, out, errOut)
	}
	held := ask("0.20")
	if held.Decision != "block" || !hasRule(held, "human_rejected") || held.ReviewID != other.ReviewID {
		t.Fatalf("retry after rejection: %+v", held)
	}
	return []string{first.ReviewID, next.ReviewID, other.ReviewID}
}

// checkAnswerText fails t when the text of a check_before_pay answer says
// what its structure does not: another decision, a pending review in a
// decided answer, or a reason left out.
func checkAnswerText(t *testing.T, a checkAnswer, text string) {
	t.Helper()
	first, _, _ := strings.Cut(text, "\n")
	if !strings.HasPrefix(first, "Decision: "+strings.ToUpper(a.Decision)) {
		t.Errorf("decision %s, text %q", a.Decision, first)
	}
	if pending := strings.Contains(text, "pending a human decision"); pending != (a.Decision == "review" && a.ReviewID != "") {
		t.Errorf("decision %s with review %q: the text speaks of a pending review=%v:\n%s", a.Decision, a.ReviewID, pending, text)
	}
	for _, r := range a.Reasons {
		if !strings.Contains(text, "- "+r.Rule+": "+r.Detail) {
			t.Errorf("reason %s: %q is not in the text:\n%s", r.Rule, r.Detail, text)
		}
	}
}

func TestHumanLoopStdio(t *testing.T) {
	root := loopRoot(t)
	dir := t.TempDir()
	secret := []byte(strings.Repeat("w", 32))
	secretFile := filepath.Join(dir, "webhook-secret")
	if err := os.WriteFile(secretFile, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	hook := newWebhookReceiver(t, secret, http.StatusOK)
	seenFile := filepath.Join(dir, "notified.ndjson")
	script := filepath.Join(dir, "notify.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\ncat >> "+seenFile+"\necho >> "+seenFile+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cs := mcpSession(t, nil, "--dir", root, "--key-file", filepath.Join(dir, "signing.pem"), "--agent-id", "loop-agent",
		"--notify-command", script, "--notify-url", hook.srv.URL, "--notify-secret-file", secretFile)
	ids := humanLoop(t, cs, root)

	// Every opened review reaches the command and the webhook exactly once.
	for _, id := range ids {
		waitFor(t, "the webhook to hear of "+id, func() bool { return hook.count(id) == 1 })
		waitFor(t, "the command to hear of "+id, func() bool {
			data, _ := os.ReadFile(seenFile)
			n := 0 // notifications (one a line) about this review
			for _, line := range strings.Split(string(data), "\n") {
				if strings.Contains(line, `"review_id":"`+id+`"`) {
					n++
				}
			}
			return n == 1
		})
	}
	if hook.bad != 0 {
		t.Errorf("%d webhook bodies with a bad signature or shape", hook.bad)
	}
	if out, errOut, code := runCLI(t, "audit", "--dir", root); code != 0 || !strings.HasPrefix(out, "CONSISTENT") {
		t.Fatalf("audit of the clean loop: %d %s %s", code, out, errOut)
	}

	// Forgeries. A decided line without a trusted reviewer's receipt reads
	// unverified, is not honoured, and the audit names it.
	pending := ids[1]
	logPath := filepath.Join(root, "guard", "decisions.ndjson")
	f, err := os.OpenFile(logPath, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"type":"decided","review_id":"` + pending + `","at":"` + time.Now().UTC().Format("2006-01-02T15:04:05.000Z") + `","status":"approved","by":"alice"}` + "\n")
	f.Close()
	var st map[string]any
	decodeStructured(t, callTool(t, cs, "get_review_status", map[string]any{"review_id": pending}), &st)
	if st["status"] != "unverified" {
		t.Fatalf("forged approval reads %v", st["status"])
	}
	var a checkAnswer
	decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": sellerB, "amount": "0.10"}), &a)
	if a.Decision == "allow" {
		t.Fatalf("a forged approval was honoured: %+v", a)
	}
	out, _, code := runCLI(t, "audit", "--dir", root)
	if code != 2 || !strings.Contains(out, pending) || !strings.Contains(out, "no receipt signed by a trusted reviewer") {
		t.Fatalf("audit after the forgery: %d %s", code, out)
	}
	// A brand-new key is refused before anything is written.
	mallory := filepath.Join(dir, "mallory.pem")
	if _, errOut, code := runCLI(t, "reviewer", "init", "--id", "mallory", "--key-file", mallory, "--reviewers", filepath.Join(dir, "elsewhere.json")); code != 0 {
		t.Fatal(errOut)
	}
	fresh := func() string {
		var a checkAnswer
		decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": sellerB, "amount": "0.30"}), &a)
		return a.ReviewID
	}()
	before, _ := os.ReadFile(logPath)
	if _, errOut, code := runCLI(t, "review", "approve", fresh, "--reviewer-key", mallory, "--dir", root); code != reviewExitUntrusted || !strings.Contains(errOut, "not in the trusted reviewers file") {
		t.Fatalf("untrusted key: %d %s", code, errOut)
	}
	if after, _ := os.ReadFile(logPath); string(after) != string(before) {
		t.Fatal("the untrusted key's decision wrote to the review log")
	}
	if keyring, _ := os.ReadFile(filepath.Join(root, "guard", "keyring.json")); strings.Contains(string(keyring), "mallory") {
		t.Fatal("the untrusted key reached the keyring")
	}
}

func TestHumanLoopHTTP(t *testing.T) {
	root := loopRoot(t)
	dir := t.TempDir()
	secret := []byte(strings.Repeat("h", 48))
	secretFile := filepath.Join(dir, "secret")
	if err := os.WriteFile(secretFile, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	hookSecret := filepath.Join(dir, "webhook-secret")
	if err := os.WriteFile(hookSecret, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	// A receiver that always fails: the answers must not change.
	failing := newWebhookReceiver(t, secret, http.StatusInternalServerError)
	reviewers, err := defaultConfigPath("reviewers.json")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(reviewers)
	if err != nil {
		t.Fatal(err)
	}
	copyOf := filepath.Join(dir, "reviewers.json")
	if err := os.WriteFile(copyOf, data, 0o600); err != nil {
		t.Fatal(err)
	}
	p := startHTTPBinary(t, "--dir", root, "--key-file", filepath.Join(dir, "signing.pem"), "--reviewers", copyOf,
		"--auth-issuer", "http://127.0.0.1/local-as", "--auth-hmac-secret", secretFile,
		"--notify-url", failing.srv.URL, "--notify-secret-file", hookSecret)
	tok := signHS256(t, secret, map[string]any{"iss": "http://127.0.0.1/local-as", "aud": p.resource, "sub": "loop-http",
		"exp": time.Now().Add(time.Hour).Unix(), "iat": time.Now().Unix()})
	cs, err := httpSession(t, p.resource, func() string { return tok })
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, p.logs())
	}
	defer cs.Close()
	ids := humanLoop(t, cs, root)
	waitFor(t, "the failing receiver to be tried", func() bool { return failing.count(ids[0]) >= 1 })

	ready := func() (int, string) { return getText(t, p.base+"/readyz") }
	if code, body := ready(); code != http.StatusOK {
		t.Fatalf("readyz: %d %s", code, body)
	}
	_, metrics := getText(t, p.base+"/metrics")
	for _, name := range []string{"haia_review_integrity_warnings_total", "haia_notify_sent_total"} {
		if !strings.Contains(string(metrics), name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	if err := os.Remove(copyOf); err != nil {
		t.Fatal(err)
	}
	if code, body := ready(); code != http.StatusServiceUnavailable || !strings.Contains(body, "trusted reviewers file cannot be read") {
		t.Fatalf("readyz without the reviewers file: %d %q", code, body)
	}
}

// getText GETs url and returns the status and body.
func getText(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
