package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
)

// attackRoot is a Trace root holding, under one seller each, the attacks of
// issue 12 that were answered allow on version 1, and one run a seller made
// unreadable with a 402 answer nested past the reader's depth bound.
func attackRoot(t *testing.T) (string, map[string]string) {
	t.Helper()
	root := filepath.Join(t.TempDir(), ".trace")
	seller := func(n int) string { return fmt.Sprintf("0x%040x", 0xa77ac0+n) }
	rec, err := simrec.New(root, "run-a", time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	ps := []simrec.Payment{
		{OperationID: "settle-false", URL: "https://s1.example/x", PayTo: seller(1), Amount: "100000", Outcome: "settled", Settle: map[string]any{"success": false}},
		{OperationID: "upper-0x", URL: "https://s2.example/x", PayTo: "0X" + strings.ToUpper(seller(2)[2:]), Amount: "100000", Outcome: "unsettled"},
		{OperationID: "two-pay-to", URL: "https://s3.example/x", PayTo: seller(3), SubmittedPayTo: seller(4), Amount: "100000", Outcome: "unsettled"},
		{OperationID: "userinfo", URL: "https://agent:pw@API.S5.example:8443/x", PayTo: seller(5), Amount: "100000", Outcome: "unsettled"},
		{OperationID: "unicode", URL: "https://bücher.example/x", PayTo: seller(6), Amount: "100000", Outcome: "unsettled"},
		{OperationID: "no-pay-to", URL: "https://s7.example/x", PayTo: "seller seven", Amount: "100000", Outcome: "unsettled"},
	}
	if err := rec.PayAll(ps); err != nil {
		t.Fatal(err)
	}
	hostile, err := simrec.New(root, "run-hostile", time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	deep := json.RawMessage(strings.Repeat("[", 5000) + strings.Repeat("]", 5000))
	if err := hostile.PayAll([]simrec.Payment{
		{OperationID: "hidden", URL: "https://s8.example/x", PayTo: seller(8), Amount: "100000", Outcome: "unsettled"},
		{OperationID: "cover", URL: "https://s8.example/x", PayTo: seller(8), Amount: "1", Outcome: "walked-away", OfferExtra: deep},
	}); err != nil {
		t.Fatal(err)
	}
	return root, map[string]string{"1": seller(1), "2": seller(2), "3": seller(3), "4": seller(4), "6": seller(6), "8": seller(8)}
}

// Every attack answers review (or a tool error for the lens), with the
// reason that names why, over stdio and over HTTP, through the real binary.
func TestAttacksEndToEnd(t *testing.T) {
	root, sellers := attackRoot(t)
	cases := []struct {
		counterparty string
		rule         string
	}{
		{sellers["1"], "open_partial"},            // settle.success false
		{sellers["2"], "open_partial"},            // pay_to spelled 0X…
		{sellers["3"], "open_partial"},            // events disagree on pay_to …
		{sellers["4"], "open_partial"},            // … and count against both
		{"api.s5.example", "open_partial"},        // userinfo, case and port
		{"xn--bcher-kva.example", "open_partial"}, // Unicode host against its punycode
		{sellers["6"], "open_partial"},
		{"0x" + strings.Repeat("7", 40), "unattributable_history"}, // a paid, unsettled operation with no usable pay_to
		{sellers["8"], "unreadable_history"},                       // the seller's own debt hidden in an unreadable run
	}
	check := func(t *testing.T, cs *mcp.ClientSession) {
		for _, tc := range cases {
			var a checkAnswer
			decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": tc.counterparty, "amount": "0.10"}), &a)
			if a.Decision == "allow" || !hasRule(a, tc.rule) {
				t.Errorf("%s: %s, want review with rule %s; reasons %+v", tc.counterparty, a.Decision, tc.rule, a.Reasons)
			}
		}
		for _, lens := range []string{"x402-seller", "x402-facilitator", "escrow-arc"} {
			res := callTool(t, cs, "check_before_pay", map[string]any{"counterparty": sellers["1"], "amount": "0.10", "template": lens})
			if !res.IsError || !strings.Contains(resultText(res), "x402-buyer") {
				t.Errorf("template %s: %v %q, want a tool error naming the allowed templates", lens, res.IsError, resultText(res))
			}
		}
	}
	key := filepath.Join(t.TempDir(), "signing.pem")

	t.Run("stdio", func(t *testing.T) {
		cs := mcpSession(t, nil, "--dir", root, "--key-file", key, "--agent-id", "attacker")
		// A template written after start, named like a bundled one, must
		// change nothing: under it every buyer operation would be full.
		evil := "template: x402-buyer\nversion: 2\nstages:\n  - id: challenge\n    required: true\n    match:\n      - event: x402.payment.required\n"
		if err := os.MkdirAll(filepath.Join(root, "templates"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, "templates", "x402-buyer.yaml"), []byte(evil), 0o644); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(filepath.Join(root, "templates", "x402-buyer.yaml"))
		check(t, cs)
	})

	t.Run("http", func(t *testing.T) {
		dir := t.TempDir()
		secret := []byte(strings.Repeat("s", 48))
		secretFile := filepath.Join(dir, "secret")
		if err := os.WriteFile(secretFile, secret, 0o600); err != nil {
			t.Fatal(err)
		}
		p := startHTTPBinary(t, "--dir", root, "--key-file", key, "--auth-issuer", "http://127.0.0.1/local-as", "--auth-hmac-secret", secretFile)
		tok := signHS256(t, secret, map[string]any{"iss": "http://127.0.0.1/local-as", "aud": p.resource, "sub": "attacker-http",
			"exp": time.Now().Add(time.Hour).Unix(), "iat": time.Now().Unix()})
		cs, err := httpSession(t, p.resource, func() string { return tok })
		if err != nil {
			t.Fatalf("connect: %v\n%s", err, p.logs())
		}
		defer cs.Close()
		check(t, cs)
	})
}
