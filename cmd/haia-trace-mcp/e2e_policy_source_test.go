package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/simrec"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/filestore"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/pgstore"
)

// openedAgo opens a review in st as the server would have, ago in the past,
// and returns its id.
func openedAgo(t *testing.T, st reviewlog.Store, ago time.Duration, amount string) string {
	t.Helper()
	l := reviewlog.OpenStore(st, reviewlog.Options{Now: func() time.Time { return time.Now().Add(-ago) }})
	q := guard.Question{Counterparty: sellerB, Amount: amount, Asset: guard.USDCBase, Template: "x402-buyer"}
	out, err := engine.Ask(context.Background(), l, engine.AskRequest{Caller: "agent-1", Question: q, Decision: guard.Review,
		ParamsHash: "hmac-sha256:" + strings.Repeat("cd", 32), Reasons: []guard.Reason{{Rule: "review_above", Detail: "above"}, {Rule: "history", Detail: "read"}}},
		serverTerms(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	return out.Review.ID
}

func fileStoreAt(t *testing.T, root string) reviewlog.Store {
	t.Helper()
	r, err := confined.OpenRoot(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return filestore.New(r)
}

// TestOnePolicySourceEndToEnd: the policy init writes beside the Trace root
// is found by the server without --guard-config; the server records it in
// its store; a plain `review approve` then decides under it — a review
// expired under the server's reviewTtlMinutes (60) is refused as expired,
// though the built-in 24 hours would let it through; a --guard-config that
// is not the server's is refused; and where no server recorded a policy,
// approve refuses to decide unless told which policy with --guard-config.
func TestOnePolicySourceEndToEnd(t *testing.T) {
	work := t.TempDir()
	root := loopRootAt(t, filepath.Join(work, ".trace"))
	if err := os.WriteFile(filepath.Join(work, "haia-guard.config.json"), []byte(`{"reviewTtlMinutes": 60}`), 0o644); err != nil {
		t.Fatal(err)
	}
	old := openedAgo(t, fileStoreAt(t, root), 2*time.Hour, "0.50")

	// Before any server ran here, nothing is recorded: no decision.
	if _, errOut, code := runCLI(t, "review", "approve", old, "--dir", root); code != exitFail || !strings.Contains(errOut, "cannot decide") || !strings.Contains(errOut, "not recorded") {
		t.Fatalf("approve with no policy recorded: %d %s", code, errOut)
	}
	if out, errOut, code := runCLI(t, "review", "list", "--dir", root); code != 0 || !strings.Contains(out, old) || !strings.Contains(errOut, "not recorded") {
		t.Fatalf("list with no policy recorded: %d %s %s", code, out, errOut)
	}

	// The server, started without --guard-config, finds init's file and
	// records it; it opens a fresh review.
	var stderr strings.Builder
	cs := mcpSession(t, &stderr, "--dir", root, "--key-file", filepath.Join(t.TempDir(), "signing.pem"))
	var a checkAnswer
	decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": sellerB, "amount": "2.00"}), &a)
	if a.Decision != "review" || a.ReviewID == "" {
		t.Fatalf("the server opened no review: %+v", a)
	}
	cs.Close()
	if !strings.Contains(stderr.String(), "haia-guard.config.json") {
		t.Errorf("the server's log does not name the policy it found:\n%s", stderr.String())
	}

	if _, errOut, code := runCLI(t, "review", "approve", old, "--dir", root); code != reviewExitExpired || !strings.Contains(errOut, "expired") {
		t.Fatalf("plain approve of a review expired under the server's reviewTtlMinutes: %d %s", code, errOut)
	}
	other := filepath.Join(t.TempDir(), "other.json")
	if err := os.WriteFile(other, []byte(`{"reviewTtlMinutes": 1440}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := runCLI(t, "review", "approve", old, "--dir", root, "--guard-config", other); code != exitUsage || !strings.Contains(errOut, "is not the policy the server runs with") {
		t.Fatalf("approve under another --guard-config: %d %s", code, errOut)
	}
	if _, errOut, code := runCLI(t, "review", "approve", old, "--dir", root, "--guard-config", filepath.Join(work, "haia-guard.config.json")); code != reviewExitExpired {
		t.Fatalf("approve under the server's own file, named: %d %s", code, errOut)
	}
	if out, errOut, code := runCLI(t, "review", "approve", a.ReviewID, "--dir", root, "--note", "fine"); code != 0 {
		t.Fatalf("approve of the fresh review: %d %s %s", code, out, errOut)
	}
	out, _, _ := runCLI(t, "review", "list", "--dir", root, "--all", "--json")
	if !strings.Contains(strings.ReplaceAll(out, " ", ""), `"status":"expired"`) {
		t.Errorf("the old review is not listed expired under the server's policy: %s", out)
	}

	// A root where no server ran, told explicitly which policy: it decides.
	bare := loopRootAt(t, filepath.Join(t.TempDir(), ".trace"))
	id := openedAgo(t, fileStoreAt(t, bare), time.Minute, "0.40")
	if out, errOut, code := runCLI(t, "review", "reject", id, "--dir", bare, "--guard-config", other); code != 0 {
		t.Fatalf("reject with an explicit --guard-config and nothing recorded: %d %s %s", code, out, errOut)
	}
}

// TestOnePolicySourcePostgres: the same contract on the PostgreSQL store.
func TestOnePolicySourcePostgres(t *testing.T) {
	dsn := e2eDatabase(t)
	root := loopRoot(t)
	cfg := filepath.Join(t.TempDir(), "policy.json")
	if err := os.WriteFile(cfg, []byte(`{"reviewTtlMinutes": 60}`), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := pgstore.Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	old := openedAgo(t, st, 2*time.Hour, "0.50")
	if _, errOut, code := runCLI(t, "review", "approve", old, "--dir", root, "--store", dsn); code != exitFail || !strings.Contains(errOut, "cannot decide") {
		t.Fatalf("approve with no policy recorded: %d %s", code, errOut)
	}
	cs := mcpSession(t, nil, "--dir", root, "--store", dsn, "--guard-config", cfg, "--key-file", filepath.Join(t.TempDir(), "signing.pem"))
	callTool(t, cs, "list_operations", nil)
	cs.Close()
	if _, errOut, code := runCLI(t, "review", "approve", old, "--dir", root, "--store", dsn); code != reviewExitExpired || !strings.Contains(errOut, "expired") {
		t.Fatalf("plain approve of a review expired under the server's reviewTtlMinutes: %d %s", code, errOut)
	}
}

// loopRootAt is loopRoot at a chosen path.
func loopRootAt(t *testing.T, root string) string {
	t.Helper()
	rec, err := simrec.New(root, "run-1", time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if err := rec.Pay(simrec.Payment{OperationID: "op-1", URL: "https://b.example.net/x", PayTo: sellerB, Amount: "100000", Outcome: "unsettled"}); err != nil {
		t.Fatal(err)
	}
	return root
}

// TestPolicyReloadOnSIGHUP: the real server re-reads its policy on SIGHUP,
// like its templates: a valid file is put in force (and recorded in the
// store for the review commands); a file that does not load, or names a
// history template that does not exist, keeps the running policy and the
// log says why.
func TestPolicyReloadOnSIGHUP(t *testing.T) {
	root := loopRoot(t)
	cfg := filepath.Join(t.TempDir(), "policy.json")
	write := func(text string) {
		t.Helper()
		// Replaced whole, as an editor or a configuration volume does.
		tmp := cfg + ".tmp"
		if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, cfg); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"reviewAbove": "5", "perCounterpartyLimit": {"amount": "100"}}`)
	stderr := &lockedBuffer{}
	cs, cmd := mcpSessionCmd(t, stderr, "--dir", root, "--guard-config", cfg, "--key-file", filepath.Join(t.TempDir(), "signing.pem"))
	ask := func(amount string) checkAnswer {
		t.Helper()
		var a checkAnswer
		decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": "0x00000000000000000000000000000000000000d4", "amount": amount}), &a)
		return a
	}
	hup := func(wantLog string) {
		t.Helper()
		n := strings.Count(stderr.String(), wantLog)
		if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the log to say "+wantLog, func() bool { return strings.Count(stderr.String(), wantLog) > n })
	}
	if a := ask("2.00"); a.Decision != "allow" {
		t.Fatalf("2.00 under reviewAbove 5: %+v", a)
	}

	write(`{"reviewAbove": "1", "perCounterpartyLimit": {"amount": "100"}, "reviewTtlMinutes": 30}`)
	hup("SIGHUP: guard policy reloaded")
	if a := ask("2.00"); a.Decision != "review" || !hasRule(a, "review_above") {
		t.Fatalf("2.00 after reloading reviewAbove 1: %+v", a)
	}
	// The store records the reloaded policy: the review commands accept it
	// as the server's, and judge expiry under its 30 minutes.
	if out, errOut, code := runCLI(t, "review", "list", "--dir", root, "--guard-config", cfg); code != 0 {
		t.Fatalf("review list with the reloaded file: %d %s %s", code, out, errOut)
	}

	for _, bad := range []struct{ text, why string }{
		{`{"reviewAbove": "lots"}`, "reviewAbove"},
		{`{"reviewAbove": "9", "historyTemplates": ["no-such-template"]}`, "no-such-template"},
		{`{"reviewAbove": "9", "policy": "missing-rules.json"}`, "custom rules"},
	} {
		write(bad.text)
		hup("SIGHUP: guard policy not reloaded")
		if !strings.Contains(stderr.String(), bad.why) {
			t.Errorf("the log does not say why %s was refused (%q)", bad.text, bad.why)
		}
		if a := ask("2.00"); a.Decision != "review" || !hasRule(a, "review_above") {
			t.Fatalf("after the refused %s, the running policy (reviewAbove 1) must still answer: %+v", bad.text, a)
		}
	}
	// The refused files were never recorded: the store still holds the
	// policy in force, and a refused file is not accepted as the server's.
	if _, errOut, code := runCLI(t, "review", "list", "--dir", root, "--guard-config", cfg); code != exitUsage || !strings.Contains(errOut, "is not the policy the server runs with") {
		t.Fatalf("review list with a refused file: %d %s", code, errOut)
	}
	// status says so: the policy in force, and the reload the server
	// refused last, with why (exit 3, a problem to act on).
	out, errOut, code := runCLI(t, "status", "--dir", root)
	if code != 3 || !strings.Contains(out, "RELOAD REFUSED at ") || !strings.Contains(out, cfg+": custom rules") ||
		!strings.Contains(out, "the policy above stays in force") || !strings.Contains(out, "the server refused to reload "+cfg) {
		t.Fatalf("status after a refused reload: exit %d\n%s%s", code, out, errOut)
	}
	st := statusOf(t, 3, "--dir", root)
	if !strings.Contains(st.Policy.Source, cfg) {
		t.Errorf("status --json policy after a refused reload: %+v", st.Policy)
	}
	// A reload that is put in force clears it.
	write(`{"reviewAbove": "1", "perCounterpartyLimit": {"amount": "100"}, "reviewTtlMinutes": 45}`)
	hup("SIGHUP: guard policy reloaded")
	if out, errOut, code := runCLI(t, "status", "--dir", root); code != 0 || strings.Contains(out, "REFUSED") {
		t.Fatalf("status after a good reload: exit %d\n%s%s", code, out, errOut)
	}
}
