package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// The review rows (schema 3, table reviews) are written by the statements
// that append their lines, in the same batch and transaction: a line that
// opens a review inserts its row, a decision or a use updates it. Each
// row's offsets are computed in the database from the stream's size after
// the append (size - back, back being how far from the end the line
// starts), so that a scoped section, which learns where its lines land
// only when its first statement runs, writes them in the same round trip.

// A decision opens a review: the row is inserted pending, and
// reviews_one_open refuses a second open review of the same question and
// terms.
const openRowSQL = `INSERT INTO reviews (review_id, tenant, caller, question_key, terms_key, status, created_at, opened_stream, opened_off)
	SELECT $1, $2, $3, $4, $5, 'pending', $6, $7, size - $8 FROM guard_streams WHERE name = $7`

// A copy (store import, an archive run) moves lines recorded before: a
// review already in rows has its offsets moved; a new row is undecided
// and, when it has terms, 'superseded' until settleRowsSQL names the
// newest of its question the open one.
const copyRowSQL = `INSERT INTO reviews (review_id, tenant, caller, question_key, terms_key, status, created_at, opened_stream, opened_off)
	SELECT $1, $2, $3, $4, $5, CASE WHEN $5::text IS NULL THEN 'pending' ELSE 'superseded' END, $6, $7, size - $8 FROM guard_streams WHERE name = $7
	ON CONFLICT (review_id) DO UPDATE SET opened_stream = EXCLUDED.opened_stream, opened_off = EXCLUDED.opened_off`

// The first decision of a review decides its row (a second decided line
// is a finding of the fold, never applied); moving it again moves it.
const decideRowSQL = `UPDATE reviews SET status = $2, decided_at = $3, decided_stream = $4,
		decided_off = (SELECT size FROM guard_streams WHERE name = $4) - $5
	WHERE review_id = $1 AND (decided_off IS NULL OR (status = $2 AND decided_at = $3))`

const useRowSQL = `UPDATE reviews SET used_at = $2, used_stream = $3, used_off = (SELECT size FROM guard_streams WHERE name = $3) - $4
	WHERE review_id = $1 AND (used_off IS NULL OR used_at = $2)`

// closeRowsSQL: the open reviews of a question that the section read
// and found no answer are no longer open (it opens another): expired when
// opened at or before $3, superseded otherwise.
const closeRowsSQL = `UPDATE reviews SET status = CASE WHEN created_at <= $3 THEN 'expired' ELSE 'superseded' END
	WHERE question_key = $1 AND status = 'pending' AND review_id = ANY($2)`

// settleRowsSQL makes the newest undecided review of each question and
// terms the open one and the older superseded, in two statements so that
// reviews_one_open holds after each (00003_review_rows.sql does the same).
var settleRowsSQL = []string{
	`UPDATE reviews r SET status = 'superseded' FROM (
		SELECT review_id, row_number() OVER (PARTITION BY question_key, terms_key ORDER BY created_at DESC, opened_stream DESC, opened_off DESC) AS n
		FROM reviews WHERE status IN ('pending', 'superseded') AND terms_key IS NOT NULL) AS k
	WHERE r.review_id = k.review_id AND k.n > 1 AND r.status = 'pending'`,
	`UPDATE reviews r SET status = 'pending' FROM (
		SELECT review_id, row_number() OVER (PARTITION BY question_key, terms_key ORDER BY created_at DESC, opened_stream DESC, opened_off DESC) AS n
		FROM reviews WHERE status IN ('pending', 'superseded') AND terms_key IS NOT NULL) AS k
	WHERE r.review_id = k.review_id AND k.n = 1 AND r.status = 'superseded'`,
}

// closing is one CloseOpen of a section, sent before its lines.
type closing struct {
	questionKey string
	seen        []string
	expiredAt   *time.Time
}

// CloseOpen marks the question's open reviews named in seen no longer
// open, with the next append of this section.
func (w *writer) CloseOpen(questionKey string, seen []string, expiredAt time.Time) {
	c := closing{questionKey: questionKey, seen: seen}
	if !expiredAt.IsZero() {
		c.expiredAt = &expiredAt
	}
	w.closings = append(w.closings, c)
}

// queueClosings queues the section's closings (first in its append's
// batch) and forgets them.
func (w *writer) queueClosings(b *pgx.Batch) {
	for _, c := range w.closings {
		b.Queue(closeRowsSQL, c.questionKey, c.seen, c.expiredAt)
	}
	w.closings = nil
}

// queueRow queues what line h (back bytes from the end of stream, once
// appended) changes in the review rows. copying: the line was recorded
// before (an import or an archive run).
func queueRow(b *pgx.Batch, stream string, back int64, h reviewlog.LineHead, copying bool) {
	switch {
	case h.Opens():
		var terms *string
		if h.TermsKey != "" {
			terms = &h.TermsKey
		}
		q := openRowSQL
		if copying {
			q = copyRowSQL
		}
		b.Queue(q, h.ReviewID, h.Tenant, h.Caller, h.QuestionKey, terms, h.At, stream, back)
	case h.Decides():
		b.Queue(decideRowSQL, h.ReviewID, h.Status, h.At, stream, back)
	case h.Uses():
		b.Queue(useRowSQL, h.ReviewID, h.At, stream, back)
	}
}

// settleRows names the open review of each question after a copy.
func (w *writer) settleRows(ctx context.Context) error {
	b := &pgx.Batch{}
	for _, q := range settleRowsSQL {
		b.Queue(q)
	}
	if err := w.send(ctx, b); err != nil {
		return fmt.Errorf("PostgreSQL at %s: settle the review rows: %w", w.s.describe, err)
	}
	return nil
}

// openRefused turns the database's refusal of a second open review of
// one question into what it means.
func openRefused(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "23505" && pe.ConstraintName == "reviews_one_open" {
		return fmt.Errorf("%w: the database refuses a second open review of one question on the same terms (reviews_one_open); nothing was written", reviewlog.ErrReviewOpen)
	}
	return nil
}

// reviewsQuery is the statement that reads the rows q names
// (reviewlog.ReviewQuery), each by its index — the question's
// (reviews_question), the caller's undecided (reviews_caller_undecided),
// the ids' (the primary key) — with every line of each review: those at
// the row's places and every other the log files under its id
// (review_lines_review), one result row a line; and its arguments.
//
// The statement holds a branch only for each part q has. A connection
// prepares each shape once, and PostgreSQL plans a prepared statement
// anew at every run for as long as the plan made without the values
// (generic) costs more than those made with them: a branch a value rules
// out (an empty caller, no ids; an array of ids, which a generic plan
// counts as ten) kept the one statement of every shape on a plan of its
// own at every decision, 0.4–0.7 ms of the database's CPU each (measured
// with EXPLAIN ANALYZE's planning time). Without them the generic plan is
// the custom one and is kept from the sixth run on; every predicate is an
// equality on an index, so it reads the same rows by the same indexes
// whatever the values and however the tables grow.
//
// The branches are one scan of reviews (a bitmap of each branch's index,
// OR'd) and the lines one scan of review_lines, not a UNION of scans: the
// plan of every decision is then 11 nodes, not 18, and PostgreSQL starts
// and ends each node of it at every run, whether a row reaches it or not
// (measured with EXPLAIN ANALYZE: 0.13 ms against 0.24 ms of execution
// for a question with no review). Each review and each line still comes
// once, as the UNIONs gave them.
func reviewsQuery(q reviewlog.ReviewQuery) (string, []any) {
	var b strings.Builder
	var args []any
	branch := func(format string, vals ...any) {
		if len(args) > 0 {
			b.WriteString("\n\t\tOR ")
		}
		n := make([]any, len(vals))
		for i := range vals {
			n[i] = len(args) + 1 + i
		}
		args = append(args, vals...)
		fmt.Fprintf(&b, format, n...)
	}
	b.WriteString("WITH r AS (\n\t\tSELECT * FROM reviews WHERE ")
	if q.QuestionKey != "" {
		branch("question_key = $%d", q.QuestionKey)
	}
	if q.Caller != "" {
		branch("(caller = $%d AND decided_at IS NULL AND status IN ('pending', 'superseded') AND created_at > $%d)", q.Caller, q.Since)
	}
	if len(q.IDs) > 0 {
		branch("review_id = ANY($%d)", q.IDs)
	}
	if len(args) == 0 {
		b.WriteString("false")
	}
	b.WriteString(`)
	SELECT r.review_id, r.tenant, r.caller, r.question_key, COALESCE(r.terms_key, ''), r.status,
		r.opened_stream, r.opened_off, COALESCE(r.decided_stream, ''), COALESCE(r.decided_off, -1), COALESCE(r.used_stream, ''), COALESCE(r.used_off, -1),
		l.stream, l.off, l.line
	FROM r LEFT JOIN LATERAL (
		SELECT stream, off, line FROM review_lines WHERE review_id = r.review_id
			OR (stream, off) IN ((r.opened_stream, r.opened_off), (r.decided_stream, r.decided_off), (r.used_stream, r.used_off))) AS l ON true
	ORDER BY r.review_id, l.stream, l.off`)
	return b.String(), args
}

// collectReviews reads the rows of reviewsQuery's statement, one review a row of
// reviews with its lines.
func collectReviews(rows pgx.Rows) ([]reviewlog.IndexedReview, error) {
	defer rows.Close()
	var out []reviewlog.IndexedReview
	for rows.Next() {
		var r reviewlog.ReviewRow
		var stream *string
		var off *int64
		var line []byte
		if err := rows.Scan(&r.ID, &r.Tenant, &r.Caller, &r.QuestionKey, &r.TermsKey, &r.Status, &r.Opened.Stream, &r.Opened.Off,
			&r.Decided.Stream, &r.Decided.Off, &r.Used.Stream, &r.Used.Off, &stream, &off, &line); err != nil {
			return nil, err
		}
		for _, p := range []*reviewlog.LinePlace{&r.Decided, &r.Used} {
			if p.Stream == "" {
				*p = reviewlog.LinePlace{}
			}
		}
		if n := len(out); n == 0 || out[n-1].Row.ID != r.ID {
			out = append(out, reviewlog.IndexedReview{Row: r})
		}
		if stream != nil && off != nil {
			x := &out[len(out)-1]
			x.Lines = append(x.Lines, reviewlog.IndexedLine{LinePlace: reviewlog.LinePlace{Stream: *stream, Off: *off}, Line: line})
		}
	}
	return out, rows.Err()
}

// IndexedReviews reads the rows q names with their lines, in one
// statement.
func (w *writer) IndexedReviews(ctx context.Context, q reviewlog.ReviewQuery) ([]reviewlog.IndexedReview, error) {
	sql, args := reviewsQuery(q)
	rows, err := w.q.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL at %s: reviews: %w", w.s.describe, scrub(err))
	}
	out, err := collectReviews(rows)
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL at %s: reviews: %w", w.s.describe, scrub(err))
	}
	return out, nil
}
