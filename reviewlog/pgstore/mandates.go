package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/haia-trace-mcp/haia-trace-mcp/reviewlog"
)

// Mandates reads the mandate_records rows in order.
func (r *reader) Mandates(ctx context.Context) ([][]byte, error) {
	rows, err := r.q.Query(ctx, "SELECT seq, line FROM mandate_records ORDER BY seq")
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL at %s: read the mandate records: %w", r.s.describe, scrub(err))
	}
	defer rows.Close()
	var out [][]byte
	next := int64(0)
	for rows.Next() {
		var seq int64
		var line []byte
		if err := rows.Scan(&seq, &line); err != nil {
			return nil, fmt.Errorf("PostgreSQL at %s: read the mandate records: %w", r.s.describe, scrub(err))
		}
		if seq > next {
			// Rows removed: in their place a line no reader takes for a
			// record, so that the gap is a finding wherever it is.
			out = append(out, []byte(fmt.Sprintf("(mandate records %d to %d are missing)", next, seq-1)))
		}
		out = append(out, line)
		next = seq + 1
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("PostgreSQL at %s: read the mandate records: %w", r.s.describe, scrub(err))
	}
	return out, nil
}

// AppendMandate inserts line as record n; a record n that exists already
// is another writer's (ErrMandateTaken).
func (w *writer) AppendMandate(ctx context.Context, n int, line []byte) error {
	_, err := w.q.Exec(ctx, "INSERT INTO mandate_records (seq, line) VALUES ($1, $2)", int64(n), line)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "23505" {
		return fmt.Errorf("%w (record %d)", reviewlog.ErrMandateTaken, n)
	}
	if err != nil {
		return fmt.Errorf("PostgreSQL at %s: append a mandate record: %w", w.s.describe, scrub(err))
	}
	return nil
}
