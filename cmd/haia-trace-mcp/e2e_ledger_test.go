package main

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/pgtest"
)

// another starts one more replica on the set's root, key and database: a
// process that has read nothing yet.
func (rs *replicaSet) another(t *testing.T) *mcp.ClientSession {
	t.Helper()
	p := startHTTPBinary(t, "--dir", rs.root, "--key-file", rs.key, "--store", rs.dsn, "--http-insecure-no-auth")
	cs, err := httpSession(t, p.resource, func() string { return "" })
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, p.logs())
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// The attack of the issue the spend ledger answers, played with real
// processes on PostgreSQL: the database role that owns the tables turns
// the triggers off and hides the first use of an approval — its
// review_uses row, the review row's use, its receipt row, its used line,
// and its ledger entry — while the signed receipts stay. A server that
// starts afterwards must not honour the approval again, and audit must
// say what was hidden (exit 2).
func TestHiddenApprovalUseEndToEnd(t *testing.T) {
	for _, hideEntry := range []bool{false, true} {
		name := "review traces hidden"
		if hideEntry {
			name = "review traces and the ledger entry hidden"
		}
		t.Run(name, func(t *testing.T) {
			db := e2eDatabase(t)
			rs := startReplicas(t, db, 1)
			var first checkAnswer
			decodeStructured(t, callTool(t, rs.sessions[0], "check_before_pay", map[string]any{"counterparty": sellerB, "amount": "0.10"}), &first)
			if first.Decision != "review" || first.ReviewID == "" {
				t.Fatalf("first: %+v", first)
			}
			if out, errOut, code := runCLI(t, "review", "approve", first.ReviewID, "--dir", rs.root, "--store", db); code != 0 {
				t.Fatalf("approve: %d %s %s", code, out, errOut)
			}
			var use checkAnswer
			decodeStructured(t, callTool(t, rs.sessions[0], "check_before_pay", map[string]any{"counterparty": sellerB, "amount": "0.10"}), &use)
			if use.Decision != "allow" || !hasRule(use, "human_approved") {
				t.Fatalf("use: %+v", use)
			}
			if out, _, code := runCLI(t, "audit", "--dir", rs.root, "--store", db, "--key-file", rs.key); code != 0 {
				t.Fatalf("audit before: %d %s", code, out)
			}
			// The table owner, triggers off.
			ctx := context.Background()
			conn, err := pgx.Connect(ctx, db)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			stmts := []string{
				"ALTER TABLE receipt_rows DISABLE TRIGGER USER",
				"ALTER TABLE review_lines DISABLE TRIGGER USER",
				"DELETE FROM review_uses",
				"UPDATE reviews SET used_at = NULL, used_stream = NULL, used_off = NULL",
				"DELETE FROM receipt_rows WHERE action_id = 'review:" + first.ReviewID + "' AND verdict = 'ALLOWED'",
				// The used line is the log's last: the log is cut back to
				// before it, as if it had never been written.
				"UPDATE guard_streams SET size = size - (SELECT length(line) FROM review_lines WHERE kind = 'used') WHERE name = 'decisions.ndjson'",
				"DELETE FROM review_lines WHERE kind = 'used'",
			}
			if hideEntry {
				stmts = append(stmts, "ALTER TABLE ledger_entries DISABLE TRIGGER USER",
					"DELETE FROM ledger_entries WHERE position('\"review\":\""+first.ReviewID+"\"' in convert_from(line, 'UTF8')) > 0")
			}
			for _, q := range stmts {
				if _, err := conn.Exec(ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			// A server that starts now.
			fresh := rs.another(t)
			var again checkAnswer
			decodeStructured(t, callTool(t, fresh, "check_before_pay", map[string]any{"counterparty": sellerB, "amount": "0.10"}), &again)
			if again.Decision == "allow" {
				t.Fatalf("the approval was honoured a second time after its use was hidden: %+v", again)
			}
			if hideEntry && !hasRule(again, "reservation_unverified") {
				t.Fatalf("a hidden ledger entry, answered without naming it: %+v", again)
			}
			// With the ledger entry hidden, only tampering explains it (exit
			// 2); with the review log's traces alone, a receipt of the use
			// without its line is also what a crash leaves on files (exit 4).
			out, _, code := runCLI(t, "audit", "--dir", rs.root, "--store", db, "--key-file", rs.key)
			if hideEntry && code != 2 || !hideEntry && code != 2 && code != auditExitIncomplete {
				t.Fatalf("audit after the owner hid the use: %d %s", code, out)
			}
			if hideEntry && !strings.Contains(out, "LEDGER") {
				t.Fatalf("audit does not name the ledger: %s", out)
			}
		})
	}
}

// The role the server runs as need own nothing: `store migrate --grant`,
// run as the tables' owner, gives it what a server needs, and the whole
// path — an answer, a review approved by the CLI, its use, audit — works
// as that role, while what the table owner could do to the records is
// refused to it. A server running as the owner says so at start.
func TestRuntimeRoleOwnsNothing(t *testing.T) {
	db := pgtest.Database(t, pgtest.DSN(t))
	runtime, role := pgtest.AsRuntime(t, db)
	owner, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ grant, want string }{
		{"haia_no_such_role", "no such role"},
		{owner.User.Username(), "the role this migration runs as"},
	} {
		if out, errOut, code := runCLI(t, "store", "migrate", "--store", db, "--grant", c.grant); code != 1 || !strings.Contains(errOut, c.want) {
			t.Fatalf("store migrate --grant %s: %d %s %s, want exit 1 naming %q", c.grant, code, out, errOut, c.want)
		}
	}
	if out, errOut, code := runCLI(t, "store", "migrate", "--store", db, "--grant", role); code != 0 || !strings.Contains(out, "granted "+role) {
		t.Fatalf("store migrate --grant %s: %d %s %s", role, code, out, errOut)
	}
	rs := startReplicas(t, runtime, 1)
	if logs := rs.procs[0].logs(); strings.Contains(logs, "owns the guard's tables") {
		t.Fatalf("a server that owns nothing warned that it owns the tables:\n%s", logs)
	}
	var first checkAnswer
	decodeStructured(t, callTool(t, rs.sessions[0], "check_before_pay", map[string]any{"counterparty": sellerB, "amount": "0.10"}), &first)
	if first.Decision != "review" || first.ReviewID == "" {
		t.Fatalf("first: %+v\n%s", first, rs.procs[0].logs())
	}
	if out, errOut, code := runCLI(t, "review", "approve", first.ReviewID, "--dir", rs.root, "--store", runtime); code != 0 {
		t.Fatalf("approve as the runtime role: %d %s %s", code, out, errOut)
	}
	var use checkAnswer
	decodeStructured(t, callTool(t, rs.sessions[0], "check_before_pay", map[string]any{"counterparty": sellerB, "amount": "0.10"}), &use)
	if use.Decision != "allow" || !hasRule(use, "human_approved") {
		t.Fatalf("use: %+v\n%s", use, rs.procs[0].logs())
	}
	if out, errOut, code := runCLI(t, "audit", "--dir", rs.root, "--store", runtime, "--key-file", rs.key); code != 0 {
		t.Fatalf("audit as the runtime role: %d %s %s", code, out, errOut)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, runtime)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, q := range []string{
		"ALTER TABLE ledger_entries DISABLE TRIGGER USER",
		"ALTER TABLE receipt_rows DISABLE TRIGGER USER",
		"DELETE FROM ledger_entries",
		"UPDATE ledger_entries SET line = line",
		"TRUNCATE ledger_entries",
		"UPDATE receipts SET line = line",
		"DELETE FROM receipts",
		"DELETE FROM review_uses",
		"DROP TABLE ledger_entries",
	} {
		if _, err := conn.Exec(ctx, q); err == nil || !strings.Contains(err.Error(), "permission denied") && !strings.Contains(err.Error(), "must be owner") {
			t.Errorf("as the runtime role, %s: %v, want refused for want of privilege", q, err)
		}
	}
	// The owner's server is told.
	owned := startReplicas(t, db, 1)
	if logs := owned.procs[0].logs(); !strings.Contains(logs, "owns the guard's tables") {
		t.Fatalf("a server running as the tables' owner did not say so:\n%s", logs)
	}
}
