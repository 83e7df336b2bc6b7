package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/pgtest"
)

// logEditor edits the review log behind the guard's back, in place and
// keeping every length, as a writer of the volume or of the database can
// (neither holds a key).
type logEditor func(t *testing.T, reviewID, old, new string)

func fileLogEditor(root string) logEditor {
	path := filepath.Join(root, "guard", "decisions.ndjson")
	return func(t *testing.T, reviewID, old, new string) {
		t.Helper()
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var off int64
		for _, line := range bytes.SplitAfter(data, []byte("\n")) {
			if bytes.Contains(line, []byte(`"type":"opened","review_id":"`+reviewID)) {
				f, err := os.OpenFile(path, os.O_WRONLY, 0)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				if _, err := f.WriteAt(bytes.ReplaceAll(line, []byte(old), []byte(new)), off); err != nil {
					t.Fatal(err)
				}
				return
			}
			off += int64(len(line))
		}
		t.Fatalf("the log opens no review %s", reviewID)
	}
}

func sqlLogEditor(dsn string) logEditor {
	return func(t *testing.T, reviewID, old, new string) {
		t.Helper()
		conn, err := pgx.Connect(t.Context(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(context.Background())
		tag, err := conn.Exec(t.Context(), `UPDATE review_lines SET line = convert_to(replace(convert_from(line, 'UTF8'), $2, $3), 'UTF8')
			WHERE stream = 'decisions.ndjson' AND kind = 'opened' AND review_id = $1`, reviewID, old, new)
		if err != nil || tag.RowsAffected() != 1 {
			t.Fatalf("edit the opened row of %s: %v (%d rows)", reviewID, err, tag.RowsAffected())
		}
	}
}

// The three attacks of issue 22 §1 on the review log, with the real
// server and the real CLI, on the file store and on PostgreSQL: an
// approval edited to another amount is no approval of it; a line edited
// before review show is shown TAMPERED and cannot be decided (and,
// restored, is decided on the terms show printed); a rejection survives
// an edited caller. audit names every edit TAMPERED (exit 2).
func TestReviewTermsAttacksEndToEnd(t *testing.T) {
	t.Run("file", func(t *testing.T) {
		root := loopRoot(t)
		cs := mcpSession(t, nil, "--dir", root, "--key-file", filepath.Join(t.TempDir(), "signing.pem"), "--agent-id", "loop-agent")
		termsAttacks(t, cs, root, nil, fileLogEditor(root))
	})
	t.Run("postgres", func(t *testing.T) {
		pgtest.DSN(t)
		dsn := e2eDatabase(t)
		root := loopRoot(t)
		cs := mcpSession(t, nil, "--dir", root, "--key-file", filepath.Join(t.TempDir(), "signing.pem"), "--agent-id", "loop-agent", "--store", dsn)
		termsAttacks(t, cs, root, []string{"--store", dsn}, sqlLogEditor(dsn))
	})
}

func termsAttacks(t *testing.T, cs *mcp.ClientSession, root string, store []string, edit logEditor) {
	cli := func(args ...string) (string, string, int) {
		t.Helper()
		return runCLI(t, append(append(args, "--dir", root), store...)...)
	}
	ask := func(amount string) checkAnswer {
		t.Helper()
		var a checkAnswer
		decodeStructured(t, callTool(t, cs, "check_before_pay", map[string]any{"counterparty": sellerB, "amount": amount}), &a)
		return a
	}
	status := func(id string) map[string]any {
		t.Helper()
		var st map[string]any
		decodeStructured(t, callTool(t, cs, "get_review_status", map[string]any{"review_id": id}), &st)
		return st
	}

	// 1. Edit after approval: the approved 0.1 becomes 0.9 in the log.
	r1 := ask("0.1")
	if r1.Decision != "review" {
		t.Fatalf("first: %+v", r1)
	}
	if out, errOut, code := cli("review", "approve", r1.ReviewID, "--note", "0.1 is fine"); code != 0 {
		t.Fatalf("approve: %d %s %s", code, out, errOut)
	}
	edit(t, r1.ReviewID, `"0.1"`, `"0.9"`)
	edit(t, r1.ReviewID, `"100000"`, `"900000"`)
	if a := ask("0.9"); a.Decision == "allow" || hasRule(a, "human_approved") || a.ReviewID == r1.ReviewID {
		t.Fatalf("0.9 after the approval of 0.1 was edited to it: %+v, want a new review", a)
	}
	if st := status(r1.ReviewID); st["tampered"] != true || st["status"] == "approved" {
		t.Fatalf("get_review_status of the edited approval: %v, want tampered and not approved", st)
	}

	// 2. Bait and switch before review show: 0.2 shown as 0.1.
	r2 := ask("0.2")
	edit(t, r2.ReviewID, `"0.2"`, `"0.1"`)
	edit(t, r2.ReviewID, `"200000"`, `"100000"`)
	out, errOut, code := cli("review", "show", r2.ReviewID)
	if code != 0 || !strings.Contains(out, "TAMPERED") || strings.Contains(out, "decide with") {
		t.Fatalf("review show of the switched line: %d %s %s", code, out, errOut)
	}
	list, _, _ := cli("review", "list")
	if !strings.Contains(list, "pending TAMPERED") || !strings.Contains(list, "CALLER") || !strings.Contains(list, "loop-agent") || !strings.Contains(list, "USDC") {
		t.Fatalf("review list: %s", list)
	}
	before, _, _ := cli("audit")
	if _, errOut, code := cli("review", "approve", r2.ReviewID); code != reviewExitTampered || !strings.Contains(errOut, "nothing was written") {
		t.Fatalf("approve of the switched line: %d %s", code, errOut)
	}
	if after, _, _ := cli("audit"); after != before {
		t.Fatalf("a refused approval changed the store:\n%s\n%s", before, after)
	}
	edit(t, r2.ReviewID, `"0.1"`, `"0.2"`)
	edit(t, r2.ReviewID, `"100000"`, `"200000"`)
	out, errOut, code = cli("review", "show", r2.ReviewID)
	hash := regexp.MustCompile(`--terms (sha256:[0-9a-f]{64})`).FindStringSubmatch(out)
	if code != 0 || hash == nil || strings.Contains(out, "TAMPERED") || !strings.Contains(out, "pay 0.20 USDC") {
		t.Fatalf("review show of the restored line: %d %s %s", code, out, errOut)
	}
	if _, errOut, code := cli("review", "approve", r2.ReviewID, "--terms", "sha256:"+strings.Repeat("0", 64)); code != reviewExitTampered {
		t.Fatalf("approve with other terms than shown: %d %s", code, errOut)
	}
	if out, errOut, code := cli("review", "approve", r2.ReviewID, "--terms", hash[1]); code != 0 || !strings.Contains(out, "signed: pay 0.20 USDC") {
		t.Fatalf("approve with the terms shown: %d %s %s", code, out, errOut)
	}
	if a := ask("0.2"); a.Decision != "allow" || !hasRule(a, "human_approved") {
		t.Fatalf("the approved question: %+v", a)
	}

	// 3. A rejection lifted by changing the caller of its line.
	r3 := ask("0.3")
	if out, errOut, code := cli("review", "reject", r3.ReviewID, "--note", "no"); code != 0 {
		t.Fatalf("reject: %d %s %s", code, out, errOut)
	}
	edit(t, r3.ReviewID, `"loop-agent"`, `"loop-agenX"`)
	if a := ask("0.3"); a.Decision != "block" || !hasRule(a, "human_rejected") || a.ReviewID != r3.ReviewID {
		t.Fatalf("the rejected question after its caller was edited: %+v", a)
	}

	out, errOut, code = cli("audit")
	if code != 2 || !strings.HasPrefix(out, "review ") || !strings.Contains(out, "INCONSISTENT") {
		t.Fatalf("audit: %d %s %s", code, out, errOut)
	}
	for _, id := range []string{r1.ReviewID, r3.ReviewID} {
		if !strings.Contains(out, "review "+id+": TAMPERED") {
			t.Errorf("audit does not name %s TAMPERED:\n%s", id, out)
		}
	}

	// A rejected review that was archived: the answer that names it and
	// get_review_status of that id still agree.
	r4 := ask("0.4")
	if out, errOut, code := cli("review", "reject", r4.ReviewID, "--note", "never"); code != 0 {
		t.Fatalf("reject: %d %s %s", code, out, errOut)
	}
	time.Sleep(10 * time.Millisecond)
	if out, errOut, code := cli("review", "archive", "--older-than", "1ms"); code != 0 || !strings.Contains(out, "archived") {
		t.Fatalf("review archive: %d %s %s", code, out, errOut)
	}
	if list, _, _ := cli("review", "list", "--all"); strings.Contains(list, r4.ReviewID) {
		t.Fatalf("the archived review is still in the log:\n%s", list)
	}
	held := ask("0.4")
	if held.Decision != "block" || !hasRule(held, "human_rejected") || held.ReviewID != r4.ReviewID {
		t.Fatalf("the archived rejection: %+v", held)
	}
	if st := status(held.ReviewID); st["status"] != "rejected" || st["note"] != "never" || st["tampered"] == true {
		t.Fatalf("get_review_status of the archived review the answer names: %v", st)
	}
	if out, errOut, code := cli("review", "show", r4.ReviewID); code != 0 || !strings.Contains(out, "rejected") {
		t.Fatalf("review show of the archived review: %d %s %s", code, out, errOut)
	}
}
