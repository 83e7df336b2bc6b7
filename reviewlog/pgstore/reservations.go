package pgstore

import (
	"context"
	"fmt"
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
