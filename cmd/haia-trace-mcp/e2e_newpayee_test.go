package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A first payment to a new payee, its name, and the spend against the
// limits, end to end with the real binary: the question for a payee the
// sample Trace never paid answers review, naming it "(Weather API)" in the
// answer, get_review_status and review list and show; alice's approval is used once and
// the payee is then known; status (text and --json) shows what the
// ledger holds against each limit, per payee with its name and in total.
func TestNewPayeeNamesAndSpendEndToEnd(t *testing.T) {
	const weather = "0xc0c0000000000000000000000000000000000003"
	root := sampleRoot(t)
	keys := t.TempDir()
	reviewers := filepath.Join(keys, "reviewers.json")
	if out, errOut, code := runCLI(t, "reviewer", "init", "--id", "alice", "--key-file", filepath.Join(keys, "alice.pem"), "--reviewers", reviewers); code != 0 {
		t.Fatalf("reviewer init: %d %s %s", code, out, errOut)
	}
	policy := filepath.Join(keys, "policy.json")
	if err := os.WriteFile(policy, []byte(`{"reviewNewPayee": true, "payees": {"0xC0C0000000000000000000000000000000000003": "Weather API"},
	  "totalLimit": {"amount": "10.00"}, "velocity": {"perCounterparty": {"count": 5}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	// The server's default key (the tests' config directory), which status
	// finds to verify the ledger.
	cs := mcpSession(t, nil, "--dir", root, "--agent-id", "agent-007", "--reviewers", reviewers, "--guard-config", policy)
	ask := func(amount string) (checkAnswer, string) {
		t.Helper()
		var a checkAnswer
		res := callTool(t, cs, "check_before_pay", map[string]any{"counterparty": strings.ToUpper("0x" + weather[2:]), "amount": amount, "asset": "USDC"})
		decodeStructured(t, res, &a)
		return a, resultText(res)
	}
	first, text := ask("0.10")
	named := weather + " (Weather API)"
	if first.Decision != "review" || !hasRule(first, "new_payee") || !strings.Contains(text, "first payment to "+named) {
		t.Fatalf("the first question: %+v\n%s", first, text)
	}
	if res := callTool(t, cs, "get_review_status", map[string]any{"review_id": first.ReviewID}); !strings.Contains(resultText(res), "to "+named) {
		t.Fatalf("get_review_status: %s", resultText(res))
	}
	if out, errOut, code := runCLI(t, "review", "list", "--dir", root, "--reviewers", reviewers); code != 0 || !strings.Contains(out, named) || !strings.Contains(out, "new_payee") {
		t.Fatalf("review list: %d %s %s", code, out, errOut)
	}
	if out, errOut, code := runCLI(t, "review", "show", first.ReviewID, "--dir", root, "--reviewers", reviewers); code != 0 || !strings.Contains(out, "to "+named) {
		t.Fatalf("review show: %d %s %s", code, out, errOut)
	}
	if out, errOut, code := runCLI(t, "review", "approve", first.ReviewID, "--dir", root, "--reviewers", reviewers, "--reviewer-key", filepath.Join(keys, "alice.pem"), "--note", "our weather vendor"); code != 0 {
		t.Fatalf("approve: %d %s %s", code, out, errOut)
	}
	if a, _ := ask("0.10"); a.Decision != "allow" || !hasRule(a, "human_approved") {
		t.Fatalf("the approved retry: %+v", a)
	}
	if a, text := ask("0.20"); a.Decision != "allow" || hasRule(a, "new_payee") {
		t.Fatalf("the payee, known: %+v\n%s", a, text)
	}

	out, errOut, code := runCLI(t, "status", "--dir", root, "--reviewers", reviewers)
	for _, want := range []string{
		named + " 0.30 USDC of 5.00 USDC (6%) in 24 hours under perCounterpartyLimit: 0.00 USDC paid, 0.30 USDC held",
		"2 payments of 5 payments (40%) in 1 hour under velocity.perCounterparty: 0 payments paid, 2 payments held",
		"total (every counterparty)                   0.30 USDC of 10.00 USDC (3%) in 24 hours under totalLimit",
		"0.20 USDC to " + named + " by agent-007",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status does not say %q", want)
		}
	}
	if t.Failed() || code != 0 {
		t.Fatalf("status: %d\n%s\n%s", code, out, errOut)
	}
	out, errOut, code = runCLI(t, "status", "--dir", root, "--reviewers", reviewers, "--json")
	var rep struct {
		Spend struct {
			Counterparties []struct {
				Counterparty, Name string
				Limits             []struct{ Limit, Paid, Held, Used, Max string }
			}
			Total []struct{ Limit, Used, Max string }
		}
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 0 {
		t.Fatalf("status --json: %d %v\n%s\n%s", code, err, out, errOut)
	}
	c := rep.Spend.Counterparties
	if len(c) == 0 || c[0].Counterparty != weather || c[0].Name != "Weather API" || c[0].Limits[0].Held != "0.30 USDC" || c[0].Limits[0].Max != "5.00 USDC" ||
		len(rep.Spend.Total) != 1 || rep.Spend.Total[0].Used != "0.30 USDC" {
		t.Fatalf("status --json spend: %+v", rep.Spend)
	}
}
