package pgstore

import (
	"encoding/json"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// The reviews a decision reads with its locks (reviewsQuery) are read by
// a statement PostgreSQL keeps one plan of: after the few runs it plans
// with the values, the plan made without them (generic) is the one kept
// (0.4–0.7 ms of the database's CPU a decision while it planned anew), and
// that plan reads reviews and review_lines by their indexes, made while
// the tables are small and still once they have grown. Every shape reads
// the rows it names and no other.
func TestDecisionReviewsKeepOnePlan(t *testing.T) {
	ctx, conn, exec := planConn(t)
	exec("ALTER TABLE reviews SET (autovacuum_enabled = false)")
	exec("ALTER TABLE review_lines SET (autovacuum_enabled = false)")
	// The rows alone (the lines they index are not what is read here).
	exec("ALTER TABLE reviews DISABLE TRIGGER USER")
	exec("ALTER TABLE review_lines DISABLE TRIGGER USER")
	exec("INSERT INTO guard_streams (name, size, generation) VALUES ($1, 0, 'g')", logStream)
	now := time.Now().UTC()
	// The decision's shape, run as the store runs it (pgx prepares it
	// once on the connection) on the tables as a new store has them (the
	// benchmarks' and a fresh deployment's): the plan kept is the generic
	// one.
	since := now.Add(-time.Hour)
	q := reviewlog.ReviewQuery{QuestionKey: "q7", Caller: "c3", Since: since}
	sql, args := reviewsQuery(q)
	for range 8 {
		rows, err := conn.Query(ctx, sql, args...)
		if err != nil {
			t.Fatal(err)
		}
		rows.Close()
	}
	var generic, custom int64
	if err := conn.QueryRow(ctx, "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement = $1", sql).Scan(&generic, &custom); err != nil {
		t.Fatalf("the decision's reviews statement is not prepared on the connection: %v", err)
	}
	if generic == 0 {
		t.Errorf("after 8 runs the decision's reviews statement was planned anew every time (%d custom plans, no generic one)", custom)
	}

	// r<g>: question q<g mod 50>, caller c<g mod 7>; every third decided.
	grow := func(from, to int) {
		exec(`INSERT INTO reviews (review_id, caller, question_key, status, created_at, decided_at, opened_stream, opened_off)
			SELECT 'r' || g, 'c' || (g % 7), 'q' || (g % 50), CASE WHEN g % 3 = 0 THEN 'approved' ELSE 'pending' END, $3::timestamptz,
				CASE WHEN g % 3 = 0 THEN $3::timestamptz END, $4, g::bigint * 10
			FROM generate_series($1::int, $2::int) g`, from, to, now, logStream)
		exec(`INSERT INTO review_lines (stream, off, line, kind, review_id)
			SELECT $3, g::bigint * 10, convert_to('{"id":"r' || g || '"}', 'UTF8'), 'opened', 'r' || g FROM generate_series($1::int, $2::int) g`, from, to, logStream)
	}
	grow(0, 899)
	exec("ANALYZE reviews")
	exec("ANALYZE review_lines")

	// What each shape reads.
	for _, c := range []struct {
		name string
		q    reviewlog.ReviewQuery
		want func(g int) bool
	}{
		{"a question and its caller's undecided", reviewlog.ReviewQuery{QuestionKey: "q7", Caller: "c3", Since: since},
			func(g int) bool { return g%50 == 7 || (g%7 == 3 && g%3 != 0) }},
		{"a question and its caller's undecided, none since", reviewlog.ReviewQuery{QuestionKey: "q7", Caller: "c3", Since: now.Add(time.Hour)},
			func(g int) bool { return g%50 == 7 }},
		{"a question", reviewlog.ReviewQuery{QuestionKey: "q7"}, func(g int) bool { return g%50 == 7 }},
		{"ids", reviewlog.ReviewQuery{IDs: []string{"r5", "r600", "nope"}}, func(g int) bool { return g == 5 || g == 600 }},
		{"a question and ids", reviewlog.ReviewQuery{QuestionKey: "q7", IDs: []string{"r5"}}, func(g int) bool { return g%50 == 7 || g == 5 }},
		{"nothing", reviewlog.ReviewQuery{}, func(int) bool { return false }},
	} {
		sql, args := reviewsQuery(c.q)
		rows, err := conn.Query(ctx, sql, args...)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got, err := collectReviews(rows)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var ids, want []string
		for _, r := range got {
			ids = append(ids, r.Row.ID)
			if len(r.Lines) != 1 {
				t.Errorf("%s: %s has %d lines, want 1", c.name, r.Row.ID, len(r.Lines))
			}
		}
		for g := range 900 {
			if c.want(g) {
				want = append(want, "r"+itoa(g))
			}
		}
		slices.Sort(ids)
		slices.Sort(want)
		if !slices.Equal(ids, want) {
			t.Errorf("%s: read %d reviews %v, want %d %v", c.name, len(ids), ids, len(want), want)
		}
	}

	// And the generic plan reads by index, made small and read grown.
	exec("SET plan_cache_mode = force_generic_plan")
	exec("PREPARE decision_reviews(text, text, timestamptz) AS " + sql)
	check := func(when string) {
		t.Helper()
		var plan []byte
		if err := conn.QueryRow(ctx, "EXPLAIN (FORMAT JSON) EXECUTE decision_reviews('q7', 'c3', '"+since.Format(time.RFC3339Nano)+"')").Scan(&plan); err != nil {
			t.Fatalf("explain: %v", err)
		}
		var doc any
		if err := json.Unmarshal(plan, &doc); err != nil {
			t.Fatal(err)
		}
		for _, table := range []string{"reviews", "review_lines"} {
			if seqScanOf(doc, table) {
				t.Errorf("%s: the generic plan scans %s whole:\n%s", when, table, plan)
			}
		}
	}
	check("900 reviews")
	grow(900, 9999)
	check("grown to 10,000 reviews")
}

func itoa(n int) string { return strconv.Itoa(n) }
