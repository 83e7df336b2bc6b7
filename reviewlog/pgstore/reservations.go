package pgstore

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// A reserved line of the review log is also a row of reservations, and a
// released line marks its reservation's row, in the same transaction as
// the line (schema 4). The row is an index for a decision to find the
// reservations of its scopes; what counts is the line it points to.

// reservationCols are the columns of a reservation row a line gives.
const reservationCols = "receipt_id, tenant, caller, pay_to, host, resource, atomic, asset, at, until, open, off"

// insertReservationSQL inserts the row of the reserved line at $12.
const insertReservationSQL = "INSERT INTO reservations (" + reservationCols + ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"

// insertReservationAtEndSQL inserts the row of a reserved line appended at
// the log's end in this transaction: its offset is the log's size now
// less $12 (the append's length) plus $13 (the line's place in it).
const insertReservationAtEndSQL = "INSERT INTO reservations (" + reservationCols + ") SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, size - $12 + $13 FROM guard_streams WHERE name = '" + logStream + "'"

// releaseSQL records the first release of a reservation whose line comes
// before it; a later one (a copy, or a forgery the seal check refuses
// anyway) leaves the row as it is.
const releaseSQL = "UPDATE reservations SET release_off = $2 WHERE receipt_id = $1 AND release_off IS NULL AND off < $2"

// releaseAtEndSQL is releaseSQL for a released line appended at the log's
// end in this transaction ($2: the append's length, $3: the line's place).
const releaseAtEndSQL = `UPDATE reservations SET release_off = g.size - $2 + $3 FROM guard_streams AS g
	WHERE g.name = '` + logStream + `' AND receipt_id = $1 AND release_off IS NULL AND off < g.size - $2 + $3`

// reservationArgs are the values of a reservation row, but its offset.
func reservationArgs(r *reviewlog.Reservation) ([]any, bool) {
	at, err := time.Parse(time.RFC3339Nano, r.At)
	if err != nil {
		return nil, false
	}
	var until *time.Time
	if r.Until != "" {
		u, err := time.Parse(time.RFC3339Nano, r.Until)
		if err != nil {
			return nil, false
		}
		until = &u
	}
	return []any{r.ReceiptID, r.Tenant, r.Caller, nullable(r.PayTo), nullable(r.Host), nullable(r.Resource), r.Atomic, r.Asset, at, until, r.Open}, true
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// queueReservation queues the row of a reserved or released line of the
// review log at off (relative: off is the line's place in an append of n
// bytes at the log's end). A copy (an archive run, an import) moves rows
// of lines recorded before, and keeps the first of a receipt.
func queueReservation(b *pgx.Batch, li indexed, off int64, relative bool, n int64, moving bool) {
	switch {
	case li.reservation != nil:
		args, ok := reservationArgs(li.reservation)
		if !ok {
			return // the log reads its times strictly: never so
		}
		sql := insertReservationSQL
		if relative {
			sql = insertReservationAtEndSQL
			args = append(args, n)
		}
		if moving {
			sql += " ON CONFLICT (receipt_id) DO NOTHING"
		}
		b.Queue(sql, append(args, off)...)
	case li.release != nil:
		if relative {
			b.Queue(releaseAtEndSQL, li.release.ReceiptID, n, off)
			return
		}
		b.Queue(releaseSQL, li.release.ReceiptID, off)
	}
}

// reindexSQL gives a row to every reserved line of the review log that has
// none — every line the log held when schema 4 was applied, and any a
// replica of the previous release, still answering after the migration,
// wrote alone — the first line of each receipt, and marks the first
// release that follows each. Lines are read only where the log's strict
// reading set their kind.
const reindexSQL = `INSERT INTO reservations (` + reservationCols + `)
SELECT DISTINCT ON (j.r ->> 'receipt_id')
       j.r ->> 'receipt_id', COALESCE(j.r ->> 'tenant', ''), j.r ->> 'caller',
       NULLIF(j.r ->> 'pay_to', ''), NULLIF(j.r ->> 'host', ''), NULLIF(j.r ->> 'resource', ''),
       j.r ->> 'atomic', j.r ->> 'asset', (j.at)::timestamptz, (NULLIF(j.r ->> 'until', ''))::timestamptz,
       COALESCE((j.r ->> 'open')::boolean, false), j.off
FROM (SELECT l.off, convert_from(l.line, 'UTF8')::jsonb -> 'reservation' AS r,
             convert_from(l.line, 'UTF8')::jsonb ->> 'at' AS at
      FROM review_lines AS l
      WHERE l.stream = '` + logStream + `' AND l.kind = 'reserved'
        AND NOT EXISTS (SELECT 1 FROM reservations AS x WHERE x.off = l.off)) AS j
ORDER BY j.r ->> 'receipt_id', j.off
ON CONFLICT (receipt_id) DO NOTHING;
UPDATE reservations AS r SET release_off = x.off
FROM (SELECT DISTINCT ON (y.rid) y.rid, y.off
      FROM (SELECT convert_from(l.line, 'UTF8')::jsonb #>> '{release,receipt_id}' AS rid, l.off
            FROM review_lines AS l WHERE l.stream = '` + logStream + `' AND l.kind = 'released') AS y
      ORDER BY y.rid, y.off) AS x
WHERE r.release_off IS NULL AND r.receipt_id = x.rid AND x.off > r.off`

// reindexReservations runs reindexSQL under the guard's lock, so that no
// decision appends meanwhile; `store migrate` runs it every time.
func reindexReservations(ctx context.Context, pool *pgxpool.Pool) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("index the reservations: %w", scrub(err))
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, fmt.Sprintf("SELECT pg_advisory_xact_lock(%d)", int64(lockKey))); err != nil {
		return fmt.Errorf("index the reservations: take the guard lock: %w", scrub(err))
	}
	if _, err := tx.Exec(ctx, reindexSQL); err != nil {
		return fmt.Errorf("index the reservations: %w", scrub(err))
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("index the reservations: commit: %w", scrub(err))
	}
	return nil
}

// IndexedReservations reads the rows q names, by the indexes of their
// scopes, each with the lines it points to, in one statement.
func (w *writer) IndexedReservations(ctx context.Context, q reviewlog.ReservationQuery) ([]reviewlog.IndexedReservation, error) {
	sql, args := indexedQuery(q)
	rows, err := w.q.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL at %s: reservations: %w", w.s.describe, scrub(err))
	}
	out, err := collectIndexed(rows)
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL at %s: reservations: %w", w.s.describe, scrub(err))
	}
	return out, nil
}

// collectIndexed reads the rows of indexedQuery.
func collectIndexed(rows pgx.Rows) ([]reviewlog.IndexedReservation, error) {
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (reviewlog.IndexedReservation, error) {
		var x reviewlog.IndexedReservation
		var payTo, host, resource *string
		var at time.Time
		var until *time.Time
		err := row.Scan(&x.Row.ReceiptID, &x.Row.Tenant, &x.Row.Caller, &payTo, &host, &resource, &x.Row.Atomic, &x.Row.Asset,
			&at, &until, &x.Row.Open, &x.Off, &x.ReleaseOff, &x.Line, &x.ReleaseLine)
		x.Row.PayTo, x.Row.Host, x.Row.Resource = deref(payTo), deref(host), deref(resource)
		x.Row.At = at.UTC().Format(time.RFC3339Nano)
		if until != nil {
			x.Row.Until = until.UTC().Format(time.RFC3339Nano)
		}
		return x, err
	})
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// indexedQuery is the statement of q: one arm a scope, each served by its
// index (the statement's text differs by which arms q needs, so that each
// shape's plan uses its indexes).
func indexedQuery(q reviewlog.ReservationQuery) (string, []any) {
	before := q.Before
	if before <= 0 {
		// Read with the locks, before the log's moment is known: the
		// log filters by it.
		before = math.MaxInt64
	}
	args := []any{[]string{q.Tenant, ""}, q.Since, before}
	where := ""
	if !q.All {
		var arms []string
		if len(q.Keys) > 0 {
			args = append(args, q.Keys)
			n := len(args)
			arms = append(arms, fmt.Sprintf("lower(r.pay_to) = ANY($%d)", n), fmt.Sprintf("lower(r.host) = ANY($%d)", n))
		}
		if q.Resource != "" {
			args = append(args, q.Resource)
			arms = append(arms, fmt.Sprintf("lower(r.resource) = $%d", len(args)))
		}
		if q.NoPayTo {
			arms = append(arms, "r.pay_to IS NULL")
		}
		if q.NoHost {
			arms = append(arms, "r.host IS NULL")
		}
		if q.Open {
			arms = append(arms, "r.open")
		}
		if len(arms) == 0 {
			arms = append(arms, "false")
		}
		where = " AND (" + strings.Join(arms, " OR ") + ")"
	}
	return `SELECT r.receipt_id, r.tenant, r.caller, r.pay_to, r.host, r.resource, r.atomic, r.asset, r.at, r.until, r.open, r.off,
		COALESCE(r.release_off, -1), l.line, rl.line
		FROM reservations AS r
		LEFT JOIN review_lines AS l ON l.stream = '` + logStream + `' AND l.off = r.off
		LEFT JOIN review_lines AS rl ON rl.stream = '` + logStream + `' AND rl.off = r.release_off
		WHERE r.tenant = ANY($1) AND (r.until IS NULL OR r.until > $2) AND r.off < $3` + where + `
		ORDER BY r.off`, args
}

// reservationLinesSQL reads the review log's lines from an offset on, by
// the log's primary key; the log picks the reserved and released ones by
// what each line says (a line's kind column is not trusted to).
const reservationLinesSQL = `SELECT off, line FROM review_lines WHERE stream = '` + logStream + `' AND off >= $1 ORDER BY off`

// collectLines reads the rows of reservationLinesSQL.
func collectLines(rows pgx.Rows) ([]reviewlog.IndexedLine, error) {
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (reviewlog.IndexedLine, error) {
		x := reviewlog.IndexedLine{LinePlace: reviewlog.LinePlace{Stream: logStream}}
		err := row.Scan(&x.Off, &x.Line)
		return x, err
	})
}

// ReservationLines reads the log's lines from offset from on, in one
// statement.
func (r *reader) ReservationLines(ctx context.Context, from int64) ([]reviewlog.IndexedLine, error) {
	rows, err := r.q.Query(ctx, reservationLinesSQL, from)
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL at %s: reservation lines: %w", r.s.describe, scrub(err))
	}
	out, err := collectLines(rows)
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL at %s: reservation lines: %w", r.s.describe, scrub(err))
	}
	return out, nil
}
