package main

import (
	"bytes"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/pgtest"
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
	if out, errOut, code := runCLI(t, "dossier", "export", allow.Authorization.Nonce, "--dir", root, "--store", dsn, "--out", file); code != 0 {
		t.Fatalf("export: %d %s %s", code, out, errOut)
	}
	if out, _, code := runCLI(t, "dossier", "verify", file); code != 1 || !strings.Contains(out, "VALID      settlement") {
		t.Fatalf("verify on the file's keys: %d\n%s", code, out)
	}
}
