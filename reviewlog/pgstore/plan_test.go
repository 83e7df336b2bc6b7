package pgstore

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/pgtest"
)

// The statements every decision runs to catch up — the spend ledger and the
// chains' new receipts — read by primary key in the plan PostgreSQL
// caches for them (a generic plan, made without the values), even when
// that plan was made from the statistics of a small table that has grown
// since: a sequential scan there costs every decision the whole table.
// A plan, not a timing: what the planner chose is read from EXPLAIN.
func TestCatchUpReadsByIndexInTheCachedPlan(t *testing.T) {
	ctx, conn, exec := planConn(t)
	seg := receiptsPrefix + "s1"
	exec("ALTER TABLE ledger_entries SET (autovacuum_enabled = false)")
	exec("ALTER TABLE receipts SET (autovacuum_enabled = false)")
	// The receipts alone (their rows are not what is read here).
	exec("ALTER TABLE receipts DISABLE TRIGGER USER")
	exec("INSERT INTO guard_streams (name, size, generation) VALUES ($1, 0, 'g')", seg)
	grow := func(from, to int) {
		exec("INSERT INTO ledger_entries (lane, seq, line) SELECT 0, g, convert_to(repeat('x', 480), 'UTF8') FROM generate_series($1::int, $2::int) g", from, to)
		exec("INSERT INTO receipts (stream, off, seq, action_id, verdict, line) SELECT $3, g::bigint * 100, g, 'a', 'ALLOWED', convert_to(repeat('x', 480), 'UTF8') FROM generate_series($1::int, $2::int) g", from, to, seg)
	}
	// The plan made and cached while the tables are small (what a
	// server's connection caches early in a busy day), then read again
	// once they have grown tenfold.
	grow(0, 899)
	exec("ANALYZE ledger_entries")
	exec("ANALYZE receipts")
	exec("SET plan_cache_mode = force_generic_plan")
	exec("PREPARE ledger_since(int[], bigint[], bool) AS " + ledgerSinceSQL)
	exec("PREPARE segments_since(text[], bigint[], text[]) AS " + segmentsSinceSQL)
	check := func(when string) {
		t.Helper()
		for _, c := range []struct{ name, execute, table string }{
			{"the spend ledger", "EXECUTE ledger_since('{0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15}', '{9999,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0}', true)", "ledger_entries"},
			{"the chains' new receipts", "EXECUTE segments_since('{" + seg + "}', '{999900}', '{g}')", "receipts"},
		} {
			var plan []byte
			if err := conn.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+c.execute).Scan(&plan); err != nil {
				t.Fatalf("%s: explain: %v", c.name, err)
			}
			var doc any
			if err := json.Unmarshal(plan, &doc); err != nil {
				t.Fatal(err)
			}
			if seqScanOf(doc, c.table) {
				t.Errorf("%s, %s: the generic plan scans %s whole:\n%s", c.name, when, c.table, plan)
			}
		}
	}
	check("900 rows")
	grow(900, 9999)
	check("grown to 10,000 rows")
}

// seqScanOf says whether a JSON plan holds a sequential scan of table.
func seqScanOf(node any, table string) bool {
	switch n := node.(type) {
	case []any:
		for _, v := range n {
			if seqScanOf(v, table) {
				return true
			}
		}
	case map[string]any:
		if n["Node Type"] == "Seq Scan" && n["Relation Name"] == table {
			return true
		}
		for _, v := range n {
			if seqScanOf(v, table) {
				return true
			}
		}
	}
	return false
}

// planConn is a connection to a fresh migrated database for reading the
// planner's choices, and exec runs a statement on it or fails the test.
func planConn(t *testing.T) (context.Context, *pgx.Conn, func(q string, args ...any)) {
	t.Helper()
	dsn := pgtest.Database(t, pgtest.DSN(t))
	if _, _, err := Migrate(t.Context(), dsn, nil); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	return ctx, conn, func(q string, args ...any) {
		t.Helper()
		if _, err := conn.Exec(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}
