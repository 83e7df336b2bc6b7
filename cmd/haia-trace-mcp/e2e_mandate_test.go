package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Standing approvals end to end with the real binary: a question only
// reviewAbove sends to review is allowed once alice grants a mandate,
// with what is left said; mandate list and show say what it used; a key
// not trusted writes nothing; a revocation holds for the next question.
func TestMandateEndToEnd(t *testing.T) {
	root := sampleRoot(t)
	keys := t.TempDir()
	reviewers := filepath.Join(keys, "reviewers.json")
	for _, id := range []string{"alice", "mallory"} {
		args := []string{"reviewer", "init", "--id", id, "--key-file", filepath.Join(keys, id+".pem"), "--reviewers", reviewers}
		if id == "mallory" {
			// Mallory's key exists, but another reviewers file trusts it.
			args[len(args)-1] = filepath.Join(keys, "other.json")
		}
		if out, errOut, code := runCLI(t, args...); code != 0 {
			t.Fatalf("reviewer init %s: %d %s %s", id, code, out, errOut)
		}
	}
	policy := filepath.Join(keys, "policy.json")
	if err := os.WriteFile(policy, []byte(`{"reviewAbove": "0.05"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cs := mcpSession(t, nil, "--dir", root, "--key-file", filepath.Join(keys, "signing.pem"), "--agent-id", "agent-007",
		"--reviewers", reviewers, "--guard-config", policy)
	ask := func() checkAnswer {
		t.Helper()
		var a checkAnswer
		decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": sellerA, "amount": "0.10", "asset": "USDC"}), &a)
		return a
	}
	if a := ask(); a.Decision != "review" || !hasRule(a, "review_above") {
		t.Fatalf("before the mandate: %+v", a)
	}
	cli := func(args ...string) (string, string, int) {
		return runCLI(t, append(args, "--dir", root, "--reviewers", reviewers)...)
	}
	out, errOut, code := cli("mandate", "grant", "--payee", sellerA, "--max-amount", "0.50", "--budget", "0.25", "--count", "2", "--expires", "1h",
		"--note", "weekly reports", "--reviewer-key", filepath.Join(keys, "alice.pem"))
	id := regexp.MustCompile(`^mandate (m_[0-9a-f]{16}) granted by alice: up to 0.50 USDC a payment to `).FindStringSubmatch(out)
	if code != 0 || id == nil {
		t.Fatalf("mandate grant: %d %s %s", code, out, errOut)
	}
	a := ask()
	if a.Decision != "allow" || !hasRule(a, "mandate") || !strings.Contains(resultReasons(a), "mandate "+id[1]+": 0.15 USDC and 1 payment left after this one (signed by alice") {
		t.Fatalf("inside the mandate: %+v", a)
	}
	if out, errOut, code := cli("mandate", "list"); code != 0 || !strings.Contains(out, id[1]+"  live") || !strings.Contains(out, "0.10 USDC in 1 payment") || !strings.Contains(out, "0.15 USDC and 1 payment") {
		t.Fatalf("mandate list: %d %s %s", code, out, errOut)
	}
	if out, errOut, code := cli("mandate", "show", id[1]); code != 0 || !strings.Contains(out, "note         weekly reports") || !strings.Contains(out, "signed by    1 of 1 signatures (alice)") {
		t.Fatalf("mandate show: %d %s %s", code, out, errOut)
	}
	// Mallory's key is not trusted: refused, nothing written.
	if out, errOut, code := cli("mandate", "grant", "--payee", sellerA, "--max-amount", "5", "--budget", "50", "--expires", "1h", "--reviewer-key", filepath.Join(keys, "mallory.pem")); code != 6 || !strings.Contains(errOut, "nothing was written") {
		t.Fatalf("an untrusted grant: %d %s %s, want exit 6", code, out, errOut)
	}
	if out, errOut, code := cli("mandate", "revoke", id[1], "--reviewer-key", filepath.Join(keys, "mallory.pem")); code != 6 {
		t.Fatalf("an untrusted revocation: %d %s %s, want exit 6", code, out, errOut)
	}
	if out, _, _ := cli("mandate", "list", "--json"); strings.Count(out, `"kind": "grant"`) != 1 {
		t.Fatalf("after the refused grant: %s", out)
	}
	if out, errOut, code := cli("mandate", "revoke", id[1], "--reviewer-key", filepath.Join(keys, "alice.pem")); code != 0 || !strings.Contains(out, "revoked by alice") {
		t.Fatalf("mandate revoke: %d %s %s", code, out, errOut)
	}
	if a := ask(); a.Decision != "review" || hasRule(a, "mandate") || !strings.Contains(resultReasons(a), "mandate "+id[1]+" does not cover it (revoked by alice") {
		t.Fatalf("after the revocation: %+v", a)
	}
	if out, errOut, code := cli("mandate", "show", "m_0000000000000000"); code != 3 {
		t.Fatalf("an unknown mandate: %d %s %s, want exit 3", code, out, errOut)
	}
	audit := func() (string, string, int) {
		return cli("audit", "--key-file", filepath.Join(keys, "signing.pem"))
	}
	if out, errOut, code := audit(); code != 0 || !strings.Contains(out, "2 mandate records, every use within a signed mandate") {
		t.Fatalf("audit: %d %s %s", code, out, errOut)
	}
	// A writer of the volume raises the mandate's budget: its signature
	// no longer verifies, audit says so (exit 2), and the guard honours
	// none of the records.
	path := filepath.Join(root, "guard", "mandates.ndjson")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(string(data), `"budget_atomic":"250000"`, `"budget_atomic":"250000000"`, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := audit(); code != 2 || !strings.Contains(out, "MANDATE mandate record 1: grant of mandate "+id[1]+` is not trusted: not signed by reviewer "alice"'s trusted key`) {
		t.Fatalf("audit of an edited mandate: %d %s %s, want exit 2", code, out, errOut)
	}
	if a := ask(); a.Decision != "review" || !strings.Contains(resultReasons(a), "the mandate records do not verify") {
		t.Fatalf("the question after the edit: %+v", a)
	}
}

func resultReasons(a checkAnswer) string {
	var b strings.Builder
	for _, r := range a.Reasons {
		b.WriteString(r.Rule + ": " + r.Detail + "\n")
	}
	return b.String()
}

// Ten check_before_pay at once, five to each of two server processes on
// one PostgreSQL store, against a mandate of three payments: exactly
// three are allowed; the revocation through the CLI holds on both from
// the next question.
func TestMandateAcrossPostgresReplicas(t *testing.T) {
	dsn := e2eDatabase(t)
	keys := t.TempDir()
	reviewers := filepath.Join(keys, "reviewers.json")
	if out, errOut, code := runCLI(t, "reviewer", "init", "--id", "alice", "--key-file", filepath.Join(keys, "alice.pem"), "--reviewers", reviewers); code != 0 {
		t.Fatalf("reviewer init: %d %s %s", code, out, errOut)
	}
	policy := filepath.Join(keys, "policy.json")
	if err := os.WriteFile(policy, []byte(`{"reviewAbove": "0.05"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	rs := startReplicas(t, dsn, 2, "--reviewers", reviewers, "--guard-config", policy)
	cli := func(args ...string) (string, string, int) {
		return runCLI(t, append(args, "--dir", rs.root, "--store", dsn, "--reviewers", reviewers)...)
	}
	out, errOut, code := cli("mandate", "grant", "--payee", sellerA, "--max-amount", "1", "--budget", "100", "--count", "3", "--expires", "1h",
		"--reviewer-key", filepath.Join(keys, "alice.pem"))
	id := regexp.MustCompile(`^mandate (m_[0-9a-f]{16}) granted`).FindStringSubmatch(out)
	if code != 0 || id == nil {
		t.Fatalf("mandate grant: %d %s %s", code, out, errOut)
	}
	ask := func(cs *mcp.ClientSession) checkAnswer {
		res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "check_before_pay", Arguments: map[string]any{"counterparty": sellerA, "amount": "0.50"}})
		if err != nil {
			t.Error(err)
			return checkAnswer{}
		}
		var a checkAnswer
		decodeStructured(t, res, &a)
		return a
	}
	var mu sync.Mutex
	got := map[string]int{}
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := ask(rs.sessions[i%2])
			mu.Lock()
			defer mu.Unlock()
			got[a.Decision]++
			if a.Decision == "allow" && !hasRule(a, "mandate") {
				t.Errorf("an allow without the mandate: %+v", a)
			}
		}()
	}
	wg.Wait()
	if got["allow"] != 3 || got["review"] != 7 {
		t.Fatalf("ten questions against three payments: %v, want 3 allow and 7 review", got)
	}
	if out, errOut, code := cli("mandate", "show", id[1]); code != 0 || !strings.Contains(out, "1.50 USDC in 3 payments") || !strings.Contains(out, "left         98.50 USDC and 0 payments") {
		t.Fatalf("mandate show: %d %s %s", code, out, errOut)
	}
	// A second mandate, revoked through the CLI: the next question on
	// each replica is a review again.
	out, errOut, code = cli("mandate", "grant", "--payee", sellerA, "--max-amount", "1", "--budget", "100", "--expires", "1h",
		"--reviewer-key", filepath.Join(keys, "alice.pem"))
	id = regexp.MustCompile(`^mandate (m_[0-9a-f]{16}) granted`).FindStringSubmatch(out)
	if code != 0 || id == nil {
		t.Fatalf("mandate grant: %d %s %s", code, out, errOut)
	}
	for i, cs := range rs.sessions {
		if a := ask(cs); a.Decision != "allow" || !hasRule(a, "mandate") {
			t.Fatalf("replica %d under the second mandate: %+v", i, a)
		}
	}
	if out, errOut, code := cli("mandate", "revoke", id[1], "--reviewer-key", filepath.Join(keys, "alice.pem")); code != 0 {
		t.Fatalf("mandate revoke: %d %s %s", code, out, errOut)
	}
	for i, cs := range rs.sessions {
		if a := ask(cs); a.Decision != "review" || hasRule(a, "mandate") {
			t.Fatalf("replica %d after the revocation: %+v", i, a)
		}
	}
}

// An AP2 open payment mandate imported as alice's own, under a policy
// whose quorum asks two reviewers above 0.05: unusable until bob signs
// it too; a constraint the guard cannot honour is refused by name, with
// nothing written.
func TestMandateImportAndQuorum(t *testing.T) {
	root := sampleRoot(t)
	keys := t.TempDir()
	reviewers := filepath.Join(keys, "reviewers.json")
	for _, id := range []string{"alice", "bob"} {
		if out, errOut, code := runCLI(t, "reviewer", "init", "--id", id, "--key-file", filepath.Join(keys, id+".pem"), "--reviewers", reviewers); code != 0 {
			t.Fatalf("reviewer init %s: %d %s %s", id, code, out, errOut)
		}
	}
	policy := filepath.Join(keys, "policy.json")
	if err := os.WriteFile(policy, []byte(`{"reviewAbove": "0.05", "quorum": [{"above": "0.05", "approvals": 2}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cs := mcpSession(t, nil, "--dir", root, "--key-file", filepath.Join(keys, "signing.pem"), "--agent-id", "agent-007",
		"--reviewers", reviewers, "--guard-config", policy)
	ask := func() checkAnswer {
		t.Helper()
		var a checkAnswer
		decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": "a.example.com", "pay_to": sellerA, "amount": "0.10"}), &a)
		return a
	}
	cli := func(args ...string) (string, string, int) {
		return runCLI(t, append(args, "--dir", root, "--reviewers", reviewers)...)
	}
	exp := time.Now().Add(2 * time.Hour).Unix()
	ap2 := `{"vct": "mandate.payment.open.1", "cnf": {}, "exp": ` + strconv.FormatInt(exp, 10) + `, "constraints": [
	  {"type": "payment.allowed_payees", "allowed": [{"id": "` + sellerA + `", "name": "A", "website": "https://a.example.com"}]},
	  {"type": "payment.amount_range", "currency": "USD", "max": 25},
	  {"type": "payment.budget", "currency": "USD", "max": 1},
	  {"type": "payment.agent_recurrence", "frequency": "ON_DEMAND", "max_occurrences": 4},
	  {"type": "payment.reference", "conditional_transaction_id": "checkout-digest-1"}]}`
	file := filepath.Join(keys, "ap2.json")
	write := func(s string) {
		if err := os.WriteFile(file, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(strings.Replace(ap2, `"ON_DEMAND"`, `"WEEKLY"`, 1))
	if out, errOut, code := cli("mandate", "import", file, "--reviewer-key", filepath.Join(keys, "alice.pem")); code != 9 || !strings.Contains(errOut, "payment.agent_recurrence.frequency WEEKLY is a constraint the guard cannot honour") {
		t.Fatalf("a weekly recurrence: %d %s %s, want exit 9", code, out, errOut)
	}
	if out, _, _ := cli("mandate", "list"); !strings.Contains(out, "no mandates") {
		t.Fatalf("after the refused import: %s", out)
	}
	write(ap2)
	out, errOut, code := cli("mandate", "import", file, "--reviewer-key", filepath.Join(keys, "alice.pem"))
	id := regexp.MustCompile(`^mandate (m_[0-9a-f]{16}) granted by alice: up to 0.25 USDC a payment to 0xa11ce00000000000000000000000000000000001 for a.example.com by any caller, 1.00 USDC in all in at most 4 payments`).FindStringSubmatch(out)
	if code != 0 || id == nil || !strings.Contains(out, "it needs 1 more signature from other trusted reviewers") || !strings.Contains(out, "AP2 payment reference: checkout-digest-1") {
		t.Fatalf("mandate import: %d %s %s", code, out, errOut)
	}
	if a := ask(); a.Decision != "review" || !strings.Contains(resultReasons(a), "mandate "+id[1]+" does not cover it (signed by 1 of the 2 reviewers it needs)") {
		t.Fatalf("with alice's signature alone: %+v", a)
	}
	if out, errOut, code := cli("mandate", "sign", id[1], "--reviewer-key", filepath.Join(keys, "alice.pem")); code != 4 {
		t.Fatalf("alice signing twice: %d %s %s, want exit 4", code, out, errOut)
	}
	if out, errOut, code := cli("mandate", "sign", id[1], "--reviewer-key", filepath.Join(keys, "bob.pem")); code != 0 || !strings.Contains(out, "2 of 2 signatures (alice, bob)") {
		t.Fatalf("bob's signature: %d %s %s", code, out, errOut)
	}
	if a := ask(); a.Decision != "allow" || !strings.Contains(resultReasons(a), "mandate "+id[1]+": 0.90 USDC and 3 payments left after this one (signed by alice and bob") {
		t.Fatalf("with both signatures: %+v", a)
	}
}
