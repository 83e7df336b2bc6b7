package pgstore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog/noa"
)

// Each receipt line of a chain segment is also a row of receipt_rows
// (schema 6), written by the statement that appends the line: what a
// decision looks receipts up by (their action, the question a service
// receipt deferred, whether they reserve a payment, the passkey that
// signed) and rcount, the number of receipts of the segment that reserve,
// up to and including this one. A row is an index, never a record:
// reviewlog reads the line it points to and checks the row against it.

// appendReceiptSQL appends one receipt line ($1 stream, $2 offset) and its
// row in one statement; rcount follows the row of the line before.
const appendReceiptSQL = `WITH r AS (INSERT INTO receipts (stream, off, seq, action_id, verdict, line) VALUES ($1, $2, $3, $4, $5, $6))
	INSERT INTO receipt_rows (stream, off, seq, receipt_id, action_id, agent_id, principal, verdict, rule_id, params_hash, canonical, ts, credential, reserves, rcount)
	SELECT $1, $2, $3, $7, $4, $8, $9, $5, $10, $11, $12, $13, $14, $15::text,
		COALESCE((SELECT rcount FROM receipt_rows WHERE stream = $1 AND off < $2 ORDER BY off DESC LIMIT 1), 0) + CASE WHEN $15::text IS NULL THEN 0 ELSE 1 END`

// receiptArgs are appendReceiptSQL's arguments for receipt rc, whose line
// is line at off of stream.
func receiptArgs(stream string, off int64, line []byte, rc *noa.Receipt) []any {
	var ts *time.Time
	if t, err := time.Parse(time.RFC3339Nano, rc.TS); err == nil {
		ts = &t
	}
	return []any{stream, off, rc.Chain.Seq, rc.Action.ID, rc.Governance.Verdict, line,
		rc.ID, rc.Agent.ID, rc.Agent.Principal, rc.Governance.RuleID, rc.Action.ParamsHash, rc.Action.Canonical, ts,
		nullable(reviewlog.PasskeyCredential(rc)), nullable(reviewlog.ReservesOf(rc))}
}

// indexedCols are the columns every lookup gives, x being receipt_rows
// and r receipts (LEFT JOINed: a row may point at no line).
const indexedCols = "x.stream, x.off, r.line, x.receipt_id, x.action_id, x.reserves, x.rcount"

// collectReceipts reads rows of indexedCols.
func collectReceipts(rows pgx.Rows) ([]reviewlog.IndexedReceipt, error) {
	defer rows.Close()
	var out []reviewlog.IndexedReceipt
	for rows.Next() {
		var ir reviewlog.IndexedReceipt
		var stream string
		var reserves *string
		if err := rows.Scan(&stream, &ir.Off, &ir.Line, &ir.ReceiptID, &ir.ActionID, &reserves, &ir.Count); err != nil {
			return nil, err
		}
		ir.Segment = strings.TrimPrefix(stream, receiptsPrefix)
		if reserves != nil {
			ir.Reserves = *reserves
		}
		out = append(out, ir)
	}
	return out, rows.Err()
}

func (r *reader) lookup(ctx context.Context, what, sql string, args ...any) ([]reviewlog.IndexedReceipt, error) {
	rows, err := r.q.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL at %s: %s: %w", r.s.describe, what, scrub(err))
	}
	out, err := collectReceipts(rows)
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL at %s: %s: %w", r.s.describe, what, scrub(err))
	}
	return out, nil
}

// actionKey groups a review action's receipt rows as the fold indexes
// them: every HUMAN receipt, and the first of each service agent, verdict
// and rule.
const actionKey = `LATERAL (SELECT x.principal = 'SERVICE' AS service,
			CASE WHEN x.principal = 'SERVICE' THEN x.agent_id END AS agent,
			CASE WHEN x.principal = 'SERVICE' THEN x.verdict END AS verdict,
			CASE WHEN x.principal = 'SERVICE' THEN coalesce(x.rule_id, '') END AS rule,
			CASE WHEN x.principal <> 'SERVICE' THEN x.stream END AS stream,
			CASE WHEN x.principal <> 'SERVICE' THEN x.off END AS off) AS k`

// actionReceiptsSQL: the receipts of one action ($1), grouped by actionKey.
const actionReceiptsSQL = `SELECT ` + indexedCols + ` FROM (
		SELECT DISTINCT ON (k.service, k.agent, k.verdict, k.rule, k.stream, k.off) x.*
		FROM receipt_rows x, ` + actionKey + `
		WHERE starts_with(x.action_id, 'review:') AND x.action_id = $1
		ORDER BY k.service, k.agent, k.verdict, k.rule, k.stream, k.off, x.ts, x.stream, x.off) AS x
	LEFT JOIN receipts r ON r.stream = x.stream AND r.off = x.off
	ORDER BY x.ts, x.stream, x.off`

// questionActionReceiptsSQL: what actionReceiptsSQL gives for each review
// action questionReceiptsSQL ($1 agent, $2 paramsHash) finds, in one
// statement: a decision prefetches them with its locks.
const questionActionReceiptsSQL = `SELECT ` + indexedCols + ` FROM (
		SELECT DISTINCT ON (x.action_id, k.service, k.agent, k.verdict, k.rule, k.stream, k.off) x.*
		FROM receipt_rows x, ` + actionKey + `
		WHERE starts_with(x.action_id, 'review:') AND x.action_id IN (
			SELECT q.action_id FROM receipt_rows q
			WHERE q.principal = 'SERVICE' AND q.verdict = 'DEFERRED' AND starts_with(q.action_id, 'review:') AND q.agent_id = $1 AND q.params_hash = $2)
		ORDER BY x.action_id, k.service, k.agent, k.verdict, k.rule, k.stream, k.off, x.ts, x.stream, x.off) AS x
	LEFT JOIN receipts r ON r.stream = x.stream AND r.off = x.off
	ORDER BY x.ts, x.stream, x.off`

func (r *reader) ActionReceipts(ctx context.Context, action string) ([]reviewlog.IndexedReceipt, error) {
	return r.lookup(ctx, "the receipts of "+action, actionReceiptsSQL, action)
}

// questionReceiptsSQL: the first service DEFERRED receipt of each review
// given to agent $1 for paramsHash $2.
const questionReceiptsSQL = `SELECT ` + indexedCols + ` FROM (
		SELECT DISTINCT ON (x.action_id) x.* FROM receipt_rows x
		WHERE x.principal = 'SERVICE' AND x.verdict = 'DEFERRED' AND starts_with(x.action_id, 'review:') AND x.agent_id = $1 AND x.params_hash = $2
		ORDER BY x.action_id, x.ts, x.stream, x.off) AS x
	LEFT JOIN receipts r ON r.stream = x.stream AND r.off = x.off
	ORDER BY x.ts, x.stream, x.off`

func (r *reader) QuestionReceipts(ctx context.Context, agent, paramsHash string) ([]reviewlog.IndexedReceipt, error) {
	return r.lookup(ctx, "the reviews of a question", questionReceiptsSQL, agent, paramsHash)
}

const credentialReceiptsSQL = `SELECT ` + indexedCols + ` FROM receipt_rows x
	LEFT JOIN receipts r ON r.stream = x.stream AND r.off = x.off
	WHERE x.credential = $1 ORDER BY x.ts, x.stream, x.off`

func (r *reader) CredentialReceipts(ctx context.Context, credential string) ([]reviewlog.IndexedReceipt, error) {
	return r.lookup(ctx, "the receipts of a passkey", credentialReceiptsSQL, credential)
}

// reservingSQL reads, in one statement (one moment), each segment's
// numbering of its reserving receipts — the count its last line's row
// carries and, for a segment the reader has not counted yet ($3 names,
// $4 counts), the newest reserving row before the window ($1) — and the
// reserving rows after the count known (or after that row, with every
// hold of the segment), and those named by $2; of each segment, only the
// lines before its size in streams (the segments as the section's moment
// holds them, so that no receipt another scope committed since is read
// without the log's lines of that moment).
func reservingSQL(streams string) string {
	return `WITH s AS (` + streams + `),
	k AS (SELECT * FROM unnest($3::text[], $4::bigint[]) AS k (name, count)),
	seg AS (
		SELECT s.name, s.size, t.off AS last_off, length(t.line) AS last_len, h.rcount AS head, b.off AS b_off,
			COALESCE(k.count, b.rcount, 0) AS low, k.count IS NULL AS fresh
		FROM s
		LEFT JOIN k ON k.name = s.name
		LEFT JOIN LATERAL (SELECT off, line FROM receipts WHERE stream = s.name AND off < s.size ORDER BY off DESC LIMIT 1) t ON true
		LEFT JOIN receipt_rows h ON h.stream = s.name AND h.off = t.off
		LEFT JOIN LATERAL (SELECT off, rcount FROM receipt_rows WHERE stream = s.name AND off < s.size AND reserves IS NOT NULL AND (ts IS NULL OR ts < $1)
			ORDER BY rcount DESC LIMIT 1) b ON k.count IS NULL
		WHERE starts_with(s.name, '` + receiptsPrefix + `')),
	pick AS (
		SELECT seg.name AS stream, seg.b_off AS off FROM seg WHERE seg.b_off IS NOT NULL
		UNION SELECT x.stream, x.off FROM seg JOIN receipt_rows x ON x.stream = seg.name AND x.reserves IS NOT NULL
			AND x.rcount > seg.low AND x.off < seg.size
		UNION SELECT x.stream, x.off FROM seg JOIN receipt_rows x ON x.stream = seg.name AND seg.fresh AND x.reserves = 'hold' AND x.off < seg.size
		UNION SELECT x.stream, x.off FROM seg JOIN receipt_rows x ON x.stream = seg.name AND x.reserves IS NOT NULL AND x.receipt_id = ANY($2) AND x.off < seg.size)
	SELECT ` + indexedCols + `, seg.name, seg.size, seg.last_off, seg.last_len, seg.head, seg.b_off
	FROM seg LEFT JOIN (pick JOIN receipt_rows x ON x.stream = pick.stream AND x.off = pick.off
		LEFT JOIN receipts r ON r.stream = x.stream AND r.off = x.off) ON x.stream = seg.name
	ORDER BY seg.name, x.rcount`
}

var (
	// reservingNowSQL reads the segments as they are (a View's
	// repeatable read, or a section that holds the whole store).
	reservingNowSQL = reservingSQL(`SELECT name, size FROM guard_streams`)
	// reservingAtSQL reads them as a scoped section's snapshot holds them
	// ($5 names, $6 sizes).
	reservingAtSQL = reservingSQL(`SELECT * FROM unnest($5::text[], $6::bigint[]) AS s (name, size)`)
)

func (r *reader) ReservingReceipts(ctx context.Context, from time.Time, ids []string, known map[string]int64) (reviewlog.ReservingReceipts, error) {
	var out reviewlog.ReservingReceipts
	fail := func(err error) (reviewlog.ReservingReceipts, error) {
		return reviewlog.ReservingReceipts{}, fmt.Errorf("PostgreSQL at %s: the receipts that reserve: %w", r.s.describe, scrub(err))
	}
	if ids == nil {
		ids = []string{}
	}
	names, counts := make([]string, 0, len(known)), make([]int64, 0, len(known))
	for seg, n := range known {
		names, counts = append(names, receiptsPrefix+seg), append(counts, n)
	}
	sql, args := reservingNowSQL, []any{from, ids, names, counts}
	if r.snap != nil {
		if err := r.take(ctx); err != nil {
			return reviewlog.ReservingReceipts{}, err
		}
		var names []string
		var sizes []int64
		for name, si := range r.snap.streams {
			if strings.HasPrefix(name, receiptsPrefix) {
				names, sizes = append(names, name), append(sizes, si.size)
			}
		}
		sql, args = reservingAtSQL, append(args, names, sizes)
	}
	rows, err := r.q.Query(ctx, sql, args...)
	if err != nil {
		return fail(err)
	}
	defer rows.Close()
	var cur *reviewlog.ReservingSegment
	var below *int64
	for rows.Next() {
		var stream, name *string
		var off, count, size, lastOff, lastLen, head, bOff *int64
		var line []byte
		var rid, aid, reserves *string
		if err := rows.Scan(&stream, &off, &line, &rid, &aid, &reserves, &count, &name, &size, &lastOff, &lastLen, &head, &bOff); err != nil {
			return fail(err)
		}
		seg := strings.TrimPrefix(*name, receiptsPrefix)
		if cur == nil || cur.Segment != seg {
			out.Segments = append(out.Segments, reviewlog.ReservingSegment{Segment: seg, Head: -1})
			cur = &out.Segments[len(out.Segments)-1]
			below = bOff
			// The count of the segment's last line's row, when that row
			// is there and the line ends the segment.
			if head != nil && lastOff != nil && lastLen != nil && *lastOff+*lastLen == *size {
				cur.Head = *head
			} else if size != nil && *size == 0 {
				cur.Head = 0
			}
		}
		if stream == nil {
			continue // a segment with no row picked
		}
		ir := reviewlog.IndexedReceipt{Segment: seg, Off: *off, Line: line, Count: *count}
		if rid != nil {
			ir.ReceiptID = *rid
		}
		if aid != nil {
			ir.ActionID = *aid
		}
		if reserves != nil {
			ir.Reserves = *reserves
		}
		if below != nil && *below == ir.Off {
			b := ir
			cur.Below = &b
		}
		out.Rows = append(out.Rows, ir)
	}
	if err := rows.Err(); err != nil {
		return fail(err)
	}
	return out, nil
}
