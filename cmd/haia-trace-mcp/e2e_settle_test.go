package main

import (
	"bytes"
	"crypto/hmac"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/pgtest"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/notify"
)

// TestStdioRecordReceipt: the real binary takes the seller's settlement
// answer (the PAYMENT-RESPONSE header's value) for an authorization it
// signed, records it once, and `authorization show` proves it by its signed
// receipt — an edited settlement line is TAMPERED; audit stays clean.
func TestStdioRecordReceipt(t *testing.T) {
	root := sampleRoot(t)
	key := filepath.Join(t.TempDir(), "signing-key.pem")
	payerKey := writeSecret(t, "payer.key", "0x"+e2ePayerKey+"\n")
	cfg := writeSecret(t, "guard.json", `{"reviewAbove":"1.00"}`)
	cs := mcpSession(t, nil, "--dir", root, "--key-file", key, "--guard-config", cfg, "--payer-key", payerKey)

	allow := authorizeCall(t, cs, e2ePaymentRequired("250000", e2eSeller))
	if allow.Decision != "allow" {
		t.Fatalf("allow: %+v", allow)
	}
	tx := "0x" + strings.Repeat("5a", 32)
	header := base64.StdEncoding.EncodeToString([]byte(`{"success":true,"transaction":"` + tx + `","network":"eip155:8453","payer":"` + e2ePayerAddr + `"}`))
	var rec struct {
		ReceiptID string   `json:"receipt_id"`
		Findings  []string `json:"findings"`
	}
	decodeStructured(t, callTool(t, cs, "record_receipt", map[string]any{"nonce": allow.Authorization.Nonce, "payment_response": header}), &rec)
	if rec.ReceiptID == "" || len(rec.Findings) != 0 {
		t.Fatalf("record_receipt: %+v", rec)
	}
	out, errOut, code := runCLI(t, "authorization", "show", allow.Authorization.Nonce, "--dir", root)
	if code != 0 || !strings.Contains(out, "settlement     transaction "+tx) || !strings.Contains(out, "CONSISTENT") {
		t.Fatalf("authorization show: %d\n%s%s", code, out, errOut)
	}
	if out, errOut, code := runCLI(t, "audit", "--dir", root); code != 0 {
		t.Fatalf("audit: %d %s %s", code, out, errOut)
	}
	// A settlement that names another payer is recorded with a finding,
	// which status shows to the operator.
	second := authorizeCall(t, cs, e2ePaymentRequiredAt("https://api.seller.example/other", "260000", e2eSeller))
	if second.Decision != "allow" {
		t.Fatalf("second: %+v", second)
	}
	decodeStructured(t, callTool(t, cs, "record_receipt", map[string]any{"nonce": second.Authorization.Nonce, "payment_response": map[string]any{
		"success": true, "transaction": "0x" + strings.Repeat("9e", 32), "network": "eip155:8453", "payer": e2eDenied}}), &rec)
	if len(rec.Findings) != 1 || !strings.Contains(rec.Findings[0], "payer: the settlement names") {
		t.Fatalf("a settlement naming another payer: %+v", rec)
	}
	if out, _, _ := runCLI(t, "status", "--dir", root); !strings.Contains(out, "the seller's settlement of authorization "+second.Authorization.Nonce+" disagrees with it (1 finding; first: payer:") {
		t.Fatalf("status does not show the finding:\n%s", out)
	}
	logPath := filepath.Join(root, "guard", "decisions.ndjson")
	data, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	edited := bytes.Replace(data, []byte(`"transaction":"`+tx), []byte(`"transaction":"0x`+strings.Repeat("6b", 32)), 1)
	if bytes.Equal(edited, data) {
		t.Fatal("no settled line to edit")
	}
	os.WriteFile(logPath, edited, 0o600)
	out, _, code = runCLI(t, "authorization", "show", allow.Authorization.Nonce, "--dir", root)
	if code != authExitTampered || !strings.Contains(out, "TAMPERED: the settlement's record hashes to") {
		t.Fatalf("an edited settlement: exit %d\n%s", code, out)
	}
}

// TestStdioRecordReceiptPostgres: the settlement, its ledger release and
// the dossier on the PostgreSQL store.
func TestStdioRecordReceiptPostgres(t *testing.T) {
	pgtest.DSN(t)
	dsn := e2eDatabase(t)
	root := sampleRoot(t)
	key := filepath.Join(t.TempDir(), "signing-key.pem")
	payerKey := writeSecret(t, "payer.key", "0x"+e2ePayerKey+"\n")
	cfg := writeSecret(t, "guard.json", `{"reviewAbove":"1.00"}`)
	cs := mcpSession(t, nil, "--dir", root, "--store", dsn, "--key-file", key, "--guard-config", cfg, "--payer-key", payerKey)
	allow := authorizeCall(t, cs, e2ePaymentRequired("250000", e2eSeller))
	if allow.Decision != "allow" {
		t.Fatalf("allow: %+v", allow)
	}
	// The payee's payment is open: the next one is reviewed for it.
	if next := authorizeCall(t, cs, e2ePaymentRequiredAt("https://api.seller.example/next", "250000", e2eSeller)); next.Decision != "review" {
		t.Fatalf("an open authorization does not count: %+v", next)
	}
	var rec struct {
		ReceiptID string `json:"receipt_id"`
	}
	decodeStructured(t, callTool(t, cs, "record_receipt", map[string]any{"nonce": allow.Authorization.Nonce, "payment_response": map[string]any{
		"success": true, "transaction": "0x" + strings.Repeat("4f", 32), "network": "eip155:8453", "payer": e2ePayerAddr}}), &rec)
	if rec.ReceiptID == "" {
		t.Fatal("no receipt")
	}
	if next := authorizeCall(t, cs, e2ePaymentRequiredAt("https://api.seller.example/after", "250000", e2eSeller)); next.Decision != "allow" {
		t.Fatalf("a settled authorization still counts as open: %+v", next)
	}
	file := filepath.Join(t.TempDir(), "dossier.json")
	if out, errOut, code := runCLI(t, "dossier", "export", allow.Authorization.Nonce, "--dir", root, "--store", dsn, "--key-file", key, "--out", file); code != 0 {
		t.Fatalf("export: %d %s %s", code, out, errOut)
	}
	if out, _, code := runCLI(t, "dossier", "verify", file); code != 1 || !strings.Contains(out, "VALID      settlement") {
		t.Fatalf("verify on the file's keys: %d\n%s", code, out)
	}
}

// TestStdioTraceSettlement: the real binary reads the recorder's settlement
// of an authorization it signed from the Trace (bound by the nonce the
// submitted payment carries), at the next authorize_payment, and records
// it as record_receipt would: `authorization show` says it came from the
// Trace and is CONSISTENT, the dossier carries it with its source and
// verifies, and record_receipt of that nonce is refused.
func TestStdioTraceSettlement(t *testing.T) {
	root := sampleRoot(t)
	key := filepath.Join(t.TempDir(), "signing-key.pem")
	payerKey := writeSecret(t, "payer.key", "0x"+e2ePayerKey+"\n")
	cfg := writeSecret(t, "guard.json", `{"reviewAbove":"1.00"}`)
	cs := mcpSession(t, nil, "--dir", root, "--key-file", key, "--guard-config", cfg, "--payer-key", payerKey)

	allow := authorizeCall(t, cs, e2ePaymentRequiredAt("https://api.seller.example/traced", "250000", e2eSeller))
	if allow.Decision != "allow" {
		t.Fatalf("allow: %+v", allow)
	}
	tx := "0x" + strings.Repeat("3c", 32)
	rec, err := simrec.New(root, "run-traced", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := rec.Pay(simrec.Payment{OperationID: "op-paid", URL: "https://api.seller.example/traced", PayTo: e2eSeller, Amount: "250000",
		Network: "eip155:8453", Outcome: "settled", Nonce: allow.Authorization.Nonce,
		Settle: map[string]any{"success": true, "transaction": tx, "network": "eip155:8453", "payer": e2ePayerAddr}}); err != nil {
		t.Fatal(err)
	}
	if out, _, code := runCLI(t, "authorization", "show", allow.Authorization.Nonce, "--dir", root); code != 0 || !strings.Contains(out, "settlement     none recorded") {
		t.Fatalf("before the server read the Trace: %d\n%s", code, out)
	}
	// The agent's next question binds it: check_before_pay lists the
	// Trace, and the settlement written since the last authorize_payment
	// is recorded after its answer (not left until the next payment).
	if res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "check_before_pay", Arguments: map[string]any{"counterparty": e2eSeller, "amount": "0.10"}}); err != nil || res.IsError {
		t.Fatalf("check_before_pay: %v %+v", err, res)
	}
	out, errOut, code := runCLI(t, "authorization", "show", allow.Authorization.Nonce, "--dir", root)
	if code != 0 || !strings.Contains(out, "settlement     transaction "+tx) || !strings.Contains(out, "settled by     the Trace: run run-traced, operation op-paid") ||
		!strings.Contains(out, "bound by an event of its operation carries the authorization's nonce") || !strings.Contains(out, "CONSISTENT") {
		t.Fatalf("authorization show: %d\n%s%s", code, out, errOut)
	}
	file := filepath.Join(t.TempDir(), "dossier.json")
	if out, errOut, code := runCLI(t, "dossier", "export", allow.Authorization.Nonce, "--dir", root, "--key-file", key, "--out", file); code != 0 {
		t.Fatalf("export: %d %s %s", code, out, errOut)
	}
	data, _ := os.ReadFile(file)
	var d struct {
		Settlement struct {
			Source string `json:"source"`
			Trace  struct {
				Run, Binding string
			} `json:"trace"`
		} `json:"settlement"`
	}
	if err := json.Unmarshal(data, &d); err != nil || d.Settlement.Source != "trace" || d.Settlement.Trace.Run != "run-traced" || d.Settlement.Trace.Binding != "nonce" {
		t.Fatalf("the dossier does not say the settlement came from the Trace: %v %+v", err, d.Settlement)
	}
	if out, _, code := runCLI(t, "dossier", "verify", file); code != 1 || !strings.Contains(out, "VALID      settlement") || !strings.Contains(out, "from the Trace: run run-traced") {
		t.Fatalf("verify: %d\n%s", code, out)
	}
	// The source is signed: a dossier that says the agent handed it in
	// instead is TAMPERED.
	edited := bytes.Replace(data, []byte(`"source": "trace"`), []byte(`"source": "agent"`), 1)
	if bytes.Equal(edited, data) {
		t.Fatal("no source to edit")
	}
	os.WriteFile(file, edited, 0o600)
	if out, _, code := runCLI(t, "dossier", "verify", file); code != 2 || !strings.Contains(out, "TAMPERED") {
		t.Fatalf("an edited source: %d\n%s", code, out)
	}
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "record_receipt", Arguments: map[string]any{"nonce": allow.Authorization.Nonce,
		"payment_response": map[string]any{"success": true, "transaction": tx, "network": "eip155:8453", "payer": e2ePayerAddr}}})
	if err != nil || !res.IsError {
		t.Fatalf("record_receipt after the Trace settled it: %v %+v", err, res)
	}
	if out, errOut, code := runCLI(t, "audit", "--dir", root); code != 0 {
		t.Fatalf("audit: %d %s %s", code, out, errOut)
	}
}

// TestSettlementFindingsNotify: a settlement recorded with findings — the
// agent's, and one the server read from the Trace — reaches the reviewers
// through the notification webhook like a review does: signed, event
// settlement.finding, naming the authorization, the source and each
// field, with no secret in the body (the resource's query, which may hold
// an API key, is cut; no key or signature is sent).
func TestSettlementFindingsNotify(t *testing.T) {
	root := sampleRoot(t)
	dir := t.TempDir()
	key := filepath.Join(dir, "signing-key.pem")
	payerKey := writeSecret(t, "payer.key", "0x"+e2ePayerKey+"\n")
	cfg := writeSecret(t, "guard.json", `{"reviewAbove":"1.00"}`)
	secret := []byte(strings.Repeat("s", 32))
	secretFile := filepath.Join(dir, "webhook-secret")
	if err := os.WriteFile(secretFile, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	type delivery struct {
		event string
		body  []byte
	}
	got := make(chan delivery, 8)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !hmac.Equal([]byte(r.Header.Get("X-Haia-Signature")), []byte(notify.Sign(secret, body))) {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		got <- delivery{r.Header.Get("X-Haia-Event"), body}
	}))
	t.Cleanup(srv.Close)
	cs := mcpSession(t, nil, "--dir", root, "--key-file", key, "--guard-config", cfg, "--payer-key", payerKey,
		"--notify-url", srv.URL, "--notify-secret-file", secretFile)
	type finding struct {
		Event  string `json:"event"`
		Review struct {
			ReviewID  string   `json:"review_id"`
			Nonce     string   `json:"nonce"`
			Source    string   `json:"source"`
			TraceRun  string   `json:"trace_run"`
			Amount    string   `json:"amount"`
			Payee     string   `json:"payee"`
			HoldKept  bool     `json:"hold_kept"`
			Fields    []string `json:"fields"`
			Findings  []string `json:"findings"`
			Signature string   `json:"signature"`
		} `json:"review"`
		Text string `json:"text"`
	}
	next := func() finding {
		t.Helper()
		select {
		case d := <-got:
			for _, secret := range []string{"SECRET123", e2ePayerKey, string(secret)} {
				if bytes.Contains(bytes.ToLower(d.body), bytes.ToLower([]byte(secret))) {
					t.Fatalf("the hook body carries a secret (%q):\n%s", secret, d.body)
				}
			}
			var f finding
			if err := json.Unmarshal(d.body, &f); err != nil || d.event != "settlement.finding" || f.Event != "settlement.finding" {
				t.Fatalf("a delivery: %s %v\n%s", d.event, err, d.body)
			}
			return f
		case <-time.After(20 * time.Second):
			t.Fatal("no settlement.finding delivered")
		}
		return finding{}
	}

	// The agent's settlement names another payer.
	a1 := authorizeCall(t, cs, e2ePaymentRequiredAt("https://api.seller.example/report?apikey=SECRET123", "250000", e2eSeller))
	if a1.Decision != "allow" {
		t.Fatalf("a1: %+v", a1)
	}
	decodeStructured(t, callTool(t, cs, "record_receipt", map[string]any{"nonce": a1.Authorization.Nonce, "payment_response": map[string]any{
		"success": true, "transaction": "0x" + strings.Repeat("71", 32), "network": "eip155:8453", "payer": e2eDenied}}), &struct{}{})
	f := next()
	if f.Review.ReviewID != "settlement:"+a1.Authorization.Nonce || f.Review.Source != "agent" || strings.Join(f.Review.Fields, ",") != "payer" ||
		f.Review.Amount != "0.25 USDC" || !strings.EqualFold(f.Review.Payee, e2eSeller) ||
		!strings.Contains(f.Text, "The seller's settlement of payment authorization "+a1.Authorization.Nonce+" disagrees with it (1 finding: payer): 0.25 USDC to") ||
		!strings.Contains(f.Text, "haia-trace-mcp authorization show "+a1.Authorization.Nonce) {
		t.Fatalf("the agent's finding: %+v", f)
	}

	// The Trace's settlement of a2 is for another resource: read at the
	// next authorize_payment, recorded with the finding, the hold kept.
	a2 := authorizeCall(t, cs, e2ePaymentRequiredAt("https://api.seller.example/data?apikey=SECRET123", "260000", e2eSeller))
	if a2.Decision != "allow" {
		t.Fatalf("a2: %+v", a2)
	}
	rec, err := simrec.New(root, "run-hooked", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := rec.Pay(simrec.Payment{OperationID: "op-1", URL: "https://api.seller.example/elsewhere?apikey=SECRET123", PayTo: e2eSeller, Amount: "260000",
		Network: "eip155:8453", Outcome: "settled", Nonce: a2.Authorization.Nonce,
		Settle: map[string]any{"success": true, "transaction": "0x" + strings.Repeat("72", 32), "network": "eip155:8453", "payer": e2ePayerAddr}}); err != nil {
		t.Fatal(err)
	}
	authorizeCall(t, cs, e2ePaymentRequiredAt("https://api.seller.example/third", "100000", e2eSeller))
	f = next()
	if f.Review.Nonce != a2.Authorization.Nonce || f.Review.Source != "trace" || f.Review.TraceRun != "run-hooked" || !f.Review.HoldKept ||
		strings.Join(f.Review.Fields, ",") != "resource" || !strings.Contains(f.Review.Findings[0], `https://api.seller.example/elsewhere?…`) ||
		!strings.Contains(f.Text, "settlement read from the Trace; its hold still counts as an open payment") {
		t.Fatalf("the Trace's finding: %+v", f)
	}
	// status lists it, with its source.
	if out, _, code := runCLI(t, "status", "--dir", root); code != 3 || !strings.Contains(out, "haia-trace-mcp authorization show "+a2.Authorization.Nonce+
		" (read from the Trace, run run-hooked, line 4; its hold still counts as an open payment)") {
		t.Fatalf("status: %d\n%s", code, out)
	}
}

// TestTraceAmbiguityNotifiedOnce: two settlements of the Trace with the
// terms of one authorization (no nonce to tell them apart) bind neither;
// the ambiguity is recorded as a finding and reaches the reviewers through
// the notification webhook as settlement.finding — once, not again at the
// next sweep — after the agent's next check_before_pay. Both holds stay.
func TestTraceAmbiguityNotifiedOnce(t *testing.T) {
	root := sampleRoot(t)
	dir := t.TempDir()
	key := filepath.Join(dir, "signing-key.pem")
	payerKey := writeSecret(t, "payer.key", "0x"+e2ePayerKey+"\n")
	cfg := writeSecret(t, "guard.json", `{"reviewAbove":"1.00"}`)
	secret := []byte(strings.Repeat("s", 32))
	secretFile := filepath.Join(dir, "webhook-secret")
	if err := os.WriteFile(secretFile, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	got := make(chan []byte, 8)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !hmac.Equal([]byte(r.Header.Get("X-Haia-Signature")), []byte(notify.Sign(secret, body))) || r.Header.Get("X-Haia-Event") != "settlement.finding" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		got <- body
	}))
	t.Cleanup(srv.Close)
	cs := mcpSession(t, nil, "--dir", root, "--key-file", key, "--guard-config", cfg, "--payer-key", payerKey,
		"--notify-url", srv.URL, "--notify-secret-file", secretFile)
	const url = "https://api.seller.example/twice"
	a := authorizeCall(t, cs, e2ePaymentRequiredAt(url, "250000", e2eSeller))
	if a.Decision != "allow" {
		t.Fatalf("allow: %+v", a)
	}
	rec, err := simrec.New(root, "run-twice", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	txs := []string{"0x" + strings.Repeat("81", 32), "0x" + strings.Repeat("82", 32)}
	for i, tx := range txs {
		if err := rec.Pay(simrec.Payment{OperationID: fmt.Sprintf("op-%d", i+1), URL: url, PayTo: e2eSeller, Amount: "250000", Network: "eip155:8453", Outcome: "settled",
			Settle: map[string]any{"success": true, "transaction": tx, "network": "eip155:8453", "payer": e2ePayerAddr}}); err != nil {
			t.Fatal(err)
		}
	}
	check := func() {
		t.Helper()
		if res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "check_before_pay", Arguments: map[string]any{"counterparty": e2eSeller, "amount": "0.10"}}); err != nil || res.IsError {
			t.Fatalf("check_before_pay: %v %+v", err, res)
		}
	}
	check()
	var body []byte
	select {
	case body = <-got:
	case <-time.After(20 * time.Second):
		t.Fatal("no settlement.finding delivered for the ambiguity")
	}
	var m struct {
		Event  string `json:"event"`
		Review struct {
			ReviewID     string   `json:"review_id"`
			Kind         string   `json:"kind"`
			Ambiguity    string   `json:"ambiguity"`
			Nonces       []string `json:"nonces"`
			Transactions []string `json:"transactions"`
			TraceRun     string   `json:"trace_run"`
		} `json:"review"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(body, &m); err != nil || m.Event != "settlement.finding" || !strings.HasPrefix(m.Review.ReviewID, "ambiguity:") ||
		m.Review.Kind != "settlement_ambiguous" || m.Review.Ambiguity != "authorization_fits_several" || strings.Join(m.Review.Nonces, ",") != a.Authorization.Nonce ||
		strings.Join(m.Review.Transactions, ",") != strings.Join(txs, ",") || m.Review.TraceRun != "run-twice" ||
		!strings.Contains(m.Text, "Payment authorization "+a.Authorization.Nonce+" has the terms of 2 settlements read from the Trace") {
		t.Fatalf("the ambiguity's message: %v\n%s", err, body)
	}
	// Another event appended: the next sweep reads the Trace again, finds
	// the same ambiguity, and tells nobody again.
	if err := rec.Pay(simrec.Payment{OperationID: "op-3", URL: "https://api.other.example/x", PayTo: e2eDenied, Amount: "1", Network: "eip155:8453", Outcome: "unsettled"}); err != nil {
		t.Fatal(err)
	}
	check()
	select {
	case again := <-got:
		t.Fatalf("the ambiguity was told again:\n%s", again)
	case <-time.After(3 * time.Second):
	}
	if out, _, code := runCLI(t, "authorization", "show", a.Authorization.Nonce, "--dir", root); code != 0 || !strings.Contains(out, "settlement     none recorded") {
		t.Fatalf("an ambiguous settlement was bound: %d\n%s", code, out)
	}
	// The log's ambiguous record is one audit reads without a complaint.
	if out, errOut, code := runCLI(t, "audit", "--dir", root); code != 0 {
		t.Fatalf("audit: %d %s %s", code, out, errOut)
	}
}

// TestFindingsNotifiedOncePostgres: on the PostgreSQL store a settlement
// with findings is told through the store's outbox, not by the request
// that recorded it: it is recorded by a replica that cannot tell it (it
// has no hook, as one that crashed first could not), and the two replicas
// that share the store with the webhook deliver it once, not both.
func TestFindingsNotifiedOncePostgres(t *testing.T) {
	pgtest.DSN(t)
	dsn := e2eDatabase(t)
	dir := t.TempDir()
	key := filepath.Join(dir, "signing-key.pem")
	payerKey := writeSecret(t, "payer.key", "0x"+e2ePayerKey+"\n")
	cfg := writeSecret(t, "guard.json", `{"reviewAbove":"1.00"}`)
	secret := []byte(strings.Repeat("s", 32))
	secretFile := filepath.Join(dir, "webhook-secret")
	if err := os.WriteFile(secretFile, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	got := make(chan []byte, 8)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Header.Get("X-Haia-Event") == "settlement.finding" && hmac.Equal([]byte(r.Header.Get("X-Haia-Signature")), []byte(notify.Sign(secret, body))) {
			got <- body
		}
	}))
	t.Cleanup(srv.Close)
	args := func(hooks ...string) []string {
		return append([]string{"--dir", sampleRoot(t), "--store", dsn, "--key-file", key, "--guard-config", cfg, "--payer-key", payerKey}, hooks...)
	}
	one := mcpSession(t, nil, args()...)
	for range 2 {
		mcpSession(t, nil, args("--notify-url", srv.URL, "--notify-secret-file", secretFile)...)
	}
	a := authorizeCall(t, one, e2ePaymentRequiredAt("https://api.seller.example/pg", "250000", e2eSeller))
	if a.Decision != "allow" {
		t.Fatalf("allow: %+v", a)
	}
	decodeStructured(t, callTool(t, one, "record_receipt", map[string]any{"nonce": a.Authorization.Nonce, "payment_response": map[string]any{
		"success": true, "transaction": "0x" + strings.Repeat("93", 32), "network": "eip155:8453", "payer": e2eDenied}}), &struct{}{})
	select {
	case body := <-got:
		if !strings.Contains(string(body), `"review_id":"settlement:`+a.Authorization.Nonce+`"`) || !strings.Contains(string(body), `"fields":["payer"]`) {
			t.Fatalf("the finding's message:\n%s", body)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no settlement.finding delivered through the outbox")
	}
	select {
	case again := <-got:
		t.Fatalf("the finding was told twice:\n%s", again)
	case <-time.After(3 * time.Second):
	}
}

// TestProxyPayingCallBindsTraceSettlements: in front of an upstream, the
// guard proxy with a payer binds a settlement the recorder wrote after the
// last authorize_payment at the next paying call it decides, as
// check_before_pay does when it is served.
func TestProxyPayingCallBindsTraceSettlements(t *testing.T) {
	e := newProxyEnv(t, proxyMapJSON, `{"reviewAbove":"1.00"}`)
	payerKey := writeSecret(t, "payer.key", "0x"+e2ePayerKey+"\n")
	payUpstream(t)
	e.cmd = e.command(nil, "--payer-key", payerKey)
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e-proxy", Version: "1"}, nil)
	cs, err := client.Connect(t.Context(), &mcp.CommandTransport{Command: e.cmd}, nil)
	if err != nil {
		t.Fatalf("connect to the proxy: %v (stderr: %s)", err, e.stderr)
	}
	t.Cleanup(func() { cs.Close() })
	e.cs = cs
	const url = "https://api.seller.example/proxied"
	allow := authorizeCall(t, cs, e2ePaymentRequiredAt(url, "250000", e2eSeller))
	if allow.Decision != "allow" {
		t.Fatalf("allow: %+v", allow)
	}
	rec, err := simrec.New(e.root, "run-proxied", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	tx := "0x" + strings.Repeat("5d", 32)
	if err := rec.Pay(simrec.Payment{OperationID: "op-paid", URL: url, PayTo: e2eSeller, Amount: "250000", Network: "eip155:8453", Outcome: "settled",
		Nonce: allow.Authorization.Nonce, Settle: map[string]any{"success": true, "transaction": tx, "network": "eip155:8453", "payer": e2ePayerAddr}}); err != nil {
		t.Fatal(err)
	}
	if res := e.callRaw(t, "send_usdc", `{"to":"`+sellerA+`","amount":"0.25"}`); res.IsError {
		t.Fatalf("the paying call: %s (stderr %s)", resultText(res), e.stderr)
	}
	out, errOut, code := runCLI(t, "authorization", "show", allow.Authorization.Nonce, "--dir", e.root)
	if code != 0 || !strings.Contains(out, "settlement     transaction "+tx) || !strings.Contains(out, "settled by     the Trace: run run-proxied, operation op-paid") {
		t.Fatalf("after the proxied paying call: %d\n%s%s", code, out, errOut)
	}
}
