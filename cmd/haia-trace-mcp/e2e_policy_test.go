package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const blockingPolicy = `{
  "spec": "noa.policy/0.2",
  "id": "no-big-first-payments",
  "requiredPaths": ["args.counterparty", "history.settledOperations"],
  "rules": [
    {"id": "big-without-settled-history",
     "when": {"op": "and", "clauses": [
       {"op": "gt", "path": "amountAtomic", "value": 2000000},
       {"op": "eq", "path": "history.settledOperations", "value": 0}]},
     "then": "DENY"},
    {"id": "otherwise", "when": {"op": "exists", "path": "args.counterparty"}, "then": "ALLOW"}
  ]
}`

// writeGuardConfig writes a guard config naming policyJSON as custom rules.
func writeGuardConfig(t *testing.T, policyJSON string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.json"), []byte(policyJSON), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "haia-guard.config.json")
	if err := os.WriteFile(cfg, []byte(`{"policy": "rules.json"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestCustomRulesEndToEnd(t *testing.T) {
	root := sampleRoot(t)
	key := filepath.Join(t.TempDir(), "key.pem")
	cs := mcpSession(t, nil, "--dir", root, "--key-file", key, "--guard-config", writeGuardConfig(t, blockingPolicy))

	const newcomer = "0xC0FFEE0000000000000000000000000000000003"
	var big checkAnswer
	decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": newcomer, "amount": "2.50"}), &big)
	if big.Decision != "block" || !hasRule(big, "custom_rule") || big.ReviewID != "" {
		t.Fatalf("2.50 to a newcomer under the blocking policy: %+v", big)
	}
	var detail string
	for _, r := range big.Reasons {
		if r.Rule == "custom_rule" {
			detail = r.Detail
		}
	}
	if !strings.Contains(detail, `"big-without-settled-history"`) || !strings.Contains(detail, `"no-big-first-payments"`) {
		t.Fatalf("the reason must name the rule and the policy: %q", detail)
	}
	if big.Reasons[len(big.Reasons)-1].Rule != "history" {
		t.Fatalf("history must stay last: %+v", big.Reasons)
	}
	var small checkAnswer
	decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": newcomer, "amount": "0.50"}), &small)
	if small.Decision != "allow" {
		t.Fatalf("0.50 under the blocking policy: %+v", small)
	}
	// Seller A has settled history: the custom rule allows, the built-in
	// review_above still asks a human.
	var settled checkAnswer
	decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": sellerA, "amount": "2.50"}), &settled)
	if settled.Decision != "review" || hasRule(settled, "custom_rule") {
		t.Fatalf("2.50 to a settled seller: %+v", settled)
	}
	chain, _ := chainFile(t, root)
	data, _ := os.ReadFile(chain)
	if strings.Count(string(data), `"policyHash":"sha256:`) != 3 {
		t.Fatalf("every receipt under custom rules must carry governance.compliance:\n%s", data)
	}
	if got, code := verifyChain(t, root, chain); code != 0 {
		t.Fatalf("verify: %d %s", code, got)
	}

	// An invalid policy stops the start, with the reason.
	_, errOut, code := runCLIStdin(t, "", "--dir", root, "--key-file", key, "--guard-config",
		writeGuardConfig(t, `{"spec": "noa.policy/0.2", "id": "x", "rules": [{"id": "r", "when": {"op": "gt", "path": "a"}, "then": "DENY"}]}`))
	if code == 0 || !strings.Contains(errOut, "invalid, refusing to start") {
		t.Fatalf("invalid policy: code %d, stderr %q", code, errOut)
	}
}
