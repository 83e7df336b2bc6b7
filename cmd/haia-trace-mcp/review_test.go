package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/haia-trace-mcp/haia-trace-mcp/app"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard"
	"github.com/haia-trace-mcp/haia-trace-mcp/guard/engine"
	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/filestore"
)

// reviewRoot makes a Trace root with n pending reviews and returns it with their ids.
func reviewRoot(t *testing.T, n int) (string, []string) {
	t.Helper()
	dir := t.TempDir()
	root, err := confined.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	// As a server does when it starts: record the policy it runs with.
	if err := filestore.New(root).Locked(context.Background(), time.Second, func(w reviewlog.Writer) error {
		return w.SetPolicy(context.Background(), app.PolicyRecord(guard.DefaultConfig(), "", time.Now()))
	}); err != nil {
		t.Fatal(err)
	}
	l := reviewlog.OpenStore(filestore.New(root), reviewlog.Options{})
	terms := serverTerms(t, "")
	var ids []string
	for i := range n {
		q := guard.Question{Counterparty: "0xb0b0000000000000000000000000000000000002", Amount: strings.Repeat("1", i+1), Asset: guard.USDCBase, Template: "x402-buyer"}
		out, err := engine.Ask(context.Background(), l, engine.AskRequest{Caller: "agent-1", Question: q, Decision: guard.Review,
			ParamsHash: "hmac-sha256:" + strings.Repeat("ab", 32), Reasons: []guard.Reason{
				{Rule: "open_partial", Detail: "1 partial operation\nwith a line break", Evidence: []guard.Ref{{RunID: "run-1", OperationID: "op-2"}}},
				{Rule: "history", Detail: "read 3 operations"},
			}}, terms)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, out.Review.ID)
	}
	return dir, ids
}

func reviewCmd(args ...string) (string, string, int) {
	var out, errb bytes.Buffer
	code := run(context.Background(), append([]string{"review"}, args...), strings.NewReader(""), &out, &errb)
	return out.String(), errb.String(), code
}

func TestReviewCLI(t *testing.T) {
	dir, ids := reviewRoot(t, 2)

	out, errOut, code := reviewCmd("list", "--dir", dir)
	if code != 0 || !strings.Contains(out, ids[0]) || !strings.Contains(out, ids[1]) || !strings.Contains(out, "open_partial") || strings.Contains(out, "history") {
		t.Fatalf("list: %d %q %q", code, out, errOut)
	}

	out, _, code = reviewCmd("show", ids[0], "--dir", dir)
	if code != 0 || !strings.Contains(out, "run run-1, operation op-2") || !strings.Contains(out, `1 partial operation\nwith a line break`) {
		t.Errorf("show: %d %q", code, out)
	}

	out, errOut, code = reviewCmd("reject", ids[0], "--note", "seller never settled", "--by", "alice", "--dir", dir)
	if code != 0 || !strings.Contains(out, ids[0]+" rejected by alice") {
		t.Fatalf("reject: %d %q %q", code, out, errOut)
	}
	_, errOut, code = reviewCmd("approve", "--dir", dir, ids[0])
	if code != reviewExitDecided || !strings.Contains(errOut, "already decided") {
		t.Errorf("second decision: %d %q", code, errOut)
	}

	out, _, code = reviewCmd("approve", ids[1], "--dir", dir, "--json")
	var r reviewlog.Review
	if code != 0 || json.Unmarshal([]byte(out), &r) != nil || r.Status != reviewlog.Approved || r.DecidedBy == "" {
		t.Errorf("approve --json with the OS user: %d %q", code, out)
	}

	out, _, code = reviewCmd("list", "--dir", dir)
	if code != 0 || strings.TrimSpace(out) != "no pending reviews" {
		t.Errorf("list after deciding: %d %q", code, out)
	}
	out, _, code = reviewCmd("list", "--dir", dir, "--all", "--json")
	var listed struct{ Reviews []reviewlog.Review }
	if code != 0 || json.Unmarshal([]byte(out), &listed) != nil || len(listed.Reviews) != 2 ||
		listed.Reviews[0].Status != reviewlog.Rejected || listed.Reviews[0].Note != "seller never settled" || listed.Reviews[0].DecidedBy != "alice" {
		t.Errorf("list --all --json: %d %q", code, out)
	}
}

func TestReviewCLIExitCodes(t *testing.T) {
	dir, ids := reviewRoot(t, 1)
	tests := []struct {
		name   string
		args   []string
		code   int
		errHas string
	}{
		{"no subcommand", nil, exitUsage, "name a subcommand"},
		{"unknown subcommand", []string{"delete"}, exitUsage, `unknown subcommand "delete"`},
		{"missing id", []string{"approve", "--dir", dir}, exitUsage, "want one review id"},
		{"extra argument", []string{"list", "x", "--dir", dir}, exitUsage, `unexpected argument "x"`},
		{"unknown flag", []string{"list", "--color", "--dir", dir}, exitUsage, "flag provided but not defined"},
		{"bad id", []string{"approve", "not-an-id", "--dir", dir}, exitUsage, "not a review id"},
		{"unknown id", []string{"approve", "1b4e28ba-2fa1-4d2c-883f-0016d3cca427", "--dir", dir}, reviewExitUnknown, "unknown review"},
		{"unknown id (show)", []string{"show", "1b4e28ba-2fa1-4d2c-883f-0016d3cca427", "--dir", dir}, reviewExitUnknown, "unknown review"},
		{"--by another reviewer than the key's", []string{"approve", ids[0], "--by", "a\x1bb", "--dir", dir}, reviewExitUntrusted, `belongs to reviewer alice`},
		{"missing root", []string{"list", "--dir", filepath.Join(dir, "absent")}, exitUsage, "no Trace root at"},
		{"not a Trace root", []string{"list", "--dir", t.TempDir()}, exitUsage, "is not a Trace root"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, errOut, code := reviewCmd(tc.args...)
			if code != tc.code || !strings.Contains(errOut, tc.errHas) {
				t.Errorf("exit %d %q, want %d mentioning %q", code, errOut, tc.code, tc.errHas)
			}
		})
	}

	// A lock held by another process → exit 5.
	f, err := os.OpenFile(filepath.Join(dir, reviewlog.DirName, reviewlog.LockName), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := reviewCmd("approve", ids[0], "--by", "alice", "--lock-wait", "100ms", "--dir", dir)
	if code != reviewExitLock || !strings.Contains(errOut, "lock not obtained") {
		t.Errorf("held lock: %d %q", code, errOut)
	}
	unix.Flock(int(f.Fd()), unix.LOCK_UN)
}

// Several CLI processes decide the same review at once: exactly one
// succeeds, the others exit 4.
func TestReviewCLIProcessesDecideOnce(t *testing.T) {
	dir, ids := reviewRoot(t, 1)
	const procs = 5
	codes := make([]int, procs)
	var wg sync.WaitGroup
	for i := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			verb := "approve"
			if i%2 == 1 {
				verb = "reject"
			}
			_, _, codes[i] = runCLI(t, "review", verb, ids[0], "--dir", dir)
		}()
	}
	wg.Wait()
	ok, decided := 0, 0
	for _, c := range codes {
		switch c {
		case 0:
			ok++
		case reviewExitDecided:
			decided++
		}
	}
	if ok != 1 || decided != procs-1 {
		t.Errorf("exit codes %v", codes)
	}
}

// audit tells what a crash leaves (exit 4, INCOMPLETE) from what only
// tampering makes (exit 2, TAMPERED).
func TestAuditTellsCrashFromTampering(t *testing.T) {
	dir, ids := reviewRoot(t, 1)
	if out, errOut, code := runCLI(t, "audit", "--dir", dir); code != 0 || !strings.HasPrefix(out, "CONSISTENT") {
		t.Fatalf("audit of a clean root: %d %s %s", code, out, errOut)
	}
	// A writer killed after it committed an opening's receipts and before
	// it wrote the log line leaves exactly this.
	root, err := confined.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	const lost = "0b7e3f2a-9c4d-4e5f-a6b7-c8d9e0f1a2b3"
	terms := serverTerms(t, "")
	err = reviewlog.OpenStore(filestore.New(root), reviewlog.Options{}).WithLock(context.Background(), func(tx reviewlog.Tx) error {
		tr := reviewlog.Terms{ReviewID: lost, Caller: "agent-1", Counterparty: "0xb0b0000000000000000000000000000000000002", Amount: "9",
			Asset: guard.USDCBase, Template: "x402-buyer", Rules: []string{"open_partial"}, ParamsHash: "hmac-sha256:" + strings.Repeat("ab", 32)}
		return terms(tx, reviewlog.AskOutcome{Kind: reviewlog.AskOpened, Review: reviewlog.Review{ID: lost, Terms: &tr}})
	})
	if err != nil {
		t.Fatal(err)
	}
	out, errOut, code := runCLI(t, "audit", "--dir", dir)
	if code != auditExitIncomplete || !strings.Contains(out, "INCOMPLETE receipts record review:"+lost) || !strings.Contains(out, "no sign of tampering") {
		t.Fatalf("audit after a crash's leftovers: %d %s %s", code, out, errOut)
	}
	path := filepath.Join(dir, reviewlog.DirName, reviewlog.FileName)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, bytes.Replace(data, []byte(`"amount":"1"`), []byte(`"amount":"7"`), 2), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = runCLI(t, "audit", "--dir", dir)
	if code != 2 || !strings.Contains(out, "review "+ids[0]+": TAMPERED") || !strings.Contains(out, "INCOMPLETE receipts record review:"+lost) {
		t.Fatalf("audit after tampering: %d %s %s", code, out, errOut)
	}
}

// What the reviewer reads comes from the terms the server signed: caller,
// resource column, the asset's symbol; an edited line reads TAMPERED and
// cannot be decided (exit 8, nothing written); --terms binds the decision
// to the terms shown.
func TestReviewCLITampered(t *testing.T) {
	dir, ids := reviewRoot(t, 1)
	out, _, code := reviewCmd("list", "--dir", dir)
	if code != 0 || !strings.Contains(out, "CALLER") || !strings.Contains(out, "RESOURCE") || !strings.Contains(out, "agent-1") || !strings.Contains(out, "USDC (eip155:8453/") {
		t.Fatalf("list: %d %s", code, out)
	}
	out, _, code = reviewCmd("show", ids[0], "--dir", dir)
	hash := regexp.MustCompile(`terms        (sha256:[0-9a-f]{64}), signed by the server in receipt rcpt_`).FindStringSubmatch(out)
	if code != 0 || hash == nil || !strings.Contains(out, "asked by     agent-1") || !strings.Contains(out, "pay 1.00 USDC") {
		t.Fatalf("show: %d %s", code, out)
	}
	path := filepath.Join(dir, reviewlog.DirName, reviewlog.FileName)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	edited := bytes.Replace(data, []byte(`"caller":"agent-1"`), []byte(`"caller":"agent-2"`), 2)
	if err := os.WriteFile(path, edited, 0o600); err != nil {
		t.Fatal(err)
	}
	out, _, _ = reviewCmd("show", ids[0], "--dir", dir)
	if !strings.Contains(out, "TAMPERED") || strings.Contains(out, "decide with") {
		t.Fatalf("show of the edited line: %s", out)
	}
	if out, _, _ := reviewCmd("list", "--dir", dir); !strings.Contains(out, "pending TAMPERED") {
		t.Fatalf("list of the edited line: %s", out)
	}
	if _, errOut, code := reviewCmd("approve", ids[0], "--by", "alice", "--dir", dir); code != reviewExitTampered || !strings.Contains(errOut, "nothing was written") {
		t.Fatalf("approve of the edited line: %d %s", code, errOut)
	}
	if now, _ := os.ReadFile(path); !bytes.Equal(now, edited) {
		t.Fatal("a refused decision wrote to the log")
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := reviewCmd("reject", ids[0], "--terms", "sha256:"+strings.Repeat("1", 64), "--dir", dir); code != reviewExitTampered || !strings.Contains(errOut, "not the terms you were shown") {
		t.Fatalf("reject with other terms: %d %s", code, errOut)
	}
	if out, errOut, code := reviewCmd("reject", ids[0], "--terms", hash[1], "--dir", dir); code != 0 || !strings.Contains(out, "terms "+hash[1]) {
		t.Fatalf("reject with the terms shown: %d %s %s", code, out, errOut)
	}
}
