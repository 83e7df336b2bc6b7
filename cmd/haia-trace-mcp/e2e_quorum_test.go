package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The two-person rule end to end: under a policy whose quorum needs two
// approvals, alice's approval through the CLI leaves the review pending
// ("1 of 2 approvals (alice)" in review show and get_review_status) and
// the agent's question still answers review; her second approval is
// refused; bob's completes it, and the agent's question is then allowed,
// once.
func TestTwoPersonRuleEndToEnd(t *testing.T) {
	root := sampleRoot(t)
	keys := t.TempDir()
	reviewers := filepath.Join(keys, "reviewers.json")
	for _, id := range []string{"alice", "bob"} {
		if out, errOut, code := runCLI(t, "reviewer", "init", "--id", id, "--key-file", filepath.Join(keys, id+".pem"), "--reviewers", reviewers); code != 0 {
			t.Fatalf("reviewer init %s: %d %s %s", id, code, out, errOut)
		}
	}
	policy := filepath.Join(keys, "policy.json")
	if err := os.WriteFile(policy, []byte(`{"quorum": [{"above": "0.05", "approvals": 2}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cs := mcpSession(t, nil, "--dir", root, "--key-file", filepath.Join(keys, "signing.pem"), "--agent-id", "agent-007",
		"--reviewers", reviewers, "--guard-config", policy)
	ask := func() checkAnswer {
		t.Helper()
		var a checkAnswer
		decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": sellerB, "amount": "0.10", "asset": "USDC"}), &a)
		return a
	}
	first := ask()
	if first.Decision != "review" || first.ReviewID == "" {
		t.Fatalf("the question: %+v", first)
	}
	id := first.ReviewID
	approve := func(who string, extra ...string) (string, string, int) {
		args := append([]string{"review", "approve", id, "--dir", root, "--reviewers", reviewers, "--reviewer-key", filepath.Join(keys, who+".pem")}, extra...)
		return runCLI(t, args...)
	}
	if out, errOut, code := approve("alice", "--note", "fine"); code != 2 || !strings.Contains(errOut, "does not complete them") {
		t.Fatalf("alice's approval with a note: %d %s %s, want it refused (exit 2)", code, out, errOut)
	}
	if out, errOut, code := approve("alice"); code != 0 || !strings.Contains(out, "1 of 2 approvals (alice)") || !strings.Contains(out, "1 more approval from another trusted reviewer") {
		t.Fatalf("alice's approval: %d %s %s", code, out, errOut)
	}
	if out, errOut, code := runCLI(t, "review", "show", id, "--dir", root, "--reviewers", reviewers); code != 0 || !strings.Contains(out, "status       pending") || !strings.Contains(out, "approvals    1 of 2 approvals (alice)") {
		t.Fatalf("review show: %d %s %s", code, out, errOut)
	}
	if out, errOut, code := runCLI(t, "status", "--dir", root, "--reviewers", reviewers); code != 0 || !strings.Contains(out, "review "+id+": 1 of 2 approvals (alice)") {
		t.Fatalf("status: %d %s %s", code, out, errOut)
	}
	res := callTool(t, cs, "get_review_status", map[string]any{"review_id": id})
	var status map[string]any
	decodeStructured(t, res, &status)
	if status["status"] != "pending" || status["quorum"] != "1 of 2 approvals (alice)" || !strings.Contains(resultText(res), "1 of 2 approvals (alice)") {
		t.Fatalf("get_review_status: %v / %s", status, resultText(res))
	}
	if again := ask(); again.Decision != "review" || again.ReviewID != id {
		t.Fatalf("the question after one approval of two: %+v", again)
	}
	if out, errOut, code := approve("alice"); code != 4 || !strings.Contains(errOut, "counts once") {
		t.Fatalf("alice's second approval: %d %s %s, want it refused (exit 4)", code, out, errOut)
	}
	if out, errOut, code := approve("bob", "--note", "second pair of eyes"); code != 0 || !strings.Contains(out, "approved by bob") || !strings.Contains(out, "2 of 2 approvals (alice, bob)") {
		t.Fatalf("bob's approval: %d %s %s", code, out, errOut)
	}
	allowed := ask()
	if allowed.Decision != "allow" || allowed.ReviewID != id || !hasRule(allowed, "human_approved") {
		t.Fatalf("the question after two approvals: %+v", allowed)
	}
	if next := ask(); next.Decision != "review" || next.ReviewID == id {
		t.Fatalf("the approval was used twice: %+v", next)
	}
}
