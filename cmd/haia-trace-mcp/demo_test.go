package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDemo runs the demo as a new user would and checks its milestones.
func TestDemo(t *testing.T) {
	keep := filepath.Join(t.TempDir(), "demo")
	out, errOut, code := runCLI(t, "demo", "--keep", keep)
	if code != 0 {
		t.Fatalf("demo exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	milestones := []string{
		"op-2: paid 0.40 USDC to 0x5e11e4000000000000000000000000000000b002 for https://quotes.example.net/live",
		"$ haia-trace-mcp reviewer init --id operator --key-file",
		"no tool that approves or rejects",
		"run-demo / op-2: partial (missing: settlement)",
		"run-demo / op-1: full",
		"decision: REVIEW",
		"- open_partial:",
		"review_url: http://localhost:",
		"/console/reviews/",
		"the reviewer console",
		"$ haia-trace-mcp review list",
		"--console-url http://localhost:",
		"LINK",
		"$ haia-trace-mcp review reject",
		"--reviewer-key",
		"rejected by operator",
		": rejected — \"op-2 never settled; ask the seller first\"",
		"look the same",
		"BLOCK (human_rejected)",
		"decision: ALLOW",
		"$ haia-trace-mcp payer address --payer-key",
		"the 402 of reports.example.com: 0.25 USDC to ",
		"decision: ALLOW — signed an EIP-3009 authorization from ",
		"PAYMENT-SIGNATURE header",
		"the 402 of quotes.example.net: 0.40 USDC to ",
		"REVIEW, nothing is signed",
		"- open_partial:",
		"$ haia-trace-mcp authorization show 0x",
		"CONSISTENT: the terms, the payer's signature and the signed receipts agree",
		"$ haia-trace-mcp audit",
		"CONSISTENT",
		"$ haia-trace-mcp verify",
		"VALID: ",
		"$ haia-trace-mcp verify",
		"VALID: ",
		"record_receipt: the seller's settlement",
		"$ haia-trace-mcp dossier export",
		"$ haia-trace-mcp dossier verify",
		"VALID      settlement",
		"Demo complete",
		"the payment's dossier VALID",
	}
	rest := out
	for _, m := range milestones {
		i := strings.Index(rest, m)
		if i < 0 {
			t.Fatalf("transcript lacks %q after the earlier milestones:\n%s", m, out)
		}
		rest = rest[i+len(m):]
	}
	// Step 9 says what was signed as the review log recorded it: the
	// payer, the payee, the amount and the resource of the one signed
	// authorization, the review the other 402 opened; and the proof shows
	// the same resource.
	data, err := os.ReadFile(filepath.Join(keep, ".trace", "guard", "decisions.ndjson"))
	if err != nil {
		t.Fatalf("--keep did not keep the root: %v", err)
	}
	var signed, opened struct {
		ReviewID      string `json:"review_id"`
		Authorization struct {
			From, To, Value, Resource, Nonce string
		} `json:"authorization"`
	}
	nSigned := 0
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var head struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal([]byte(line), &head); err != nil {
			t.Fatalf("review log line %q: %v", line, err)
		}
		switch head.Type {
		case "authorized":
			nSigned++
			json.Unmarshal([]byte(line), &signed)
		case "opened":
			json.Unmarshal([]byte(line), &opened) // the last one: the silent seller's 402
		}
	}
	a := signed.Authorization
	if nSigned != 1 || a.Value != "250000" || a.To != demoSellerSettles || !strings.HasPrefix(a.Resource, "https://reports.example.com/") || opened.ReviewID == "" {
		t.Fatalf("the review log holds %d authorizations (%+v), last review %q", nSigned, a, opened.ReviewID)
	}
	_, step9, _ := strings.Cut(out, "\n== 9. ")
	for _, want := range []string{
		"\n  the 402 of reports.example.com: 0.25 USDC to " + a.To + " for " + a.Resource + "\n",
		"\n  decision: ALLOW — signed an EIP-3009 authorization from " + a.From + " to " + a.To + " for exactly 0.25 USDC, valid until ",
		"; nonce " + a.Nonce + ", derived from receipt ",
		"\n  review_id: " + opened.ReviewID + ", a new review",
		"\n      resource       " + a.Resource + "\n",
	} {
		if !strings.Contains(step9, want) {
			t.Errorf("step 9 does not say %q, as the review log recorded it:\n%s", want, step9)
		}
	}
	if _, _, code := runCLI(t, "demo", "--keep", keep); code == 0 {
		t.Fatal("demo reused an existing --keep directory")
	}
}
