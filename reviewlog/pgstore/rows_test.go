package pgstore_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/haia-trace-mcp/haia-trace-mcp/internal/confined"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/filestore"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/pgstore"
)

// reviewRow is one row of reviews as the tests read it.
type reviewRow struct {
	id, tenant, caller, questionKey, status string
	termsKey                                *string
	created                                 time.Time
	decided, used                           *time.Time
	openedStream                            string
	openedOff                               int64
	decidedStream, usedStream               *string
	decidedOff, usedOff                     *int64
}

func readRows(t *testing.T, conn *pgx.Conn) map[string]reviewRow {
	t.Helper()
	rows, err := conn.Query(t.Context(), `SELECT review_id, tenant, caller, question_key, terms_key, status, created_at, decided_at, used_at,
		opened_stream, opened_off, decided_stream, decided_off, used_stream, used_off FROM reviews`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]reviewRow{}
	for rows.Next() {
		var r reviewRow
		if err := rows.Scan(&r.id, &r.tenant, &r.caller, &r.questionKey, &r.termsKey, &r.status, &r.created, &r.decided, &r.used,
			&r.openedStream, &r.openedOff, &r.decidedStream, &r.decidedOff, &r.usedStream, &r.usedOff); err != nil {
			t.Fatal(err)
		}
		out[r.id] = r
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// logLine is one indexed line of review_lines.
type logLine struct {
	stream string
	off    int64
	head   reviewlog.LineHead
}

// readLines reads the lines the store indexed, in stream order (archives
// sort before the log, as they come before it).
func readLines(t *testing.T, conn *pgx.Conn) []logLine {
	t.Helper()
	rows, err := conn.Query(t.Context(), `SELECT stream, off, line FROM review_lines WHERE kind IS NOT NULL ORDER BY stream, off`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []logLine
	for rows.Next() {
		var l logLine
		var line []byte
		if err := rows.Scan(&l.stream, &l.off, &line); err != nil {
			t.Fatal(err)
		}
		h, ok := reviewlog.ParseLineHead(line)
		if !ok {
			t.Fatalf("%s at %d is indexed but the log does not read it", l.stream, l.off)
		}
		l.head = h
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// CheckRows holds the rows to the lines: each review opened in the log has
// one row, at its first opened line, with the keys the log's own parser
// gives; its first decision and first use are where the row says; at most
// one review of a question and terms is open.
func (d databaseWriter) CheckRows(t *testing.T) int {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), string(d))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	rows := readRows(t, conn)
	seen := map[string]bool{}
	decided := map[string]bool{}
	used := map[string]bool{}
	for _, l := range readLines(t, conn) {
		h := l.head
		r, ok := rows[h.ReviewID]
		switch {
		case h.Opens() && !seen[h.ReviewID]:
			seen[h.ReviewID] = true
			if !ok {
				t.Fatalf("review %s is opened at %s:%d but has no row", h.ReviewID, l.stream, l.off)
			}
			tk := ""
			if r.termsKey != nil {
				tk = *r.termsKey
			}
			if r.openedStream != l.stream || r.openedOff != l.off || r.questionKey != h.QuestionKey || tk != h.TermsKey ||
				r.caller != h.Caller || r.tenant != h.Tenant || !r.created.Equal(h.At) {
				t.Fatalf("review %s: row %+v disagrees with its opened line %+v at %s:%d", h.ReviewID, r, h, l.stream, l.off)
			}
		case h.Decides() && ok && !decided[h.ReviewID]:
			decided[h.ReviewID] = true
			if r.status != h.Status || r.decidedStream == nil || *r.decidedStream != l.stream || *r.decidedOff != l.off || !r.decided.Equal(h.At) {
				t.Fatalf("review %s: row %+v disagrees with its decided line %+v at %s:%d", h.ReviewID, r, h, l.stream, l.off)
			}
		case h.Uses() && ok && !used[h.ReviewID]:
			used[h.ReviewID] = true
			if r.usedStream == nil || *r.usedStream != l.stream || *r.usedOff != l.off || !r.used.Equal(h.At) {
				t.Fatalf("review %s: row %+v disagrees with its used line at %s:%d", h.ReviewID, r, l.stream, l.off)
			}
		}
	}
	open := 0
	keys := map[[2]string]string{}
	for id, r := range rows {
		if !seen[id] {
			t.Fatalf("row %+v: no line of the log opens it", r)
		}
		if decided[id] != (r.decided != nil) || used[id] != (r.used != nil) {
			t.Fatalf("row %+v: decided %v, used %v in the log", r, decided[id], used[id])
		}
		if r.status == "pending" {
			open++
			if r.termsKey != nil {
				k := [2]string{r.questionKey, *r.termsKey}
				if other, dup := keys[k]; dup {
					t.Fatalf("reviews %s and %s are both open on one question and terms", other, id)
				}
				keys[k] = id
			}
		}
	}
	return open
}

// ForgeRows marks every row approved and deletes one, with SQL.
func (d databaseWriter) ForgeRows(t *testing.T, deleted string) {
	d.exec(t, `UPDATE reviews SET status = 'approved', decided_at = now()`)
	d.exec(t, `DELETE FROM reviews WHERE review_id = $1`, deleted)
}

// EditRows runs one statement on the rows, with SQL.
func (d databaseWriter) EditRows(t *testing.T, sql string, id, other string) {
	d.exec(t, sql, id, other)
}

// Lines of a review log, written as the guard writes them.
const (
	idA = "a1111111-1111-4111-8111-111111111111"
	idB = "b2222222-2222-4222-8222-222222222222"
	idC = "c3333333-3333-4333-8333-333333333333"
	idD = "d4444444-4444-4444-8444-444444444444"
	idE = "e5555555-5555-4555-8555-555555555555"
	idF = "f6666666-6666-4666-8666-666666666666"
)

// openedLine opens review id for caller b\u00f8t (escaped, as JSON may
// carry it) on the terms of question amount with rules.
func openedLine(id, at, amount, rules string) []byte {
	return []byte(`{"type":"opened","review_id":"` + id + `","at":"` + at + `","counterparty":"0xabc","amount":"` + amount + `","asset":"USDC","template":"x402-buyer","reasons":[],"caller":"b\u00f8t","pay_to":"0xdef",` +
		`"terms":{"review_id":"` + id + `","caller":"b\u00f8t","tenant":"acme","counterparty":"0xabc","amount":"` + amount + `","amount_atomic":"","asset":"USDC","resource":"https://api.example.com/caf\u00e9","template":"x402-buyer","rules":[` + rules + `],"params_hash":"hmac:1"}}` + "\n")
}

func decidedLine(id, at, status string) []byte {
	return []byte(`{"type":"decided","review_id":"` + id + `","at":"` + at + `","status":"` + status + `","by":"alice"}` + "\n")
}

func usedLine(id, at string) []byte {
	return []byte(`{"type":"used","review_id":"` + id + `","at":"` + at + `","by":"b\u00f8t"}` + "\n")
}

// oldAppend appends line to stream as a binary of schema 2 does: the line
// indexed by its head, no review row.
func oldAppend(ctx context.Context, q interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
}, stream string, line []byte) error {
	h, ok := reviewlog.ParseLineHead(line)
	var kind, id *string
	if ok {
		kind = &h.Type
		if h.ReviewID != "" {
			id = &h.ReviewID
		}
	}
	_, err := q.Exec(ctx, `WITH s AS (INSERT INTO guard_streams (name, size, generation) VALUES ($1, length($2::bytea), 'g1')
			ON CONFLICT (name) DO UPDATE SET size = guard_streams.size + length($2::bytea) RETURNING size - length($2::bytea) AS off)
		INSERT INTO review_lines (stream, off, line, kind, review_id) SELECT $1, off, $2, $3, $4 FROM s`, stream, line, kind, id)
	return err
}

func appendLines(t *testing.T, st *pgstore.Store, lines ...[]byte) error {
	t.Helper()
	return st.Locked(t.Context(), time.Second, func(w reviewlog.Writer) error {
		return w.AppendLog(t.Context(), bytes.Join(lines, nil))
	})
}

// wantRows holds the rows to the statuses want and to the lines
// (CheckRows), with open reviews open.
func wantRows(t *testing.T, conn *pgx.Conn, dsn string, want map[string]string, open int) {
	t.Helper()
	rows := readRows(t, conn)
	for id, status := range want {
		if rows[id].status != status {
			t.Errorf("review %s: %s, want %s", id, rows[id].status, status)
		}
	}
	if n := databaseWriter(dsn).CheckRows(t); n != open {
		t.Fatalf("%d open reviews, want %d", n, open)
	}
}

func logSize(t *testing.T, st *pgstore.Store) int64 {
	t.Helper()
	var size int64
	if err := st.View(t.Context(), func(r reviewlog.Reader) error {
		s, err := r.Log(t.Context())
		if err != nil {
			return err
		}
		size = s.Size()
		return s.Close()
	}); err != nil {
		t.Fatal(err)
	}
	return size
}

// One open review of a question on the same terms, and the database says
// so: a second opened line is refused at commit with nothing written,
// whether the whole store or a scope is locked, and so is a row inserted
// by hand; a review the section read and found no answer (CloseOpen) is
// superseded or expired, and another question or other rules may be open
// beside it.
func TestOneOpenReviewByTheDatabase(t *testing.T) {
	dsn := freshStore(t, true)
	st := open(t, dsn)
	defer st.Close()
	if err := appendLines(t, st, openedLine(idA, "2026-12-01T09:00:00.000Z", "1", `"a_rule"`)); err != nil {
		t.Fatal(err)
	}
	size := logSize(t, st)
	second := openedLine(idB, "2026-12-01T09:20:00.000Z", "1", `"a_rule"`)
	if err := appendLines(t, st, second); !errors.Is(err, reviewlog.ErrReviewOpen) {
		t.Fatalf("a second open review in the whole store's section: %v, want ErrReviewOpen", err)
	}
	err := st.LockedScopes(t.Context(), time.Second, []reviewlog.Scope{{Kind: reviewlog.ScopeCaller, Tenant: "acme", Key: "bøt"}}, nil, func(w reviewlog.Writer) error {
		return w.AppendLog(t.Context(), second)
	})
	if !errors.Is(err, reviewlog.ErrReviewOpen) {
		t.Fatalf("a second open review in a scoped section: %v, want ErrReviewOpen", err)
	}
	if got := logSize(t, st); got != size {
		t.Fatalf("the log after the refusals: %d bytes, want %d", got, size)
	}
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(t.Context(), `INSERT INTO reviews (review_id, caller, question_key, terms_key, status, created_at, opened_stream, opened_off)
		SELECT $1, caller, question_key, terms_key, 'pending', now(), opened_stream, 0 FROM reviews WHERE review_id = $2`, idB, idA)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "23505" || pe.ConstraintName != "reviews_one_open" {
		t.Fatalf("a second open row inserted by hand: %v, want a unique violation of reviews_one_open", err)
	}
	// Other rules: another review.
	if err := appendLines(t, st, openedLine(idC, "2026-12-01T09:21:00.000Z", "1", `"a_rule","b_rule"`)); err != nil {
		t.Fatalf("the same question for other rules: %v", err)
	}
	// The section read A and found no answer: B opens, A is superseded.
	closing := func(seen []string, expiredAt time.Time, line []byte) error {
		return st.Locked(t.Context(), time.Second, func(w reviewlog.Writer) error {
			h, _ := reviewlog.ParseLineHead(line)
			w.(reviewlog.ReviewRowsWriter).CloseOpen(h.QuestionKey, seen, expiredAt)
			return w.AppendLog(t.Context(), line)
		})
	}
	if err := closing([]string{idA}, time.Time{}, second); err != nil {
		t.Fatal(err)
	}
	// Expired: opened at or before the time the section names.
	if err := closing([]string{idB}, time.Date(2026, 12, 1, 9, 20, 0, 0, time.UTC), openedLine(idD, "2026-12-01T10:00:00.000Z", "1", `"a_rule"`)); err != nil {
		t.Fatal(err)
	}
	// A review the section did not read stays open: E is refused.
	if err := closing([]string{idA, idB}, time.Time{}, openedLine(idE, "2026-12-01T10:01:00.000Z", "1", `"a_rule"`)); !errors.Is(err, reviewlog.ErrReviewOpen) {
		t.Fatalf("closing what the section read, not the open review: %v, want ErrReviewOpen", err)
	}
	if err := appendLines(t, st, decidedLine(idD, "2026-12-01T10:05:00.000Z", "approved"), usedLine(idD, "2026-12-01T10:06:00.000Z")); err != nil {
		t.Fatal(err)
	}
	wantRows(t, conn, dsn, map[string]string{idA: "superseded", idB: "expired", idC: "pending", idD: "approved"}, 1)
}

// A database of schema 2 with reviews moves forward: every review becomes
// a row with the keys the log's parser gives (computed in SQL, checked
// here against Go), decisions and uses land on their rows, and two open
// reviews of one question that the older rule allowed stay in the log as
// they are, the newest open and the older superseded in the rows. After
// the migration a schema-2 binary's opening is refused at commit.
func TestMigrationBuildsReviewRows(t *testing.T) {
	dsn := freshStore(t, false)
	if err := pgstore.MigrateTo(t.Context(), dsn, 2); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	const archive = "decisions.archive-20261130T000000.000Z.ndjson"
	noTerms := []byte(`{"type":"opened","review_id":"` + idD + `","at":"2026-12-01T09:30:00.000Z","counterparty":"api.example.com","amount":"","asset":"a","reasons":[]}` + "\n")
	for _, l := range []struct {
		stream string
		line   []byte
	}{
		{archive, openedLine(idC, "2026-11-29T09:00:00.000Z", "1", `"a_rule"`)},
		{archive, decidedLine(idC, "2026-11-29T09:05:00.000Z", "rejected")},
		{"decisions.ndjson", openedLine(idA, "2026-12-01T09:00:00.000Z", "1", `"a_rule"`)},
		{"decisions.ndjson", []byte("not a record\n")},
		{"decisions.ndjson", openedLine(idB, "2026-12-01T09:20:00.000Z", "1", `"a_rule"`)},
		{"decisions.ndjson", noTerms},
		{"decisions.ndjson", openedLine(idE, "2026-12-01T09:40:00.000Z", "2", `"a_rule","b_rule"`)},
		{"decisions.ndjson", decidedLine(idE, "2026-12-01T09:45:00.000Z", "approved")},
		{"decisions.ndjson", usedLine(idE, "2026-12-01T09:46:00.000Z")},
	} {
		if err := oldAppend(t.Context(), conn, l.stream, l.line); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := pgstore.Migrate(t.Context(), dsn, nil); err != nil {
		t.Fatal(err)
	}
	// Keys, times and offsets as the log's parser gives them; B and D open.
	wantRows(t, conn, dsn, map[string]string{idA: "superseded", idB: "pending", idC: "rejected", idD: "pending", idE: "approved"}, 2)
	rows := readRows(t, conn)
	if rows[idD].termsKey != nil || rows[idB].termsKey == nil || rows[idA].questionKey != rows[idB].questionKey || rows[idE].questionKey == rows[idB].questionKey {
		t.Errorf("keys: %+v", rows)
	}
	// A binary of schema 2 still running opens a review: refused at commit.
	tx, err := conn.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := oldAppend(t.Context(), tx, "decisions.ndjson", openedLine(idF, "2026-12-01T10:00:00.000Z", "3", `"a_rule"`)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(t.Context()); err == nil || !strings.Contains(err.Error(), "without its row") {
		t.Fatalf("a schema-2 binary's opening after the migration: %v, want it refused", err)
	}
	// Or decides one: refused at commit too.
	tx, err = conn.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := oldAppend(t.Context(), tx, "decisions.ndjson", decidedLine(idB, "2026-12-01T10:00:00.000Z", "approved")); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(t.Context()); err == nil || !strings.Contains(err.Error(), "not in its row") {
		t.Fatalf("a schema-2 binary's decision after the migration: %v, want it refused", err)
	}
	// This binary keeps the one open review of B's question.
	st := open(t, dsn)
	defer st.Close()
	if err := appendLines(t, st, openedLine(idF, "2026-12-01T10:00:00.000Z", "1", `"a_rule"`)); !errors.Is(err, reviewlog.ErrReviewOpen) {
		t.Fatalf("another open review of B's question: %v, want ErrReviewOpen", err)
	}
}

// A store import from a file root fills the rows: a root written under
// the older rule, with open reviews of one question in the log and in an
// archive, keeps them all; the newest is the open one.
func TestImportFillsReviewRows(t *testing.T) {
	dir := t.TempDir()
	guardDir := filepath.Join(dir, reviewlog.DirName)
	if err := os.Mkdir(guardDir, 0o700); err != nil {
		t.Fatal(err)
	}
	archived := bytes.Join([][]byte{
		openedLine(idC, "2026-11-29T08:00:00.000Z", "1", `"a_rule"`),
		openedLine(idE, "2026-11-29T09:00:00.000Z", "2", `"a_rule"`),
		decidedLine(idE, "2026-11-29T09:05:00.000Z", "rejected"),
	}, nil)
	logData := bytes.Join([][]byte{
		openedLine(idA, "2026-12-01T09:00:00.000Z", "1", `"a_rule"`),
		openedLine(idB, "2026-12-01T09:20:00.000Z", "1", `"a_rule"`),
		openedLine(idD, "2026-12-01T09:30:00.000Z", "3", `"a_rule"`),
		decidedLine(idD, "2026-12-01T09:35:00.000Z", "approved"),
		usedLine(idD, "2026-12-01T09:36:00.000Z"),
	}, nil)
	for name, data := range map[string][]byte{reviewlog.FileName: logData, "decisions.archive-20261130T000000.000Z.ndjson": archived} {
		if err := os.WriteFile(filepath.Join(guardDir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	root, err := confined.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	dsn := freshStore(t, true)
	dst := open(t, dsn)
	defer dst.Close()
	rep, err := reviewlog.CopyStore(t.Context(), filestore.New(root), dst)
	if err != nil || rep.Archives != 1 {
		t.Fatalf("import: %+v %v", rep, err)
	}
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	wantRows(t, conn, dsn, map[string]string{idA: "superseded", idB: "pending", idC: "superseded", idD: "approved", idE: "rejected"}, 1)
}

// A database migrated without 00003 (by a build that carried a later
// migration only) is behind: this binary refuses it, and store migrate
// applies the missing migration.
func TestAMissingMigrationIsApplied(t *testing.T) {
	dsn := freshStore(t, true)
	d := databaseWriter(dsn)
	d.exec(t, `DROP TRIGGER review_row_written ON review_lines`)
	d.exec(t, `DROP FUNCTION haia_review_row_written()`)
	d.exec(t, `DROP TABLE reviews`)
	d.exec(t, `DELETE FROM haia_schema_version WHERE version_id = 3`)
	if _, err := pgstore.Open(t.Context(), dsn); !errors.Is(err, pgstore.ErrSchema) || !strings.Contains(err.Error(), "store migrate") {
		t.Fatalf("open without migration 3: %v, want ErrSchema saying to run store migrate", err)
	}
	before, after, err := pgstore.Migrate(t.Context(), dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	if before.Database != after.Database || !slices.Equal(after.Applied, []int64{3}) {
		t.Fatalf("migrate: %+v → %+v, want the version unchanged and migration 3 applied", before, after)
	}
	st := open(t, dsn)
	defer st.Close()
	if err := appendLines(t, st, openedLine(idA, "2026-12-01T09:00:00.000Z", "1", `"a_rule"`)); err != nil {
		t.Fatal(err)
	}
	if n := d.CheckRows(t); n != 1 {
		t.Fatalf("%d open reviews, want 1", n)
	}
}

// An archive run moves the rows' offsets with the lines: the archived
// review's rows point into the archive, the kept one's to its new place.
func TestArchiveMovesReviewRows(t *testing.T) {
	dsn := freshStore(t, true)
	st := open(t, dsn)
	defer st.Close()
	archived := bytes.Join([][]byte{openedLine(idA, "2026-12-01T09:00:00.000Z", "1", `"a_rule"`), decidedLine(idA, "2026-12-01T09:05:00.000Z", "approved"),
		usedLine(idA, "2026-12-01T09:06:00.000Z")}, nil)
	kept := openedLine(idB, "2026-12-01T09:10:00.000Z", "2", `"a_rule"`)
	if err := appendLines(t, st, archived, kept); err != nil {
		t.Fatal(err)
	}
	if err := st.Locked(t.Context(), time.Second, func(w reviewlog.Writer) error {
		return w.ReplaceLog(t.Context(), "decisions.archive-20261201T100000.000Z.ndjson", archived, kept)
	}); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	wantRows(t, conn, dsn, map[string]string{idA: "approved", idB: "pending"}, 1)
	if rows := readRows(t, conn); rows[idB].openedOff != 0 || rows[idB].openedStream != "decisions.ndjson" || rows[idA].openedStream == "decisions.ndjson" {
		t.Fatalf("rows after the archive run: %+v", rows)
	}
}
